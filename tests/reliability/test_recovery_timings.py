"""Recovery on the shipped timings: a lost worker is recorded at once, retried, never taken for
a timeout, and what it held runs again within a bound, not a minute later.

The rest of the suite shortens the sweeper's and the heartbeat's periods; these tests run their
workers on the shipped defaults (``QUEUETY_TEST_TIMINGS=shipped``: a sweep every 5 s, a
heartbeat every 10 s, a worker lost after 25 s, a stale step after 60 s, messages re-published
after 60 s) and hold recovery to what those defaults promise:

- a pool process killed mid-step: recorded by the worker's main process at once;
- a whole worker killed during a timed step: recorded as a lost worker (retried), not as a
  timeout, by the sweeper soon after the step's hard limit;
- a whole worker killed while it holds a retry's back-off or a delay: the step runs about
  ``WORKER_LOST_AFTER`` plus a sweep late, not ``REDELIVER_AFTER`` (60 s) late;
- a whole worker killed while its pool processes (forked after its last beat) run 4 steps:
  each is recorded by the worker registry within ``WORKER_LOST_AFTER`` plus a sweep;
- a pool process killed while PostgreSQL is away: recorded by the worker's main process
  within seconds of the database answering again.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid

import pytest
from django.test import override_settings

import queuety
from queuety.conf import DEFAULTS
from queuety.models import StepRun, Worker
from queuety.sweeper_beat import ensure_sweeper_schedule
from tests import workflows
from tests.integration.conftest import start_together, stop_together, wait_for
from tests.reliability.chaos import PoolWorker, first_event, postgres_down

SWEEP = DEFAULTS["SWEEP_INTERVAL"]
LOST_AFTER = DEFAULTS["WORKER_LOST_AFTER"]
GRACE = DEFAULTS["HARD_TIMEOUT_GRACE"]


class ShippedWorker(PoolWorker):
    """A worker on the shipped timings, on the session's broker and a queue of its own."""

    node_prefix = "shipped"

    def __init__(self, log_dir, queue, *, beat, name, concurrency=2, options=()):
        super().__init__(log_dir, os.environ["CELERY_BROKER_URL"], queue, beat=beat,
                         concurrency=concurrency, name=name, options=options)
        self.env["QUEUETY_TEST_TIMINGS"] = "shipped"


@pytest.fixture(scope="module")
def shipped_sweep(quiet_session_worker):
    """The sweeper's beat entry on the shipped interval while this module runs (the session's
    worker, which sweeps every second, is stopped meanwhile)."""
    with override_settings(QUEUETY={}):
        ensure_sweeper_schedule()
    yield
    ensure_sweeper_schedule()


@pytest.fixture
def pools(shipped_sweep, tmp_path):
    """Worker ``sweeper`` runs the sweeper (on a queue nothing is sent to); worker ``victim``
    consumes the steps' queue. ``restart_victim()`` starts a new one, as a supervisor would."""
    # Workers killed earlier in the session (here or elsewhere) left registry rows behind; a
    # sweep handling those would re-publish this test's messages early and hide the bound.
    Worker.objects.all().delete()
    steps_queue = f"shipped-{uuid.uuid4().hex[:8]}"
    sweeper = ShippedWorker(tmp_path, f"{steps_queue}-sweeper", beat=True, name="sweeper")
    victim = ShippedWorker(tmp_path, steps_queue, beat=False, name="victim")
    start_together(sweeper, victim)
    started = [sweeper, victim]

    def restart_victim() -> ShippedWorker:
        again = ShippedWorker(tmp_path, steps_queue, beat=False, name=f"victim{len(started)}")
        again.start()
        started.append(again)
        return again

    yield steps_queue, victim, restart_victim
    stop_together(started)  # warm: each leaves the registry


@pytest.fixture
def short_lived(shipped_sweep, tmp_path):
    """As ``pools``, but the victim has 4 pool processes, each replaced after one task
    (``--max-tasks-per-child 1``): the pool processes running a step were forked after the
    victim's main process last beat, as happens after kills and ``max_tasks_per_child``."""
    Worker.objects.all().delete()
    steps_queue = f"shipped-{uuid.uuid4().hex[:8]}"
    sweeper = ShippedWorker(tmp_path, f"{steps_queue}-sweeper", beat=True, name="sweeper")
    victim = ShippedWorker(tmp_path, steps_queue, beat=False, name="victim", concurrency=4,
                           options=("--max-tasks-per-child", "1"))
    start_together(sweeper, victim)
    started = [sweeper, victim]
    yield steps_queue, sweeper, victim, started
    stop_together(started)


