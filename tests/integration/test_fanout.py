"""Fan-out with a real worker: parallel branches and for_each items (F1-F3, reference §8.3)."""

from __future__ import annotations

import time

import pytest

import queuety
from queuety.models import Event, StepRun
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def items(*specs):
    return [{"id": str(i), **spec} for i, spec in enumerate(specs)]


def test_F1_F2_blocking_branches_run_in_parallel_and_merge_in_order(worker, token, semantics):
    walls = []
    for round_ in range(3):
        tag = f"{token}{round_}"
        run_id = (queuety.workflow("par").parallel([workflows.sleeper, workflows.sleeper_two])
                  .then(workflows.step_a).dispatch({"token": tag, "nap": 1.0}))
        status = wait_for(run_id, timeout=30, worker=worker)
        starts = [float(line.split()[1]) for line in workflows.marks(f"{tag}-branch")]
        join = Event.objects.get(run_id=run_id, kind="step_completed",
                                 step_name="parallel_0").created_at.timestamp()
        walls.append(join - min(starts))
        assert status.status == "completed"
        assert status.state["shared"] == "second"   # declaration order, not completion order
        assert status.state["slept_by"] == "sleeper" and status.state["slept_two"] is True
        assert status.state["log"] == ["a"]
    semantics.record("F1 two branches of time.sleep(1.0), 4 pool processes",
                     "join within 1.6 s (2.0 s in series)",
                     ", ".join(f"{w:.2f}s" for w in walls))
    assert max(walls) <= 1.6


