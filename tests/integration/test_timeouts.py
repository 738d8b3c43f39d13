"""Timeouts that really interrupt, identically on Python 3.11, 3.12 and 3.13.

Criteria T1-T5 and S4 of shared/reference/adk-lessons.md. Every case runs on a worker started
with each supported interpreter, on its own queue.
"""

from __future__ import annotations

import time
import uuid

import pytest

import queuety
from queuety import publish
from queuety.conf import settings as queuety_settings
from queuety.models import Event, StepRun
from tests import timeout_steps
from tests.integration.conftest import wait_for
from tests.workflows import marks

pytestmark = pytest.mark.worker


def dispatch(pyworker, handler, token, *, timeout, body, retry=None):
    builder = queuety.workflow(f"timeout_{handler}").on_queue(pyworker.queue)
    options = {"timeout": timeout, **({"retry": retry} if retry else {})}
    return (builder.then(f"tests.timeout_steps.{handler}", **options)
            .dispatch({"token": token, "body": body}))


def start_time(token):
    lines = marks(f"{token}-start")
    return float(lines[0].split()[1]) if lines else None


def attempt_seconds(run_id):
    """Seconds from the claim of the run's (only) attempt to the record of its failure."""
    event = Event.objects.get(run_id=run_id, kind="step_failed")
    claimed = StepRun.objects.get(pk=event.step_run_id).claimed_at
    return (event.created_at - claimed).total_seconds()


def test_T1_T2_T3_every_body_shape_is_interrupted_at_the_deadline(pyworker, semantics):
    runs = {}
    for variant in timeout_steps.VARIANTS:
        token = uuid.uuid4().hex[:12]
        runs[variant] = (token, dispatch(pyworker, variant, token, timeout=2, body=10))

    outcomes = {}
    for variant, (_token, run_id) in runs.items():
        status = wait_for(run_id, timeout=30, worker=pyworker)
        outcomes[variant] = (status, attempt_seconds(run_id))
    # Wait out the bodies: an orphaned body (or thread) would mark 'after' by now.
    latest_start = max(start_time(token) for token, _ in runs.values())
    time.sleep(max(0.0, latest_start + 10.5 - time.time()))

    summary = []
    for variant, (status, elapsed) in outcomes.items():
        token = runs[variant][0]
        finished = len(marks(f"{token}-after"))
        summary.append(f"{variant} {elapsed:.2f}s")
        assert status.status == "failed", (variant, status.error)
        assert status.error["type"] == "queuety.exceptions.StepTimeout", variant
        assert "exceeded its timeout of 2s" in status.error["message"]
        assert 2.0 <= elapsed <= 3.5, (variant, elapsed)
        assert finished == 0, f"{variant} kept running after its timeout"
    semantics.record("T1/T2 8 body shapes (7 ADK + busy loop), timeout=2, body 10 s",
                     "all StepTimeout at 2.0-3.5 s; no body finishes",
                     "all StepTimeout; none finished; " + ", ".join(summary),
                     python=pyworker.version)


def test_T3_a_timed_out_thread_is_stopped_with_its_process(pyworker, semantics):
    token = uuid.uuid4().hex[:12]
    retry = queuety.RetryPolicy(max_attempts=2, initial_delay=0.5, jitter=0,
                                retry_on=[TimeoutError])
    run_id = dispatch(pyworker, "async_thread", token, timeout=1, body=4, retry=retry)

    status = wait_for(run_id, timeout=30, worker=pyworker)

    starts = [line.split() for line in marks(f"{token}-start")]
    pids = [int(pid) for pid, _ in starts]
    assert status.status == "failed" and len(starts) == 2
    # Each timed-out attempt's process exited, so its sleeping thread died with it; the second
    # attempt started in a fresh process and never overlapped the first.
    time.sleep(0.5)
    alive = [pid for pid in pids if _alive(pid)]
    overlap = float(starts[1][1]) - float(starts[0][1])
    time.sleep(max(0.0, float(starts[1][1]) + 4.5 - time.time()))
    finished = len(marks(f"{token}-after"))
    semantics.record("T3 to_thread body, timeout=1, 2 attempts",
                     "at most 1 attempt running at once; 0 running 0.5 s after the timeout",
                     f"{len(alive)} attempt processes alive 0.5 s after; second attempt started "
                     f"{overlap:.2f}s after the first; {finished} bodies finished",
                     python=pyworker.version)
    assert alive == [] and finished == 0 and pids[0] != pids[1]
    assert overlap >= 1.0 + 0.5


def _alive(pid: int) -> bool:
    """True if ``pid`` still runs (a zombie waiting to be reaped has stopped running)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("handler", ["swallows_timeout", "signals_blocked"])
def test_T4_a_body_that_resists_is_killed_at_the_hard_limit(pyworker, semantics, handler):
    token = uuid.uuid4().hex[:12]
    before = len(pyworker.pool_pids())
    run_id = dispatch(pyworker, handler, token, timeout=1, body=20)

    status = wait_for(run_id, timeout=30, worker=pyworker)

    elapsed = attempt_seconds(run_id)
    # timeout + HARD_TIMEOUT_GRACE + INLINE_SECONDS: the message's hard time limit.
    hard = publish.hard_limit(1)
    deadline = time.monotonic() + 10
    while len(pyworker.pool_pids()) < before:
        assert time.monotonic() < deadline, "the pool did not get back to full size in 10 s"
        time.sleep(0.2)
    semantics.record(f"T4 {handler}, timeout=1, grace={queuety_settings.HARD_TIMEOUT_GRACE:g}, "
                     f"inline slack={queuety_settings.INLINE_SECONDS:g}",
                     f"killed and recorded as StepTimeout within {hard:g}-{hard + 1.5:g} s; "
                     "pool back to full size within 10 s",
                     f"StepTimeout after {elapsed:.2f}s; pool {len(pyworker.pool_pids())}/"
                     f"{before}", python=pyworker.version)
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    assert "killed at the hard limit" in status.error["message"]
    assert hard <= elapsed <= hard + 1.5, elapsed
    assert marks(f"{token}-after") == []
    assert StepRun.objects.get(run_id=run_id).status == "failed"


def test_T5_S4_timeouts_are_retried_only_when_named(pyworker, semantics):
    named = queuety.RetryPolicy(max_attempts=3, initial_delay=1, jitter=0,
                                retry_on=[TimeoutError])
    unnamed = queuety.RetryPolicy(max_attempts=3, initial_delay=1, jitter=0,
                                  retry_on=[ConnectionError])
    tokens = [uuid.uuid4().hex[:12] for _ in range(2)]
    started = time.monotonic()
    retried = dispatch(pyworker, "sync_block", tokens[0], timeout=2, body=10, retry=named)
    not_retried = dispatch(pyworker, "sync_block", tokens[1], timeout=2, body=10, retry=unnamed)

    first = wait_for(retried, timeout=40, worker=pyworker)
    took = time.monotonic() - started
    second = wait_for(not_retried, timeout=10, worker=pyworker)

    attempts = [len(marks(f"{token}-start")) for token in tokens]
    bound = named.max_total_time(timeout=2, grace=1.5)
    semantics.record("T5/S4 always times out, timeout=2, max_attempts=3, delay 1 s, jitter 0",
                     f"retry_on=[TimeoutError]: 3 attempts, failed within {bound:g} s; "
                     "retry_on=[ConnectionError]: 1 attempt",
                     f"{attempts[0]} attempts, failed after {took:.2f}s; {attempts[1]} attempt",
                     python=pyworker.version)
    assert first.status == second.status == "failed"
    assert attempts == [3, 1]
    assert took <= bound
