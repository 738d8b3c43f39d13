"""The sweeper without beat: every worker takes its turn, one at a time, and recovery goes on
with no beat process at all and when the sweeping worker is killed mid-sweep.

The session's worker (whose embedded beat used to be the only sweeper) is stopped while this
module runs; its workers run without ``-B``. They log each sweep's start and end
(``QUEUETY_TEST_SWEEP_LOG=1``: the ``queuety.sweeps`` DEBUG lines), which is how the tests see
that sweeps never overlap. Bounds are the test settings' (tests/settings.py): a sweep due every
``SWEEP_INTERVAL`` (1 s), a worker lost after ``WORKER_LOST_AFTER`` (1.5 s), a lease held
``SWEEP_LEASE`` (3 s) without renewal.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

import queuety
from queuety import publish
from queuety.conf import settings
from queuety.models import Event, StepRun, SweepLease, Worker, WorkflowRun
from queuety.store import sweeps
from tests import workflows
from tests.integration.conftest import start_together, stop_together, wait_for
from tests.reliability.chaos import PoolWorker, first_event
from tests.reliability.test_pgbouncer import PgBouncer

SWEEP = settings.SWEEP_INTERVAL
LEASE = settings.SWEEP_LEASE
LOST_AFTER = settings.WORKER_LOST_AFTER
#: Seconds a busy two-core machine may add to any bound below.
SLACK = 2.0

SWEEP_LINE = re.compile(r"sweep (\d+) (started|ended) by (\S+) at ([\d.]+)")


class SweepingWorker(PoolWorker):
    """A worker without beat, on the session's broker and a queue of its own, that logs its
    sweeps."""

    node_prefix = "sweeps"

    def __init__(self, log_dir, queue, name):
        super().__init__(log_dir, os.environ["CELERY_BROKER_URL"], queue, beat=False,
                         concurrency=2, name=name)
        self.env["QUEUETY_TEST_SWEEP_LOG"] = "1"

    def sweeps(self) -> dict[int, dict]:
        """This worker's sweeps by token: ``{"started": t, "ended": t or None, "by": name}``."""
        found: dict[int, dict] = {}
        for match in SWEEP_LINE.finditer(self.log()):
            token, what, holder, moment = match.groups()
            entry = found.setdefault(int(token), {"started": None, "ended": None, "by": holder})
            entry[what] = float(moment)
        return found


@pytest.fixture
def pool(quiet_session_worker, tmp_path):
    """``make(n)`` starts ``n`` workers without beat on one queue; all stop at the end."""
    # Registry rows of workers killed earlier in the session would be swept as lost here.
    Worker.objects.all().delete()
    queue = f"sweeps-{uuid.uuid4().hex[:8]}"
    started: list[SweepingWorker] = []

    def make(count: int) -> list[SweepingWorker]:
        handles = [SweepingWorker(tmp_path, queue, f"s{len(started) + i}") for i in range(count)]
        start_together(*handles)
        started.extend(handles)
        return handles

    yield queue, make
    stop_together(started)


def all_sweeps(workers) -> list[dict]:
    found = [entry for handle in workers for entry in handle.sweeps().values()]
    return sorted(found, key=lambda entry: entry["started"])


