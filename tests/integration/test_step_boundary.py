"""The step boundary end to end: PostgreSQL, a real prefork Celery worker, the sweeper."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import queuety
from queuety import publish, services
from queuety.models import Event, StepRun, WorkflowDefinition, WorkflowRun
from queuety.tasks import execute_step
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def three_steps():
    return (queuety.workflow("three_steps")
            .then(workflows.step_a).then(workflows.StepB).then("tests.workflows.step_c"))


def kinds(run_id: int) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind", flat=True))


def test_three_steps__complete_with_merged_state(worker, token):
    run_id = three_steps().dispatch({"token": token, "order": 7})

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed"
    assert status.state == {"token": token, "order": 7, "log": ["a", "b", "c"],
                            "done_a": True, "done_b": True, "done_c": True}
    assert (status.current_step, status.total_steps, status.current_step_name) == (3, 3, None)
    assert status.error is None and status.finished_at is not None
    assert kinds(run_id) == ["workflow_started", "step_completed", "step_completed",
                             "step_completed", "workflow_completed"]
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.definition.definition_hash == status.definition_hash == \
        three_steps().build().definition_hash
    assert list(StepRun.objects.filter(run_id=run_id).order_by("seq")
                .values_list("step_name", "status", "attempt")) == [
        ("step_a", "completed", 1), ("StepB", "completed", 1), ("step_c", "completed", 1)]


def test_definitions__one_row_per_shape(worker, token):
    first = three_steps().dispatch({"token": token})
    second = three_steps().dispatch({"token": token})
    other = queuety.workflow("three_steps").then(workflows.step_a).dispatch({"token": token})

    runs = WorkflowRun.objects.in_bulk([first, second, other])
    assert runs[first].definition_id == runs[second].definition_id != runs[other].definition_id
    assert WorkflowDefinition.objects.filter(name="three_steps").count() >= 2
    for run_id in (first, second, other):
        wait_for(run_id, worker=worker)


def test_next_step__jumps_over_steps_and_drops_reserved_keys(worker, token):
    run_id = (queuety.workflow("jumping")
              .then(workflows.step_a).then(workflows.jump_to_c).then(workflows.step_b)
              .then(workflows.step_c).dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed"
    assert status.state["log"] == ["a", "jump", "c"]
    assert "_ignored_reserved" not in status.state and "_next_step" not in status.state
    assert workflows.marks(f"{token}-b") == []
    assert status.current_step == status.total_steps == 4


def test_next_step__unknown_name_fails_the_run_with_that_name(worker, token):
    run_id = (queuety.workflow("bad_jump")
              .then(workflows.step_a).then(workflows.jump_to_nowhere).then(workflows.step_c)
              .dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.UnknownStep"
    assert "'no_such_step'" in status.error["message"]
    assert "'step_a', 'jump_to_nowhere', 'step_c'" in status.error["message"]
    assert status.error["step"] == "jump_to_nowhere" and status.error["attempt"] == 1
    assert status.state["log"] == ["a"]
    assert workflows.marks(f"{token}-c") == []
    assert kinds(run_id)[-2:] == ["step_failed", "workflow_failed"]


def test_duplicate_messages__run_the_handler_once(worker, token):
    run_id = (queuety.workflow("duplicates").then(workflows.slow).then(workflows.step_a)
              .dispatch({"token": token, "sleep": 1.0}))
    first = StepRun.objects.get(run_id=run_id, seq=0)

    # Two extra deliveries of the same step: one while it runs, one after it completed.
    execute_step.apply_async((first.pk,))
    time.sleep(0.3)
    execute_step.apply_async((first.pk,))
    wait_for(run_id, worker=worker)
    execute_step.apply_async((first.pk,))
    last = StepRun.objects.get(run_id=run_id, seq=1)
    execute_step.apply_async((last.pk,))
    time.sleep(1.5)

    assert len(workflows.marks(f"{token}-slow")) == 1
    assert len(workflows.marks(f"{token}-a")) == 1
    status = queuety.workflow_status(run_id)
    assert status.status == "completed" and status.state["log"] == ["a"]
    assert kinds(run_id).count("step_completed") == 2


def test_sigkill_mid_step__sweeper_recovers_and_each_output_merges_once(worker, token):
    run_id = (queuety.workflow("crashing")
              .then(workflows.step_a).then(workflows.hang_first_time).then(workflows.step_c)
              .dispatch({"token": token}))
    deadline = time.monotonic() + 30
    while not workflows.marks(f"{token}-hang"):
        assert time.monotonic() < deadline, "the hanging step never started"
        time.sleep(0.05)
    pool_pid = int(workflows.marks(f"{token}-hang")[0].split()[0])

    os.kill(pool_pid, signal.SIGKILL)
    status = wait_for(run_id, timeout=60, worker=worker)

    assert status.status == "completed", status.error
    assert status.state == {"token": token, "log": ["a", "c"], "done_a": True, "done_c": True,
                            "hung_once": True}
    executions = workflows.marks(f"{token}-hang")
    assert len(executions) == 2 and executions[1].split()[0] != str(pool_pid)
    hang = StepRun.objects.get(run_id=run_id, step_name="hang_first_time")
    assert (hang.status, hang.attempt) == ("completed", 2)
    timeline = list(Event.objects.filter(run_id=run_id).order_by("pk"))
    assert [e.kind for e in timeline] == ["workflow_started", "step_completed", "step_retried",
                                         "step_completed", "step_completed",
                                         "workflow_completed"]
    lost = timeline[2]
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    assert lost.attempt == 1 and lost.step_name == "hang_first_time"
    assert StepRun.objects.filter(run_id=run_id).count() == 3


def test_lost_message__sweeper_republishes_it(worker, token):
    with publish.captured() as swallowed:  # the broker "loses" the first message
        run_id = three_steps().dispatch({"token": token})
    assert len(swallowed) == 1

    status = wait_for(run_id, timeout=30, worker=worker)

    assert status.status == "completed"
    assert len(workflows.marks(f"{token}-a")) == 1


def test_step_boundary__query_count_is_pinned(token):
    # Claim and completion of a step, measured in this process: the claim (one UPDATE) and
    # the transition (BEGIN, one statement, COMMIT).
    with publish.captured() as sent:
        run_id = three_steps().dispatch({"token": token})
        services.execute_step(sent[0].step_run_id)
        with CaptureQueriesContext(connection) as middle:
            services.execute_step(sent[1].step_run_id)
        with CaptureQueriesContext(connection) as last:
            services.execute_step(sent[2].step_run_id)

    statements = [[q["sql"].split()[0] for q in captured.captured_queries]
                  for captured in (middle, last)]
    assert statements[0] == ["UPDATE", "BEGIN", "WITH", "COMMIT"], statements
    # The step that completes the run also looks up the runs waiting for it.
    assert statements[1] == ["UPDATE", "BEGIN", "WITH", "SELECT", "COMMIT"], statements
    assert queuety.workflow_status(run_id).status == "completed"


def test_failed_step__fails_the_run_with_its_error(worker, token):
    run_id = (queuety.workflow("failing").then(workflows.step_a).then(workflows.boom)
              .dispatch({"token": token, "order": 42}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed"
    assert status.error["type"] == "ValueError"
    assert status.error["message"] == "boom for order 42"
    assert status.current_step_name == "boom"
    # No policy anywhere: a plain exception is not retried.
    assert len(workflows.marks(f"{token}-boom")) == 1
    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    assert "Traceback" in failed.data["error"]["traceback"]
    assert "boom for order 42" in failed.data["error"]["traceback"]
