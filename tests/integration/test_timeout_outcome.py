"""Once an attempt's deadline has passed, its outcome is StepTimeout, whatever the body does.

A body that catches the interruption and returns (``except Exception``, or ``except
TimeoutError`` as around a socket read) or raises an error of its own in its place has still
timed out: its late output is discarded and shown as such in the timeline, and the retry
policy decides as for any timeout. A TimeoutError the body raises and catches before its
deadline is its own business. Runs on every supported Python, as the other timeout tests.
"""

from __future__ import annotations

import time
import uuid

import pytest

import queuety
from queuety.models import Event, StepRun
from tests import timeout_steps
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

TIMEOUT = 0.5


def _recorded_after(event: Event) -> float:
    """Seconds from the claim of the event's attempt to the event."""
    claimed = StepRun.objects.get(pk=event.step_run_id).claimed_at
    return (event.created_at - claimed).total_seconds()


def test_a_body_that_handles_its_interruption_still_times_out(pyworker, semantics):
    runs = {name: (queuety.workflow(f"swallow_{name}").on_queue(pyworker.queue)
                   .then(f"tests.timeout_steps.{name}", timeout=TIMEOUT)
                   .then("tests.workflows.step_a")
                   .dispatch({"token": uuid.uuid4().hex[:12], "body": 3}))
            for name in timeout_steps.SWALLOWING}

    measured = []
    for name, run_id in runs.items():
        status = wait_for(run_id, timeout=30, worker=pyworker)
        failed = Event.objects.get(run_id=run_id, kind="step_failed")
        assert status.status == "failed", (name, status.error)
        assert status.error["type"] == "queuety.exceptions.StepTimeout", name
        assert f"exceeded its timeout of {TIMEOUT:g}s" in status.error["message"]
        assert failed.data["discarded"] == timeout_steps.SWALLOWING[name], name
        assert "late" not in status.state and "a" not in status.state  # nothing merged
        assert not Event.objects.filter(run_id=run_id, kind="step_completed").exists()
        elapsed = _recorded_after(failed)
        assert TIMEOUT <= elapsed <= TIMEOUT + 1.5, (name, elapsed)
        measured.append(f"{name} {elapsed:.2f}s")
    semantics.record(f"T6 a body that handles its interruption, timeout={TIMEOUT:g}, body 3 s",
                     "StepTimeout at the deadline, late output or error discarded and shown",
                     "all StepTimeout; " + ", ".join(measured), python=pyworker.version)


def test_a_swallowed_timeout_is_retried_as_a_timeout(pyworker):
    retry = queuety.RetryPolicy(max_attempts=2, initial_delay=0.2, jitter=0,
                                retry_on=[TimeoutError])
    run_id = (queuety.workflow("swallow_retried").on_queue(pyworker.queue)
              .then("tests.timeout_steps.returns_after_catching_timeout_error",
                    timeout=TIMEOUT, retry=retry)
              .dispatch({"token": uuid.uuid4().hex[:12], "body": 3}))

    status = wait_for(run_id, timeout=30, worker=pyworker)

    retried = Event.objects.get(run_id=run_id, kind="step_retried")
    assert retried.data["error"]["type"] == "queuety.exceptions.StepTimeout"
    assert retried.data["discarded"] == {"output": {"late": "caught TimeoutError"}}
    assert status.status == "failed" and status.error["attempt"] == 2
    assert status.error["type"] == "queuety.exceptions.StepTimeout"


def test_a_for_each_item_that_swallows_its_interruption_times_out(pyworker):
    run_id = (queuety.workflow("swallow_items").on_queue(pyworker.queue)
              .for_each("items", "tests.timeout_steps.item_returns_after_catching",
                        timeout=TIMEOUT)
              .dispatch({"token": uuid.uuid4().hex[:12], "body": 3, "items": ["x", "y"]}))

    status = wait_for(run_id, timeout=30, worker=pyworker)

    assert status.status == "failed", status.error
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    failed = Event.objects.filter(run_id=run_id, kind="step_failed").first()
    assert failed.data["discarded"]["output"] in ({"late": "x"}, {"late": "y"})
    assert not Event.objects.filter(run_id=run_id, kind="item_completed").exists()


def test_a_timeout_error_caught_before_the_deadline_is_the_bodys_own(pyworker):
    run_id = (queuety.workflow("own_timeout_error").on_queue(pyworker.queue)
              .then("tests.timeout_steps.catches_its_own_timeout_error_early", timeout=5)
              .dispatch({"token": uuid.uuid4().hex[:12], "body": 0}))

    status = wait_for(run_id, timeout=30, worker=pyworker)

    assert status.status == "completed", status.error
    assert status.state["own_timeout_handled"] is True


# -- a Step class's timeout holds wherever the class runs ---------------------------------------

CLASS = "tests.timeout_steps.SlowWithOwnTimeout"


def _assert_timed_out_at_its_own_timeout(run_id, worker, kind="step_failed"):
    status = wait_for(run_id, timeout=30, worker=worker)
    failed = Event.objects.filter(run_id=run_id, kind=kind).first()
    assert failed is not None, list(Event.objects.filter(run_id=run_id)
                                    .values_list("kind", flat=True))
    assert failed.data["error"]["type"] == "queuety.exceptions.StepTimeout", failed.data
    assert "exceeded its timeout of 0.3s" in failed.data["error"]["message"]
    assert 0.3 <= _recorded_after(failed) <= 1.0  # at its own deadline, not after the body
    return status


def test_class_timeout__holds_in_a_parallel_branch(worker, token):
    run_id = (queuety.workflow("class_timeout_parallel")
              .parallel([CLASS, "tests.timeout_steps.quick_branch"])
              .dispatch({"token": token}))

    status = _assert_timed_out_at_its_own_timeout(run_id, worker)

    assert status.status == "failed" and "slow" not in status.state


def test_class_timeout__holds_for_a_for_each_item(worker, token):
    run_id = (queuety.workflow("class_timeout_items").for_each("items", CLASS)
              .dispatch({"token": token, "items": [1]}))

    status = _assert_timed_out_at_its_own_timeout(run_id, worker)

    assert status.status == "failed"


def test_class_timeout__holds_for_a_compensation(worker, token):
    run_id = (queuety.workflow("class_timeout_compensation")
              .then("tests.workflows.step_a").compensate_with(CLASS)
              .wait_for_approval().dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)

    queuety.cancel(run_id)

    deadline = time.monotonic() + 20
    while not Event.objects.filter(run_id=run_id, kind="cleanup_finished").exists():
        assert time.monotonic() < deadline, "the compensations did not finish in 20 s"
        time.sleep(0.1)
    _assert_timed_out_at_its_own_timeout(run_id, worker, kind="compensation_failed")


def test_parallel__a_branch_takes_options_of_its_own(worker, token):
    run_id = (queuety.workflow("branch_options")
              .parallel([("tests.timeout_steps.half_second", {"timeout": 0.2}),
                         "tests.timeout_steps.half_second"], timeout=5)
              .dispatch({"token": token}))

    status = wait_for(run_id, timeout=30, worker=worker)

    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    assert status.status == "failed"
    assert "exceeded its timeout of 0.2s" in failed.data["error"]["message"]
    assert StepRun.objects.filter(run_id=run_id, branch=0).get().timeout == 0.2
    assert StepRun.objects.filter(run_id=run_id, branch=1).get().timeout == 5