def test_F3_a_failing_branch_fails_the_run_before_the_join(worker, token):
    run_id = (queuety.workflow("par_fail").parallel([workflows.boom, workflows.sleeper])
              .then(workflows.step_a).dispatch({"token": token, "nap": 0.5}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and status.error["type"] == "ValueError"
    time.sleep(1.0)
    assert workflows.marks(f"{token}-a") == []
    assert not Event.objects.filter(run_id=run_id, kind="step_completed").exists()


def test_for_each__all_with_a_reducer(worker, token):
    run_id = (queuety.workflow("fe").then(workflows.plan_tasks)
              .for_each("tasks", workflows.run_task, "task_results",
                        reducer=workflows.summarise, name="run_tasks")
              .then(workflows.step_a)
              .dispatch({"token": token, "planned": items({}, {})}))
    status = wait_for(run_id, worker=worker)
    results = status.state["task_results"]
    assert status.status == "completed" and status.state["log"] == ["a"]
    assert (results["succeeded"], results["failed"], results["total"]) == (2, 0, 2)
    assert [r["index"] for r in results["results"]] == [0, 1]
    assert results["results"][1]["output"] == {"id": "1", "value": 10}
    assert status.state["for_each_count"] == 2
    assert status.state["winner_id"] in ("0", "1")


def test_for_each__first_success_settles_early_and_cancels_the_rest(worker, token):
    run_id = (queuety.workflow("fe_first")
              .for_each("tasks", workflows.run_task, mode="first_success")
              .then(workflows.step_a)
              .dispatch({"token": token, "tasks": items({}, {"sleep": 3, "action": "fail"})}))
    status = wait_for(run_id, worker=worker)
    aggregate = status.state["tasks_for_each_results"]
    assert status.status == "completed" and aggregate["succeeded"] == 1
    assert aggregate["winner"]["index"] == 0
    slow = StepRun.objects.get(run_id=run_id, branch=1)
    assert slow.status in ("cancelled", "failed")


def test_for_each__quorum(worker, token):
    ok = (queuety.workflow("fe_q").for_each("tasks", workflows.run_task, mode="quorum",
                                            quorum=2)
          .dispatch({"token": token, "tasks": items({"action": "fail"}, {}, {})}))
    status = wait_for(ok, worker=worker)
    assert status.status == "completed"
    assert status.state["tasks_for_each_results"]["succeeded"] == 2
    impossible = (queuety.workflow("fe_q3").for_each("tasks", workflows.run_task,
                                                     mode="quorum", quorum=3)
                  .dispatch({"token": token + "q", "tasks": items({"action": "fail"}, {}, {})}))
    assert wait_for(impossible, worker=worker).status == "failed"


def test_for_each__retry_reruns_only_the_failed_item(worker, token):
    run_id = (queuety.workflow("fe_retry").for_each("tasks", workflows.run_task)
              .then(workflows.step_a)
              .dispatch({"token": token,
                         "tasks": items({}, {"action": "fail_once", "sleep": 1}, {})}))
    assert wait_for(run_id, worker=worker).status == "failed"
    before = len(workflows.marks(f"{token}-item"))
    queuety.retry(run_id)
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert status.state["tasks_for_each_results"]["succeeded"] == 3
    assert len(workflows.marks(f"{token}-item")) == before + 1
    assert StepRun.objects.filter(run_id=run_id, step_name="tasks_for_each").count() == 3


def test_for_each__max_for_each_items_fails_the_planner(worker, token):
    run_id = (queuety.workflow("fe_budget").max_for_each_items(2).then(workflows.plan_tasks)
              .for_each("tasks", workflows.run_task)
              .dispatch({"token": token, "planned": items({}, {}, {})}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and status.error["budget"] == "max_for_each_items"
    assert status.error["step"] == "plan_tasks" and "tasks" not in status.state
    assert not StepRun.objects.filter(run_id=run_id, step_name="tasks_for_each").exists()


def test_for_each__empty_lists_and_bad_items(worker, token):
    empty = (queuety.workflow("fe_empty").for_each("tasks", workflows.run_task)
             .then(workflows.step_a).dispatch({"token": token, "tasks": []}))
    status = wait_for(empty, worker=worker)
    assert status.status == "completed"
    assert status.state["tasks_for_each_results"]["total"] == 0
    with pytest.raises(queuety.InvalidStepOutput, match="has no items, so mode 'first_success'"):
        (queuety.workflow("fe_empty_first").for_each("tasks", workflows.run_task,
                                                     mode="first_success")
         .dispatch({"token": token, "tasks": []}))
    with pytest.raises(queuety.InvalidStepOutput, match="expected state key 'tasks' to hold a "
                                                        "list"):
        queuety.workflow("fe_bad").for_each("tasks", workflows.run_task).dispatch(
            {"token": token, "tasks": {"not": "a list"}})


def test_for_each__a_thousand_items_one_expansion(worker, token, semantics):
    started = time.monotonic()
    run_id = (queuety.workflow("fe_1000").for_each("tasks", workflows.run_task)
              .dispatch({"token": token, "tasks": items(*[{} for _ in range(1000)])}))
    status = wait_for(run_id, timeout=240, worker=worker)
    took = time.monotonic() - started
    rows = StepRun.objects.filter(run_id=run_id)
    # One expansion: every item row was created by one statement, with one due time.
    expansions = rows.values("available_at").distinct().count()
    semantics.record("F6 for_each over 1,000 items, 4 pool processes",
                     "one expansion transaction, a counter join under the row lock",
                     f"completed in {took:.1f}s ({1000 / took:.0f} items/s); "
                     f"{rows.count()} item rows from {expansions} expansion")
    assert status.status == "completed"
    assert status.state["tasks_for_each_results"]["succeeded"] == 1000
    assert rows.count() == 1000 and expansions == 1
    assert Event.objects.filter(run_id=run_id, kind="step_completed").count() == 1


@pytest.mark.parametrize("shape", ["for_each", "parallel"])
def test_F4_max_concurrency_is_honoured(worker, token, semantics, shape):
    flow = queuety.workflow(f"limited_{shape}")
    if shape == "for_each":
        flow = flow.for_each("tasks", workflows.occupy_item, max_concurrency=2, name="fan")
    else:
        flow = flow.parallel([workflows.occupy_branch] * 4, max_concurrency=2, name="fan")
    run_id = flow.dispatch({"token": token, "nap": 1.0, "tasks": [1, 2, 3, 4]})
    status = wait_for(run_id, timeout=30, worker=worker)
    starts = [float(line.split()[2]) for line in workflows.marks(f"{token}-occupy")]
    join = Event.objects.get(run_id=run_id, kind="step_completed",
                             step_name="fan").created_at.timestamp()
    wall = join - min(starts)
    peak = workflows.peak_slots(token)
    semantics.record(f"F4 {shape}: 4 x 1 s with max_concurrency=2, 4 pool processes",
                     "2.0-2.8 s, at most 2 at once",
                     f"{wall:.2f}s, peak {peak['peak']} at once")
    assert status.status == "completed" and len(starts) == 4
    assert peak == {"running": 0, "peak": 2}
    assert 2.0 <= wall <= 2.8
    assert StepRun.objects.filter(run_id=run_id, status="held").count() == 0


def test_F4_held_items_are_cancelled_when_the_join_fails(worker, token):
    run_id = (queuety.workflow("limited_fail")
              .for_each("tasks", workflows.run_task, max_concurrency=1,
                        retry=queuety.RetryPolicy(max_attempts=1))
              .dispatch({"token": token, "tasks": items({"action": "fail"}, {}, {})}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed"
    rows = StepRun.objects.filter(run_id=run_id).order_by("branch")
    assert [r.status for r in rows] == ["failed", "cancelled", "cancelled"]
    assert len(workflows.marks(f"{token}-item")) == 1  # the held items never ran
