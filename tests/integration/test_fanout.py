"""Fan-out with a real worker: parallel branches and for_each items (F1-F3, reference §8.3)."""

from __future__ import annotations

import hashlib
import json
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


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def test_F2_join_output_is_identical_across_runs_and_pythons(pyworker, semantics):
    """10 for_each runs whose items finish in reverse order, 10 parallel runs whose two
    branches race: the join output is the same every time, ordered by item index or branch
    declaration, on every supported Python (the digests match across the page's columns)."""
    runs = 10
    items_ = items(*({"sleep": s} for s in (0.3, 0.2, 0.1, 0)))
    tag = f"f2-{pyworker.version}"
    for_each = [(queuety.workflow("f2_items").on_queue(pyworker.queue)
                 .for_each("tasks", "tests.workflows.run_task")
                 .dispatch({"token": f"{tag}-{n}", "tasks": items_})) for n in range(runs)]
    parallel = [(queuety.workflow("f2_branches").on_queue(pyworker.queue)
                 .parallel(["tests.workflows.sleeper", "tests.workflows.sleeper_two"])
                 .dispatch({"token": f"{tag}-p{n}", "nap": 0.1})) for n in range(runs)]

    results, completion_orders, merged = set(), set(), set()
    for run_id in for_each:
        status = wait_for(run_id, timeout=60, worker=pyworker)
        assert status.status == "completed", status.error
        results.add(_digest(status.state["tasks_for_each_results"]["results"]))
        indices = [r["index"] for r in status.state["tasks_for_each_results"]["results"]]
        assert indices == [0, 1, 2, 3]
        completion_orders.add(tuple(
            StepRun.objects.get(pk=e.step_run_id).branch for e in
            Event.objects.filter(run_id=run_id, kind="item_completed").order_by("pk")))
    for run_id in parallel:
        status = wait_for(run_id, timeout=60, worker=pyworker)
        assert status.status == "completed", status.error
        merged.add(_digest({k: v for k, v in status.state.items() if k != "token"}))
        assert status.state["shared"] == "second"

    semantics.record(f"F2 join output over {runs} for_each runs (4 items finishing in reverse) "
                     f"and {runs} parallel runs (2 racing branches)",
                     f"ordered by item index / declaration; 1 distinct output per shape over "
                     f"{runs} runs; the same digests on every Python",
                     f"for_each: {len(results)} distinct output (digest {min(results)}) in "
                     f"index order, {len(completion_orders)} distinct completion orders seen "
                     f"(e.g. {list(min(completion_orders))}); parallel: {len(merged)} distinct "
                     f"merge (digest {min(merged)})", python=pyworker.version)
    assert len(results) == 1 and len(merged) == 1


