"""start_workflows / wait_for_workflows with a real worker (reference §8.4, hazard 9)."""

from __future__ import annotations

import pytest

import queuety
from queuety.models import Event, WorkflowDependency, WorkflowRun
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def child(version: str | None = None, signal: bool = False):
    flow = queuety.workflow("agent_task")
    if signal:
        flow = flow.wait_for_signal("go", result_key="go")
    flow = flow.then(workflows.child_work)
    return flow.version(version) if version else flow


def failing_child():
    return (queuety.workflow("failing_task")
            .then(workflows.always_fails, retry=queuety.RetryPolicy(max_attempts=1)))


def started(run_id: int) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(started_by_id=run_id).order_by("pk"))


def test_start_workflows__one_child_per_item_with_the_parent_state(worker, token):
    run_id = (queuety.workflow("brief")
              .start_workflows("tasks", child("agent-task.v1"), "child_workflow_ids", "topic",
                               True, "start_agents")
              .dispatch({"token": token, "brief_id": 42,
                         "tasks": [{"topic": "pricing"}, "reviews"]}))
    status = wait_for(run_id, worker=worker)
    children = started(run_id)
    assert status.status == "completed"
    assert status.state["child_workflow_ids"] == [c.pk for c in children]
    for index, (run, topic) in enumerate(zip(children, ["pricing", "reviews"], strict=True)):
        done = wait_for(run.pk, worker=worker)
        assert done.status == "completed" and done.definition_version == "agent-task.v1"
        assert done.state["brief_id"] == 42 and done.state["topic"] == topic
        assert done.state["start_item_index"] == index
        assert "tasks" not in done.state and "child_workflow_ids" not in done.state
        assert (run.started_by_step, run.parent_id) == (0, None)
    assert Event.objects.get(run_id=run_id, kind="workflows_started").data["runs"] == \
        status.state["child_workflow_ids"]
    assert queuety.workflow_status(run_id).budget is None


def test_start_then_wait_for_all__results_keyed_by_child_id(worker, token):
    run_id = (queuety.workflow("campaign")
              .start_workflows("tasks", child(signal=True), "child_workflow_ids", "topic")
              .wait_for_workflows("child_workflow_ids", "all", "child_results")
              .then(workflows.increment)
              .dispatch({"token": token, "campaign": "spring", "tasks": ["a", "b"]}))
    waiting = wait_for(run_id, statuses=("waiting_for_workflows",), worker=worker)
    first, second = started(run_id)
    assert waiting.wait_type == "workflow" and waiting.wait_mode == "all"
    assert waiting.waiting_for == [str(first.pk), str(second.pk)]
    assert WorkflowDependency.objects.filter(run_id=run_id).count() == 2

    queuety.signal(first.pk, "go", {"ok": 1})
    wait_for(first.pk, worker=worker)
    still = queuety.workflow_status(run_id)
    assert still.status == "waiting_for_workflows"
    assert still.wait_details["matched"] == [str(first.pk)]
    assert still.wait_details["remaining"] == [str(second.pk)]

    queuety.signal(second.pk, "go", {"ok": 2})
    status = wait_for(run_id, worker=worker)
    results = status.state["child_results"]
    assert status.status == "completed" and status.state["counter"] == 1
    assert list(results) == [str(first.pk), str(second.pk)]   # listed order, not finish order
    assert [results[str(c.pk)]["start_item_index"] for c in (first, second)] == [0, 1]
    assert results[str(first.pk)]["campaign"] == "spring"
    assert results[str(second.pk)]["topic"] == "b" and results[str(second.pk)]["counter"] == 1
    assert not WorkflowDependency.objects.filter(run_id=run_id).exists()


