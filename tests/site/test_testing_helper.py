"""``queuety.testing`` used as a site uses it: pytest-django's ``db`` fixture (each test in a
transaction that is rolled back), no broker, no worker. Runs on the test settings' database:
PostgreSQL with DATABASE_URL, else the embedded SQLite default."""

from __future__ import annotations

import uuid

import pytest

import queuety
from queuety.models import StepRun
from queuety.testing import TestRun, WorkflowDidNotSettle, run_workflow
from tests import workflows as steps


@pytest.fixture
def token() -> str:
    return uuid.uuid4().hex[:12]


def test_a_registered_workflow_runs_to_its_end_in_the_test(db, token):
    run = run_workflow("reg_letters", {"token": token})
    run.assert_status("completed")
    assert run.state["log"] == ["a", "b", "c"]
    run.assert_events("workflow_started", "step_completed", "step_completed",
                      "step_completed", "workflow_completed")
    # Each step was claimed and recorded by the worker's own code: one attempt each.
    assert list(StepRun.objects.filter(run_id=run.id).values_list("attempt", "status")) == \
        [(1, "completed")] * 3


def test_an_approval_is_sent_and_the_run_goes_on(db, token):
    run = run_workflow("reg_approval", {"token": token})
    run.assert_status("waiting_for_signal")
    assert run.approve({"by": "ada"}) is run
    run.assert_status("completed")
    assert run.state["log"] == ["b"]
    run.assert_events("workflow_started", "signal_received", "workflow_completed")


def test_a_signal_completes_its_wait(db, token):
    builder = queuety.workflow(f"site_signal_{token}").wait_for_signal("paid", result_key="paid") \
        .then(steps.step_a)
    run = run_workflow(builder, {"token": token})
    run.assert_status("waiting_for_signal")
    run.signal("paid", {"amount": 5})
    run.assert_status("completed")
    assert run.state["paid"] == {"amount": 5}


def test_retries_back_offs_and_delays_are_not_waited_for(db, token):
    # Two failures with a 60 s back-off each, then a one-hour delay: done at once.
    builder = (queuety.workflow(f"site_retry_{token}")
               .then(steps.flaky, retry=queuety.RetryPolicy(max_attempts=4, initial_delay=60))
               .delay(hours=1).then(steps.step_b))
    run = run_workflow(builder, {"token": token, "raise": "builtins.ValueError", "fail_times": 2})
    run.assert_status("completed")
    assert run.state["succeeded_on"] == 3 and run.state["log"] == ["b"]
    assert run.events().count("step_retried") == 2


def test_a_child_run_runs_and_its_parent_is_woken(db, token):
    run = run_workflow("reg_parent", {"token": token})
    run.assert_status("completed")
    assert run.state["log"] == ["a", "c"]
    run.assert_events("workflow_started", "child_started", "child_finished",
                      "workflow_completed")


def test_a_failed_run_says_why(db, token):
    run = run_workflow(queuety.workflow(f"site_boom_{token}").then(steps.boom),
                       {"token": token})
    run.assert_status("failed")
    assert run.error is not None
    with pytest.raises(AssertionError, match=r"is 'failed' at step 0 \('boom'\), not "
                                             r"'completed'"):
        run.assert_status("completed")
    with pytest.raises(AssertionError, match="no 'workflow_completed'"):
        run.assert_events("workflow_started", "workflow_completed")


def test_a_loop_that_never_ends_is_reported_not_hung(db, token):
    builder = queuety.workflow(f"site_loop_{token}").then(steps.increment) \
        .repeat_until("increment", "never", True)
    with pytest.raises(WorkflowDidNotSettle, match="still had work after 3 step attempts"):
        run_workflow(builder, {"token": token}, max_steps=3)


def test_bad_input_is_refused_as_by_queuety_start(db):
    with pytest.raises(queuety.UnknownWorkflow, match="reg_letters"):
        run_workflow("reg_nope", {})
    with pytest.raises(queuety.InvalidPayload):
        run_workflow("reg_letters", [1])


def test_testrun_is_not_collected_as_a_test_class():
    assert TestRun.__test__ is False


def test_a_streaming_step_stores_its_chunks_in_the_test(db, token):
    from tests import streaming_steps

    run = run_workflow(queuety.workflow(f"site_stream_{token}").then(streaming_steps.Tokens),
                       {"token": token, "n": 4})
    run.assert_status("completed")
    assert run.state["text"] == "t0 t1 t2 t3 " and run.state["count"] == 4
    page = queuety.chunks(run.id, "Tokens")
    assert [chunk["content"] for chunk in page.chunks] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert [a["key"] for a in queuety.artifacts(run.id)] == ["partial"]


def test_a_wait_timeout_is_let_pass_by_expire_wait(db, token):
    from datetime import timedelta

    builder = (queuety.workflow(f"site_timeout_{token}")
               .wait_for_approval(timeout=timedelta(hours=4), on_timeout="continue")
               .then(steps.step_b))
    run = run_workflow(builder, {"token": token})
    run.assert_status("waiting_for_signal")
    run.expire_wait().assert_status("completed")
    assert run.state["approval"] is None and run.state["log"] == ["b"]
    assert "wait_timed_out" in run.events()
    with pytest.raises(AssertionError, match="nothing to expire"):
        run.expire_wait()


def test_only_the_run_and_the_runs_it_started_are_driven(db, token):
    child = queuety.workflow(f"site_child_{token}").then(steps.step_b)
    builder = (queuety.workflow(f"site_family_{token}")
               .then(steps.step_a)
               .start_workflows("items", child)
               .wait_for_workflows("started_workflow_ids")
               .wait_for_signal("go"))
    run = run_workflow(builder, {"token": token, "items": [1, 2]})
    # The runs it started ran to their end, and it was woken when they had.
    run.assert_status("waiting_for_signal")
    started = run.state["started_workflow_ids"]
    assert [queuety.workflow_status(pk).status for pk in started] == ["completed"] * 2
    # A run the test dispatched on its own, after it, is not driven by it.
    other = queuety.workflow(f"site_other_{token}").then(steps.step_a).dispatch({"token": token})
    run.signal("go")
    run.assert_status("completed")
    assert queuety.workflow_status(other).status == "running"
    assert StepRun.objects.get(run_id=other).status == "pending"
    assert TestRun(other).drive().status == "completed"