def _hanging(queue, token, **options):
    run_id = (queuety.workflow("shipped_hang").on_queue(queue)
              .then(workflows.step_a).then(workflows.hang_first_time, **options)
              .then(workflows.step_c).dispatch({"token": token}))
    deadline = time.monotonic() + 30
    while not workflows.marks(f"{token}-hang"):
        assert time.monotonic() < deadline, "the hanging step never started"
        time.sleep(0.05)
    return run_id, int(workflows.marks(f"{token}-hang")[0].split()[0])


def test_a_killed_pool_process_is_recorded_at_once(pools, figures):
    queue, victim, _ = pools
    token = uuid.uuid4().hex[:12]
    run_id, pid = _hanging(queue, token)

    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    lost = first_event(run_id, "step_retried")
    status = wait_for(run_id, timeout=60, worker=victim)

    recorded_after = lost.created_at.timestamp() - killed
    figures.record("Shipped timings: pool process SIGKILLed mid-step",
                   recorded_after_s=round(recorded_after, 2))
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    # The main process, not the sweeper (which on these timings takes 50-61 s): billiard
    # notices the exit within a few seconds.
    assert recorded_after < 15, recorded_after
    assert status.status == "completed" and status.state["hung_once"] is True
    assert "recorded as WorkerLost and runs again" in victim.log()


def test_a_timed_step_whose_worker_dies_is_retried_as_a_lost_worker(pools, figures):
    queue, victim, restart_victim = pools
    token = uuid.uuid4().hex[:12]
    run_id, _ = _hanging(queue, token, timeout=5)

    victim.crash()
    killed = time.time()
    restart_victim()
    lost = first_event(run_id, "step_retried")
    status = wait_for(run_id, timeout=60)

    recorded_after = lost.created_at.timestamp() - killed
    figures.record("Shipped timings: worker SIGKILLed during a step with timeout=5",
                   recorded_after_s=round(recorded_after, 2))
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost", lost.data
    assert status.status == "completed", status.error
    # Found past the step's hard limit by the next sweep: not after STALE_AFTER (60 s).
    # The hard limit a timed message carries: timeout + grace + INLINE_SECONDS.
    assert recorded_after <= 5 + GRACE + DEFAULTS["INLINE_SECONDS"] + 2 * SWEEP + 2, \
        recorded_after


@pytest.mark.parametrize("held", ["a retry back-off", "a delay"])
def test_a_message_held_by_a_killed_worker_runs_within_the_bound(pools, figures, held):
    queue, victim, restart_victim = pools
    token = uuid.uuid4().hex[:12]
    if held == "a retry back-off":
        retry = queuety.RetryPolicy(max_attempts=2, initial_delay=3, jitter=0,
                                    retry_on=[ConnectionError])
        run_id = (queuety.workflow("shipped_backoff").on_queue(queue)
                  .then(workflows.flaky, retry=retry)
                  .dispatch({"token": token, "raise": "builtins.ConnectionError",
                             "fail_times": 1}))
        scheduled = first_event(run_id, "step_retried")
    else:
        run_id = (queuety.workflow("shipped_delay").on_queue(queue)
                  .then(workflows.step_a).delay(seconds=3).then(workflows.step_c)
                  .dispatch({"token": token}))
        scheduled = first_event(run_id, "step_completed")
    time.sleep(0.5)  # the victim has reserved the message, which waits there for its due time
    row = StepRun.objects.filter(run_id=run_id, status="pending").get()
    due = row.available_at.timestamp()

    victim.crash()
    restart_victim()
    status = wait_for(run_id, timeout=120)

    ran = StepRun.objects.get(pk=row.pk).claimed_at.timestamp()
    late = ran - due
    figures.record(f"Shipped timings: worker SIGKILLed holding {held}", late_s=round(late, 2),
                   scheduled_at=scheduled.created_at.isoformat())
    assert status.status == "completed", status.error
    # Found lost after WORKER_LOST_AFTER, its messages re-published at the next sweep; before,
    # the sweeper re-published them only REDELIVER_AFTER (60 s) after they were due.
    assert late <= LOST_AFTER + 2 * SWEEP + 3, late