def overlaps(found: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of sweeps that ran at once (among those that ended)."""
    ended = [entry for entry in found if entry["ended"] is not None]
    return [(a, b) for a, b in zip(ended, ended[1:], strict=False) if b["started"] < a["ended"]]


def owner(workers, pid: int) -> SweepingWorker:
    return next(handle for handle in workers if pid in handle.children())


# -- (1) no beat process at all ---------------------------------------------------------------

def test_without_beat__a_killed_worker_s_step_runs_again_within_the_bound(pool, token, figures):
    queue, make = pool
    workers = make(2)
    run_id = (queuety.workflow("nobeat_lost").on_queue(queue).then(workflows.hang_first_time)
              .then(workflows.step_c).dispatch({"token": token}))
    deadline = time.monotonic() + 30
    while not workflows.marks(f"{token}-hang"):
        assert time.monotonic() < deadline, "the hanging step never started"
        time.sleep(0.05)
    victim = owner(workers, int(workflows.marks(f"{token}-hang")[0].split()[0]))

    killed = time.time()
    victim.crash()  # its main process too: nobody is left to record the attempt but a sweep
    lost = first_event(run_id, "step_retried")
    status = wait_for(run_id, timeout=60)

    recorded_after = lost.created_at.timestamp() - killed
    figures.record("No beat: worker SIGKILLed mid-step, recovered by another worker's sweep",
                   recorded_after_s=round(recorded_after, 2))
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost", lost.data
    assert status.status == "completed" and status.state["hung_once"] is True
    # Lost after WORKER_LOST_AFTER, taken back by the next sweep; if the victim held the
    # lease, its sweep is taken over once the lease expires.
    assert recorded_after <= max(LOST_AFTER, LEASE) + 2 * SWEEP + SLACK, recorded_after


def test_without_beat__a_lost_message_a_delay_and_an_expired_wait_are_swept(pool, token,
                                                                            figures):
    queue, make = pool
    make(2)
    with publish.redirected(lambda messages: None):  # the broker lost the first message
        lost = (queuety.workflow("nobeat_message").on_queue(queue).then(workflows.step_a)
                .dispatch({"token": f"{token}-m"}))
    # Longer than MAX_ETA: the delay's wake-up is in the database, and only a sweep sends it.
    delayed = (queuety.workflow("nobeat_delay").on_queue(queue).then(workflows.step_a)
               .delay(seconds=settings.MAX_ETA + 1).then(workflows.step_c)
               .dispatch({"token": f"{token}-d"}))
    deadline = time.monotonic() + 30
    while not (held := StepRun.objects.filter(run_id=delayed, step_index=1).first()):
        assert time.monotonic() < deadline, "the delay's row was never written"
        time.sleep(0.05)
    due = held.available_at
    assert held.published_at is None  # no message: only a sweep sends it, once it is due
    waiting = (queuety.workflow("nobeat_wait").on_queue(queue)
               .wait_for_approval(timeout=timedelta(seconds=1)).then(workflows.step_a)
               .dispatch({"token": f"{token}-w"}))

    assert wait_for(lost, timeout=30).status == "completed"
    assert wait_for(delayed, timeout=30).status == "completed"
    failed = wait_for(waiting, ("failed",), timeout=30)

    sent = StepRun.objects.filter(run_id=lost).get()
    republished_after = (sent.claimed_at - sent.created_at).total_seconds()
    delay_late = (StepRun.objects.get(pk=held.pk).claimed_at - due).total_seconds()
    expires = WorkflowRun.objects.get(pk=waiting).wait_expires_at
    timed_out = first_event(waiting, "wait_timed_out")
    wait_late = (timed_out.created_at - expires).total_seconds()
    figures.record("No beat: a lost message, a delay, an expired wait",
                   message_run_after_s=round(republished_after, 2),
                   delay_late_s=round(delay_late, 2), wait_settled_late_s=round(wait_late, 2))
    assert failed.error["type"] == "queuety.exceptions.WaitExpired"
    assert republished_after <= settings.REDELIVER_AFTER + SWEEP + SLACK, republished_after
    assert delay_late <= SWEEP + SLACK, delay_late
    assert wait_late <= SWEEP + SLACK, wait_late


# -- (2) three workers take turns --------------------------------------------------------------

def test_three_workers__sweep_one_at_a_time_about_once_an_interval(pool, figures):
    _, make = pool
    workers = make(3)
    window = 12.0
    time.sleep(window)
    found = all_sweeps(workers)
    inside = [entry for entry in found if entry["started"] >= found[-1]["started"] - window]

    holders = {entry["by"] for entry in inside}
    figures.record("Three workers, no beat: sweeps in 12 s",
                   sweeps=len(inside), holders=len(holders),
                   longest_s=round(max((e["ended"] - e["started"] for e in inside
                                        if e["ended"] is not None), default=0.0), 3))
    assert overlaps(found) == []
    # At most one per interval (the lease's rule, by the database's clock); not three.
    assert len(inside) <= window / SWEEP + 1, inside
    assert len(inside) >= window / (2 * SWEEP), inside


def test_three_workers_behind_pgbouncer__still_sweep_one_at_a_time(pool, tmp_path, figures):
    """Transaction pooling: consecutive transactions of one worker land on different server
    sessions, so a session-level lock would be held by whichever client got that session next.
    The claim takes only a transaction-level one."""
    queue, _ = pool
    bouncer = PgBouncer(tmp_path)
    bouncer.start()
    handles = [SweepingWorker(tmp_path, queue, f"b{i}") for i in range(3)]
    for handle in handles:
        handle.env["DATABASE_URL"] = bouncer.url(connection.settings_dict["NAME"])
        handle.env["QUEUETY_PREPARED_STATEMENTS"] = "0"
    window = 10.0
    try:
        start_together(*handles)
        time.sleep(window)
        found = all_sweeps(handles)
    finally:
        stop_together(handles)
        bouncer.stop()
    inside = [entry for entry in found if entry["started"] >= found[-1]["started"] - window]
    figures.record("Three workers behind PgBouncer (transaction mode), no beat: sweeps in 10 s",
                   sweeps=len(inside), holders=len({entry["by"] for entry in inside}))
    assert overlaps(found) == []
    assert window / (2 * SWEEP) <= len(inside) <= window / SWEEP + 1, inside
    assert not any("could not take its turn at sweeping" in handle.log() for handle in handles)


@contextmanager
def run_row_held(run_id: int):
    """Hold a KEY SHARE lock on run ``run_id`` from a connection of this test's own: a sweep's
    ``fail_overdue``, which locks the run FOR UPDATE, waits on it mid-sweep."""
    with psycopg.connect(os.environ["DATABASE_URL"], dbname=connection.settings_dict["NAME"]
                         ) as blocker:
        blocker.execute("SELECT 1 FROM queuety_workflowrun WHERE id = %s FOR KEY SHARE",
                        [run_id])
        try:
            yield
        finally:
            blocker.rollback()


def lease() -> SweepLease:
    return SweepLease.objects.get(name=sweeps.NAME)


def test_three_workers__one_killed_mid_sweep_is_taken_over_within_the_lease(pool, token,
                                                                            figures):
    _, make = pool
    workers = make(3)
    run_id = (queuety.workflow("sweep_blocker").wait_for_approval().then(workflows.step_a)
              .dispatch({"token": token}))
    with run_row_held(run_id):
        # Overdue now: the next sweep's fail_overdue phase waits for the row lock held above.
        WorkflowRun.objects.filter(pk=run_id).update(
            deadline_at=timezone.now() - timedelta(seconds=1))
        deadline = time.monotonic() + 30
        while True:
            held = lease()
            stuck = held.finished_at is None and held.started_at is not None and (
                timezone.now() - held.started_at).total_seconds() > 0.3
            if stuck:
                break
            assert time.monotonic() < deadline, "no sweep waited on the held run"
            time.sleep(0.02)
        # The worker holding the lease, by the main process's pid its registry name carries
        # (host:pid@start): at once, while the sweep waits on the row (at most
        # sweeper.LOCK_WAIT, after which it leaves the run to the next sweep).
        holder_pid = int(held.holder.split("@")[0].rpartition(":")[2])
        victim = next(handle for handle in workers if handle.proc.pid == holder_pid)
        killed = time.time()
        victim.crash()
        while (taken := lease()).token == held.token:
            assert time.monotonic() < deadline + 30, "nobody took the lease over"
            time.sleep(0.02)
    took_over_after = taken.started_at.timestamp() - killed
    status = wait_for(run_id, ("failed",), timeout=30)

    survivors = [handle for handle in workers if handle is not victim]
    figures.record("Three workers, no beat: the sweeping worker SIGKILLed mid-sweep",
                   taken_over_after_s=round(took_over_after, 2), lease_s=LEASE)
    assert taken.holder != held.holder
    assert f"The sweep of {held.holder} did not end and its lease expired" in "".join(
        handle.log() for handle in survivors)
    assert took_over_after <= LEASE + SWEEP + SLACK, took_over_after
    assert status.error["type"] == "queuety.exceptions.DeadlineExceeded"
    assert Event.objects.filter(run_id=run_id, kind="workflow_deadline_exceeded").count() == 1
    assert overlaps(all_sweeps(survivors)) == []
