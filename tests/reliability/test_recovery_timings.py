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
  ``WORKER_LOST_AFTER`` plus a sweep late, not ``REDELIVER_AFTER`` (60 s) late.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from django.test import override_settings

import queuety
from queuety.conf import DEFAULTS
from queuety.models import Event, StepRun, Worker
from queuety.sweeper_beat import ensure_sweeper_schedule
from tests import workflows
from tests.integration.conftest import start_together, stop_together, wait_for
from tests.reliability.chaos import PoolWorker

SWEEP = DEFAULTS["SWEEP_INTERVAL"]
LOST_AFTER = DEFAULTS["WORKER_LOST_AFTER"]
GRACE = DEFAULTS["HARD_TIMEOUT_GRACE"]


class ShippedWorker(PoolWorker):
    """A worker on the shipped timings, on the session's broker and a queue of its own."""

    node_prefix = "shipped"

    def __init__(self, log_dir, queue, *, beat, name):
        super().__init__(log_dir, os.environ["CELERY_BROKER_URL"], queue, beat=beat,
                         concurrency=2, name=name)
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


def _first(run_id, kind, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        event = Event.objects.filter(run_id=run_id, kind=kind).order_by("pk").first()
        if event is not None:
            return event
        assert time.monotonic() < deadline, f"no {kind} event for run {run_id} in {timeout} s"
        time.sleep(0.05)


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
    lost = _first(run_id, "step_retried")
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
    lost = _first(run_id, "step_retried")
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
        scheduled = _first(run_id, "step_retried")
    else:
        run_id = (queuety.workflow("shipped_delay").on_queue(queue)
                  .then(workflows.step_a).delay(seconds=3).then(workflows.step_c)
                  .dispatch({"token": token}))
        scheduled = _first(run_id, "step_completed")
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