def test_F3_a_failing_branch_fails_the_run_before_the_join(worker, token, semantics):
    run_id = (queuety.workflow("par_fail").parallel([workflows.boom, workflows.sleeper])
              .then(workflows.step_a).dispatch({"token": token, "nap": 0.5}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and status.error["type"] == "ValueError"
    time.sleep(1.0)
    joins = Event.objects.filter(run_id=run_id, kind="step_completed").count()
    semantics.record("F3 mode all, parallel: one of 2 branches fails",
                     "the run fails; 0 join executions; the successor never runs",
                     f"{status.status}, {status.error['type']}; {joins} join executions; "
                     f"successor ran {len(workflows.marks(f'{token}-a'))} time(s)")
    assert workflows.marks(f"{token}-a") == []
    assert joins == 0


def _settled(run_id):
    """The join's settle event and the run's item rows by status."""
    join = Event.objects.get(run_id=run_id, kind="step_completed", step_name="fan")
    rows = StepRun.objects.filter(run_id=run_id, step_name="fan")
    by_status: dict[str, list[int]] = {}
    for row in rows.order_by("branch"):
        by_status.setdefault(row.status, []).append(row.branch)
    return join, by_status


@pytest.mark.parametrize("mode, specs, quorum", [
    # 1 fast item, 2 slow ones (running when the join settles), 1 held by max_concurrency.
    ("first_success", ({}, {"sleep": 3}, {"sleep": 3}, {"sleep": 3}), None),
    # 2 fast items, 1 slow one running and 2 held when the second success settles it.
    ("quorum", ({}, {}, {"sleep": 3}, {"sleep": 3}, {"sleep": 3}), 2),
])
def test_F3_an_early_join_cancels_every_live_item_and_records_it(worker, token, semantics,
                                                                 mode, specs, quorum):
    started = time.monotonic()
    run_id = (queuety.workflow(f"fe_{mode}_cancels")
              .for_each("tasks", workflows.run_task, mode=mode, quorum=quorum,
                        max_concurrency=3, name="fan")
              .then(workflows.step_a)
              .dispatch({"token": token, "tasks": items(*specs)}))
    status = wait_for(run_id, worker=worker)
    took = time.monotonic() - started
    join, by_status = _settled(run_id)
    cancelled = by_status.get("cancelled", [])
    time.sleep(3.5)  # the slow items that were running end; their output must not count
    late = Event.objects.filter(run_id=run_id, kind="step_discarded").count()
    ran = len(workflows.marks(f"{token}-item"))
    label = "first_success" if mode == "first_success" else f"quorum({quorum})"
    semantics.record(f"F3 {label}: for_each over {len(specs)} items, "
                     f"{sum(1 for s in specs if not s)} fast and the rest 3 s, max_concurrency=3",
                     "continues after the first (n-th) success; every remaining item "
                     "cancelled, each cancellation recorded",
                     f"{status.status} after {took:.2f}s; {len(cancelled)} rows cancelled "
                     f"(items {cancelled}), step_completed says cancelled: "
                     f"{join.data['cancelled']}; {ran - (len(specs) - len(cancelled))} "
                     f"cancelled items had started, {late} late finishes recorded "
                     f"step_discarded; succeeded {by_status.get('completed', [])}")
    assert status.status == "completed" and status.state["log"] == ["a"]
    assert took < 3, took  # settled by the fast items, not after the slow ones
    assert join.data["cancelled"] == len(cancelled) == len(specs) - (quorum or 1)
    assert set(by_status) == {"completed", "cancelled"}
    assert late == ran - (len(specs) - len(cancelled))  # every started-then-cancelled item


def test_F3_mode_all_joins_after_the_last_item_and_a_failure_skips_the_join(worker, token,
                                                                            semantics):
    ok = (queuety.workflow("fe_all_last").for_each("tasks", workflows.run_task, name="fan")
          .then(workflows.step_a)
          .dispatch({"token": token, "tasks": items({"sleep": 1}, {}, {"sleep": 0.5})}))
    failing = (queuety.workflow("fe_all_fail")
               .for_each("tasks", workflows.run_task, name="fan")
               .then(workflows.step_b)
               .dispatch({"token": token + "f",
                          "tasks": items({"action": "fail"}, {"sleep": 0.5}, {})}))

    done = wait_for(ok, worker=worker)
    join, by_status = _settled(ok)
    finished = list(Event.objects.filter(run_id=ok, kind="item_completed").order_by("pk"))
    gap = (join.created_at - finished[-1].created_at).total_seconds()
    after_first = (join.created_at - finished[0].created_at).total_seconds()
    failed = wait_for(failing, worker=worker)
    time.sleep(1.0)
    joins = Event.objects.filter(run_id=failing, kind="step_completed").count()
    semantics.record("F3 mode all, for_each over 3 items (1 s, 0 s, 0.5 s); then one of 3 "
                     "fails", "the join starts after the last item; one failure fails the run "
                     "with 0 join executions",
                     f"join recorded {gap:.3f}s after the last item, {after_first:.2f}s "
                     f"after the first ({done.status}, "
                     f"{len(by_status.get('completed', []))}/3 items); with a failing item: "
                     f"{failed.status}, {failed.error['type']}, {joins} join executions, "
                     f"successor ran {len(workflows.marks(f'{token}f-b'))} time(s)")
    assert done.status == "completed" and by_status == {"completed": [0, 1, 2]}
    assert gap >= 0 and after_first >= 0.9  # not before the 1 s item finished
    assert failed.status == "failed" and failed.error["type"] == "ValueError"
    assert joins == 0 and workflows.marks(f"{token}f-b") == []


def test_F5_every_path_ends_in_one_terminal_output(worker, token, semantics):
    """F5 holds by construction: a definition is one list of steps, so routes, jumps and
    fan-outs all end by completing the run once, with one final state."""
    flows = {
        "route 'yes'": (queuety.workflow("f5_route")
                        .route(workflows.classify, {"yes": "yes_step", "no": "fallback"})
                        .then(workflows.step_b, name="yes_step")
                        .then(workflows.step_c, name="fallback"), {"label": "yes"}),
        "route 'no'": (queuety.workflow("f5_route")
                       .route(workflows.classify, {"yes": "yes_step", "no": "fallback"})
                       .then(workflows.step_b, name="yes_step")
                       .then(workflows.step_c, name="fallback"), {"label": "no"}),
        "jump": (queuety.workflow("f5_jump").then(workflows.jump_to_c)
                 .then(workflows.step_b).then(workflows.step_c), {}),
        "parallel": (queuety.workflow("f5_parallel")
                     .parallel([workflows.sleeper, workflows.sleeper_two])
                     .then(workflows.step_a), {"nap": 0.2}),
        "for_each": (queuety.workflow("f5_items").for_each("tasks", workflows.run_task)
                     .then(workflows.step_a), {"tasks": items({}, {}, {})}),
    }
    runs = {name: builder.dispatch({"token": f"{token}{n}", **payload})
            for n, (name, (builder, payload)) in enumerate(flows.items())}
    for name, run_id in runs.items():
        status = wait_for(run_id, worker=worker)
        assert status.status == "completed", (name, status.error)
    time.sleep(0.5)  # room for a second terminal event that should not come
    terminals, joins = {}, {}
    for name, run_id in runs.items():
        events = list(Event.objects.filter(run_id=run_id).order_by("pk")
                      .values_list("kind", "step_name"))
        terminals[name] = [k for k, _ in events if k in ("workflow_completed", "workflow_failed")]
        assert events[-1][0] == "workflow_completed", (name, events)
        joins[name] = sum(k == "step_completed" and step in ("parallel_0", "tasks_for_each")
                          for k, step in events)
    once = [name for name, kinds in terminals.items() if kinds == ["workflow_completed"]]
    logs = {name: queuety.workflow_status(run_id).state["log"] for name, run_id in runs.items()}
    semantics.record("F5 routes to different steps, a jump, parallel branches, for_each items",
                     "enforced by construction (one step list): each run completes once, with "
                     "one workflow_completed and one final state; branches meet at their join",
                     f"{len(once)}/{len(runs)} runs ended with exactly one workflow_completed, "
                     f"their last event; joins: parallel {joins['parallel']}, for_each "
                     f"{joins['for_each']}; final logs "
                     + ", ".join(f"{name} {log}" for name, log in logs.items()))
    assert once == list(runs) and joins["parallel"] == joins["for_each"] == 1
    assert logs == {"route 'yes'": ["b", "c"], "route 'no'": ["c"], "jump": ["jump", "c"],
                    "parallel": ["a"], "for_each": ["a"]}


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