def _hanging_runs(queue, count):
    """Dispatch ``count`` runs whose only step hangs; return their ids once every step runs,
    in pool processes forked after the quick steps run just before them (see ``short_lived``)."""
    quick = [queuety.workflow("shipped_quick").on_queue(queue).then(workflows.step_a)
             .dispatch({}) for _ in range(2 * count)]
    for run_id in quick:
        wait_for(run_id, timeout=60)
    tokens = [uuid.uuid4().hex[:12] for _ in range(count)]
    run_ids = [queuety.workflow("shipped_hang_alone").on_queue(queue)
               .then(workflows.hang_first_time).then(workflows.step_c)
               .dispatch({"token": token}) for token in tokens]
    deadline = time.monotonic() + 30
    while not all(workflows.marks(f"{token}-hang") for token in tokens):
        assert time.monotonic() < deadline, "the hanging steps never all started"
        time.sleep(0.05)
    return run_ids


def test_a_killed_worker_whose_pool_processes_are_newer_than_its_beat_is_found(
        short_lived, figures):
    queue, sweeper, victim, started = short_lived
    run_ids = _hanging_runs(queue, 4)
    held = StepRun.objects.filter(run_id__in=run_ids, status="processing").count()

    victim.crash()
    killed = time.time()
    again = ShippedWorker(victim.log_dir, queue, beat=False, name="victim2")
    again.start()
    started.append(again)
    lost = [first_event(run_id, "step_retried", timeout=150) for run_id in run_ids]
    statuses = [wait_for(run_id, timeout=60) for run_id in run_ids]

    recorded_after = [event.created_at.timestamp() - killed for event in lost]
    # Celery's lines only: the queuety logger's own handler prints each line a second time.
    # Every worker's main process sweeps in its turn, so the restarted one may be the one.
    logged = sum(int(count) for worker in (sweeper, again) for count in re.findall(
        r"^\[[^]]*WARNING/[^]]*\] .*?(\d+) attempt\(s\)[^\n]*recorded as lost",
        worker.log(), re.MULTILINE))
    figures.record("Shipped timings: worker SIGKILLed while 4 new pool processes run steps",
                   recorded_after_s=[round(after, 2) for after in sorted(recorded_after)],
                   logged_by_registry=logged, held=held)
    assert held == 4
    assert all(e.data["error"]["type"] == "queuety.exceptions.WorkerLost" for e in lost)
    assert all(status.status == "completed" for status in statuses)
    # By the registry, within WORKER_LOST_AFTER of the last beat of the worker (its main
    # process's or its steps' heartbeats), plus a sweep; before, the stale-heartbeat path took
    # the ones missed (STALE_AFTER, 60 s).
    assert max(recorded_after) <= LOST_AFTER + 2 * SWEEP + 3, recorded_after
    assert logged == held, sweeper.log()[-3000:] + again.log()[-3000:]


def test_a_pool_process_killed_while_postgres_is_away_is_recorded_once_it_answers(
        pools, figures):
    queue, victim, _ = pools
    token = uuid.uuid4().hex[:12]
    run_id, pid = _hanging(queue, token)

    # Killed a second into a 10 s outage: the main process's record fails on the database.
    with postgres_down():
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        time.sleep(9.0)
    answered = time.time()
    lost = first_event(run_id, "step_retried", timeout=150)
    status = wait_for(run_id, timeout=60, worker=victim)

    recorded_after = lost.created_at.timestamp() - answered
    figures.record("Shipped timings: pool process SIGKILLed during a 10 s PostgreSQL outage",
                   recorded_after_database_answered_s=round(recorded_after, 2))
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    assert status.status == "completed" and status.state["hung_once"] is True
    # The first record met the database away, and it was the retry that wrote it.
    assert "Could not record yet that pool process" in victim.log(), victim.log()[-3000:]
    assert "recorded as WorkerLost and runs again" in victim.log(), victim.log()[-3000:]
    # Retried by the main process until the database answers; before, the sweeper's
    # stale-heartbeat path recorded it about STALE_AFTER (60 s) after its last heartbeat.
    assert recorded_after < 5, recorded_after
