"""Exactly-once ORM steps (transactional=True) with a real worker on PostgreSQL: the body's
ORM writes commit with its output and transition, or not at all."""

from __future__ import annotations

import time

import pytest

import queuety
from queuety.models import Event, StepRun
from tests import txn_steps, workflows
from tests.integration.conftest import wait_for
from tests.testapp.models import Counter

pytestmark = pytest.mark.worker


@pytest.fixture
def counter(token):
    Counter.objects.create(name=token)
    yield token
    Counter.objects.filter(name=token).delete()


def _value(name: str) -> int:
    return Counter.objects.values_list("value", flat=True).get(name=name)


def _kinds(run_id: int) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind", flat=True))


def test_transactional__write_output_and_transition_commit_together(worker, counter):
    run_id = (queuety.workflow("txn_together").then(txn_steps.bump, transactional=True)
              .then(txn_steps.Bump, name="again").then(workflows.step_a)
              .dispatch({"counter": counter, "token": counter}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed", status.error
    assert _value(counter) == 2
    rows = StepRun.objects.filter(run_id=run_id, step_name__in=("bump", "again"))
    assert sorted(rows.values_list("output", flat=True), key=lambda o: o["seen"]) == \
        [{"seen": 1}, {"seen": 2}]
    assert status.state["seen"] == 2


def test_transactional__a_body_that_raises_after_writing_leaves_no_write(worker, counter):
    run_id = (queuety.workflow("txn_raises")
              .then(txn_steps.bump_then_fail_first, transactional=True,
                    retry=queuety.RetryPolicy(max_attempts=3, initial_delay=0.05, jitter=0))
              .dispatch({"counter": counter}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    # Attempt 1 wrote 1 and raised: rolled back. Attempt 2 wrote once, and saw 1.
    assert _value(counter) == 1
    assert status.state["seen"] == 1
    assert _kinds(run_id).count("step_retried") == 1


def test_transactional__without_it_the_failed_attempts_write_stays(worker, counter):
    # The control: the same body as a plain step keeps attempt 1's write (autocommit).
    run_id = (queuety.workflow("txn_control")
              .then(txn_steps.bump_then_fail_first,
                    retry=queuety.RetryPolicy(max_attempts=3, initial_delay=0.05, jitter=0))
              .dispatch({"counter": counter}))
    assert wait_for(run_id, worker=worker).status == "completed"
    assert _value(counter) == 2


def test_transactional__its_timeout_is_the_statement_timeout(worker, counter):
    run_id = (queuety.workflow("txn_timeout")
              .then(txn_steps.bump_then_sleep_in_db_first, transactional=True, timeout=1,
                    retry=queuety.RetryPolicy(max_attempts=2, initial_delay=0.05, jitter=0,
                                              retry_on=[TimeoutError]))
              .dispatch({"counter": counter}))
    status = wait_for(run_id, timeout=30, worker=worker)
    assert status.status == "completed"
    retried = Event.objects.get(run_id=run_id, kind="step_retried")
    assert retried.data["error"]["type"] == "queuety.exceptions.StepTimeout"
    assert 900 <= retried.duration_ms < 4000  # cut at 1 s, not after pg_sleep's 5
    assert _value(counter) == 1 and status.state["seen"] == 1


def test_transactional__a_timeout_is_not_retried_by_a_policy_that_does_not_say_so(
        worker, counter):
    run_id = (queuety.workflow("txn_timeout_fails")
              .then(txn_steps.bump_then_sleep_in_db_first, transactional=True, timeout=1,
                    retry=queuety.RetryPolicy(max_attempts=3, initial_delay=0.05, jitter=0))
              .dispatch({"counter": counter}))
    status = wait_for(run_id, timeout=30, worker=worker)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    assert _value(counter) == 0


def test_transactional__a_serialization_failure_is_retried_and_rolled_back(worker, counter):
    run_id = (queuety.workflow("txn_serialization")
              .then(txn_steps.bump_then_serialization_failure_first, transactional=True,
                    retry=queuety.RetryPolicy(max_attempts=3, initial_delay=0.05, jitter=0))
              .dispatch({"counter": counter}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    retried = Event.objects.get(run_id=run_id, kind="step_retried")
    assert "could not serialize access" in retried.data["error"]["message"]
    assert _value(counter) == 1 and status.state["seen"] == 1


@pytest.mark.parametrize("transactional, kept", [(True, 0), (False, 1)])
def test_transactional__an_attempt_taken_back_mid_body_commits_no_write(
        worker, counter, transactional, kept):
    # The run is cancelled while the body lingers with its write: the transition finds the
    # step row no longer the attempt's, and a transactional step's write goes with it (the
    # plain step's, committed by itself, stays: the control).
    run_id = (queuety.workflow("txn_taken_back")
              .then(txn_steps.bump_slowly, transactional=transactional)
              .dispatch({"counter": counter, "linger": 1.5}))
    deadline = time.monotonic() + 20
    while not StepRun.objects.filter(run_id=run_id, status="processing").exists():
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.02)
    time.sleep(0.3)
    queuety.cancel(run_id)
    deadline = time.monotonic() + 20
    while not Event.objects.filter(run_id=run_id, kind="step_discarded").exists():
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)
    assert _value(counter) == kept
    assert wait_for(run_id, ("cancelled",), worker=worker).status == "cancelled"