def test_start_agents_and_wait_for_agents(worker, token):
    run_id = (queuety.workflow("agents").start_agents("agent_tasks", child())
              .wait_for_agents().dispatch({"token": token, "agent_tasks": ["x", "y"]}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert len(status.state["agent_workflow_ids"]) == 2
    assert len(status.state["agent_results"]) == 2
    assert {r["agent_task"] for r in status.state["agent_results"].values()} == {"x", "y"}


def test_group_quorum__continues_after_the_nth_success(worker, token):
    run_id = (queuety.workflow("research")
              .start_workflows("topics", child(signal=True), group_key="researchers")
              .wait_for_workflow_group("researchers", "quorum", 2, "selected_results")
              .dispatch({"token": token, "topics": ["a", "b", "c"]}))
    waiting = wait_for(run_id, statuses=("waiting_for_workflows",), worker=worker)
    runs = started(run_id)
    assert waiting.wait_mode == "quorum"
    assert waiting.wait_details["group_key"] == "researchers"
    assert waiting.wait_details["quorum"] == 2
    queuety.signal(runs[2].pk, "go")
    wait_for(runs[2].pk, worker=worker)
    assert queuety.workflow_status(run_id).wait_details["matched"] == [str(runs[2].pk)]
    queuety.signal(runs[0].pk, "go")
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert list(status.state["selected_results"]) == [str(runs[0].pk), str(runs[2].pk)]
    assert queuety.workflow_status(runs[1].pk).status == "waiting_for_signal"  # left alone


def test_group_quorum__fails_once_too_many_children_failed(worker, token):
    run_id = (queuety.workflow("research_fail")
              .start_workflows("topics", failing_child(), group_key="g")
              .wait_for_workflow_group("g", "quorum", 2)
              .then(workflows.step_c)
              .dispatch({"token": token, "topics": ["a", "b", "c"]}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.WorkflowWaitFailed"
    assert "can no longer be satisfied" in status.error["message"]
    assert len(status.error["failed"]) >= 2
    assert workflows.marks(f"{token}-c") == []


def test_wait_for_workflow__an_existing_run_by_id_and_by_state_key(worker, token):
    dependency = child(signal=True).dispatch({"token": token, "user_name": "User #11"})
    by_id = (queuety.workflow("dependent").wait_for_workflow(dependency, "dependency")
             .dispatch({"token": token}))
    by_key = (queuety.workflow("dependent_key")
              .wait_for_workflow("dependency_id", "dependency_state")
              .dispatch({"token": token, "dependency_id": dependency}))
    waiting = wait_for(by_id, statuses=("waiting_for_workflows",), worker=worker)
    assert (waiting.wait_type, waiting.waiting_for, waiting.wait_mode) == \
        ("workflow", [str(dependency)], "all")
    assert waiting.current_step_name == "wait_for_workflow"
    assert waiting.wait_details["matched"] == []
    assert waiting.wait_details["remaining"] == [str(dependency)]
    queuety.signal(dependency, "go")
    for run_id, key in ((by_id, "dependency"), (by_key, "dependency_state")):
        status = wait_for(run_id, worker=worker)
        assert status.status == "completed"
        assert status.state[key]["counter"] == 1
        assert status.state[key]["user_name"] == "User #11"


def test_wait_for_workflows__any_takes_the_first_listed_completed_run(worker, token):
    a = child(signal=True).dispatch({"token": token, "name": "a"})
    b = child(signal=True).dispatch({"token": token, "name": "b"})
    run_id = (queuety.workflow("any").wait_for_workflows([a, b], "any", "dependency_results")
              .dispatch({"token": token}))
    wait_for(run_id, statuses=("waiting_for_workflows",), worker=worker)
    queuety.signal(a, "go")
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert list(status.state["dependency_results"]) == [str(a)]
    assert status.state["dependency_results"][str(a)]["name"] == "a"
    queuety.cancel(b)


def test_wait_for_workflows__a_failed_or_missing_dependency_fails_the_waiting_run(worker,
                                                                                  token):
    dependency = failing_child().dispatch({"token": token})
    waits_on_failure = (queuety.workflow("dep_fails").wait_for_workflow(dependency)
                        .dispatch({"token": token}))
    missing = (queuety.workflow("dep_missing").wait_for_workflows([dependency, 10**12])
               .dispatch({"token": token}))
    status = wait_for(waits_on_failure, worker=worker)
    assert status.status == "failed"
    assert status.error["failed"] == [dependency]
    gone = queuety.workflow_status(missing)
    assert gone.status == "failed" and 10**12 in gone.error["failed"]
    assert str(10**12) in gone.error["message"]


def test_wait_for_workflows__bad_ids_in_the_state_fail_the_run_with_a_clear_error(worker,
                                                                                  token):
    run_id = (queuety.workflow("bad_ids").wait_for_workflows("ids")
              .dispatch({"token": token, "ids": ["12", True]}))
    status = queuety.workflow_status(run_id)
    assert status.status == "failed"
    assert "state['ids'] to hold a run id or a list of run ids" in status.error["message"]


def test_max_started_workflows__checked_before_any_child_is_created(worker, token):
    run_id = (queuety.workflow("capped").then(workflows.step_a)
              .start_workflows("tasks", child(), "child_workflow_ids")
              .max_started_workflows(1).dispatch({"token": token, "tasks": ["a", "b"]}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed"
    assert status.error["budget"] == "max_started_workflows"
    assert "would start 2 runs" in status.error["message"]
    assert "child_workflow_ids" not in status.state
    assert started(run_id) == []


def test_hazard_9__children_exist_only_if_the_parent_transition_commits(worker, token):
    # Merging the ids breaches max_state_bytes: the transition rolls back, children included.
    run_id = (queuety.workflow("atomic").then(workflows.step_a)
              .start_workflows("tasks", child(), "child_workflow_ids")
              .max_state_bytes(100)
              .dispatch({"token": token, "tasks": ["a", "b", "c", "d"]}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and status.error["budget"] == "max_state_bytes"
    assert started(run_id) == []
    assert workflows.marks(f"{token}-child") == []


def test_cancelling_the_parent_cancels_the_runs_it_started(worker, token):
    run_id = (queuety.workflow("cancel_tree").start_workflows("tasks", child(signal=True))
              .wait_for_workflows("started_workflow_ids")
              .dispatch({"token": token, "tasks": ["a", "b"]}))
    wait_for(run_id, statuses=("waiting_for_workflows",), worker=worker)
    queuety.cancel(run_id)
    assert [r.status for r in WorkflowRun.objects.filter(started_by_id=run_id)] == \
        ["cancelled", "cancelled"]


def test_a_lost_wake_up_is_repaired_by_the_sweeper(worker, token):
    from queuety import publish
    from queuety.runtime import attempt

    dependency = child(signal=True).dispatch({"token": token})
    run_id = (queuety.workflow("swept").wait_for_workflow(dependency, "dependency")
              .dispatch({"token": token}))
    wait_for(run_id, statuses=("waiting_for_workflows",), worker=worker)
    with publish.captured():  # the dependency's finish notifies no one
        queuety.signal(dependency, "go")
    wait_for(dependency, statuses=("waiting_for_signal", "running"), worker=worker)
    row = WorkflowRun.objects.get(pk=dependency).steps.get(step_name="child_work")
    with publish.captured():
        attempt.execute_step(row.pk)
    assert queuety.workflow_status(dependency).status == "completed"
    assert queuety.workflow_status(run_id).status == "waiting_for_workflows"
    status = wait_for(run_id, worker=worker, timeout=15)   # the sweeper (every second here)
    assert status.status == "completed" and status.state["dependency"]["counter"] == 1


def test_a_breach_after_a_settled_wait_fails_the_run_instead_of_leaving_it_parked(worker,
                                                                                   token):
    run_id = (queuety.workflow("breach_after_wait").max_started_workflows(2)
              .start_workflows("first", child(), group_key="one")
              .wait_for_workflow_group("one")
              .start_workflows("second", child(), "more_ids")
              .dispatch({"token": token, "first": ["a"], "second": ["b", "c"]}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and status.error["budget"] == "max_started_workflows"
    assert status.current_step_name == "wait_for_workflow_group_1"
    assert "more_ids" not in status.state
    assert len(started(run_id)) == 1


def test_a_fork_of_a_run_waiting_for_its_group_waits_for_the_same_runs(worker, token):
    run_id = (queuety.workflow("forked_group")
              .start_workflows("tasks", child(signal=True), group_key="crew")
              .wait_for_workflow_group("crew", result_key="crew_results")
              .dispatch({"token": token, "tasks": ["a", "b"]}))
    wait_for(run_id, statuses=("waiting_for_workflows",), worker=worker)
    fork = queuety.fork(run_id)
    ids = [r.pk for r in started(run_id)]
    forked = queuety.workflow_status(fork)
    assert forked.status == "waiting_for_workflows"
    assert forked.waiting_for == [str(i) for i in ids]
    for run in ids:
        queuety.signal(run, "go")
    for run in (run_id, fork):
        status = wait_for(run, worker=worker)
        assert status.status == "completed" and list(status.state["crew_results"]) == \
            [str(i) for i in ids]


def test_a_deadline_fails_a_run_waiting_for_workflows(worker, token):
    never = child(signal=True).dispatch({"token": token})
    run_id = (queuety.workflow("late").must_complete_within(seconds=1)
              .wait_for_workflow(never).dispatch({"token": token}))
    status = wait_for(run_id, worker=worker, timeout=15)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.DeadlineExceeded"
    queuety.cancel(never)
