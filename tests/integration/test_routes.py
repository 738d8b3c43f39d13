"""Routes and durable delays (criteria RT1-RT5 of shared/reference/adk-lessons.md)."""

from __future__ import annotations

import time

import pytest

import queuety
from queuety.models import Event, StepRun
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def test_RT1_unmatched_label_fails_the_run_naming_it(worker, token, semantics):
    run_id = (queuety.workflow("rt1").route(workflows.classify, {"yes": "yes_step"})
              .then(workflows.step_b, name="yes_step")
              .dispatch({"token": token, "label": "nope"}))

    status = wait_for(run_id, worker=worker)

    semantics.record("RT1 label 'nope' against {'yes'}, no DEFAULT",
                     "run failed, UnmatchedRoute naming 'nope' and ['yes']; 0 downstream",
                     f"{status.status}, {status.error['type'].rsplit('.', 1)[-1]}: "
                     f"{status.error['message']}")
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.UnmatchedRoute"
    assert "'nope'" in status.error["message"] and "['yes']" in status.error["message"]
    assert workflows.marks(f"{token}-b") == []
    assert len(workflows.marks(f"{token}-classify")) == 1  # a definition error: no retry


def test_RT3_default_runs_the_fallback_once_and_the_timeline_says_so(worker, token, semantics):
    run_id = (queuety.workflow("rt3").route(workflows.classify,
                                            {"yes": "yes_step", queuety.DEFAULT: "fallback"})
              .then(workflows.step_b, name="yes_step").then(workflows.step_c, name="fallback")
              .dispatch({"token": token, "label": "nope"}))

    status = wait_for(run_id, worker=worker)

    route = Event.objects.get(run_id=run_id, kind="step_completed",
                              step_name="classify").data["route"]
    semantics.record("RT3 label 'nope' with DEFAULT", "fallback runs once; timeline records "
                     "'nope' -> DEFAULT", f"fallback ran {len(workflows.marks(f'{token}-c'))} "
                     f"time(s); timeline {route}")
    assert status.status == "completed" and status.state["log"] == ["c"]
    assert route == {"label": "nope", "target": "fallback", "default": True}
    assert workflows.marks(f"{token}-b") == [] and len(workflows.marks(f"{token}-c")) == 1


def test_route__a_matching_label_with_output(worker, token):
    run_id = (queuety.workflow("rt_match").route(workflows.classify,
                                                 {"yes": "yes_step", "no": "fallback"})
              .then(workflows.step_b, name="yes_step").then(workflows.step_c, name="fallback")
              .dispatch({"token": token, "label": "yes", "with_output": True}))
    status = wait_for(run_id, worker=worker)
    # yes_step then, sequentially, fallback (routes choose where to go, then flow goes on).
    assert status.state["classified_as"] == "yes" and status.state["log"] == ["b", "c"]


def test_RT2_an_unrouted_successor_cannot_mask_an_unmatched_label(worker, token, semantics):
    # A step right after the route step that no label names is no successor: refused at build.
    with pytest.raises(queuety.WorkflowDefinitionError) as refused:
        (queuety.workflow("rt2_build").route(workflows.classify, {"yes": "yes_step"})
         .then(workflows.step_c, name="unrouted").then(workflows.step_b, name="yes_step")
         .build())
    # The route's target has an unconditional successor in sequence; 'nope' reaches neither.
    run_id = (queuety.workflow("rt2").route(workflows.classify, {"yes": "yes_step"})
              .then(workflows.step_b, name="yes_step").then(workflows.step_c, name="after")
              .dispatch({"token": token, "label": "nope"}))

    status = wait_for(run_id, worker=worker)

    time.sleep(0.5)  # room for a successor that should not run
    ran = len(workflows.marks(f"{token}-b")) + len(workflows.marks(f"{token}-c"))
    semantics.record("RT2 route {'yes'} with an unconditional successor, label 'nope'",
                     "refused at build, or the run fails with UnmatchedRoute; the successor "
                     "never runs",
                     f"a step after the route that no label names: refused at build "
                     f"({str(refused.value).split(':')[0]}); routed target with a successor: "
                     f"{status.status}, {status.error['type'].rsplit('.', 1)[-1]}; "
                     f"{ran} of 2 successors ran")
    assert "steps no route or sequence leads to: 'unrouted'" in str(refused.value)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.UnmatchedRoute"
    assert "'nope'" in status.error["message"] and "['yes']" in status.error["message"]
    assert ran == 0
    assert not Event.objects.filter(run_id=run_id, kind="step_completed").exists()


@pytest.mark.parametrize("label", [True, 1, 1.0, None, ["yes"]])
def test_RT4_labels_are_strings_compared_exactly(worker, token, semantics, label):
    run_id = (queuety.workflow("rt4").route(workflows.classify, {"1": "one", "True": "one"})
              .then(workflows.step_b, name="one").dispatch({"token": token, "label": label}))
    status = wait_for(run_id, worker=worker)
    semantics.record(f"RT4 label {label!r} against routes {{'1', 'True'}}",
                     "the run fails (a label must be a string); never matches '1' or 'True'",
                     f"{status.status}, {(status.error or {}).get('type', '-').rsplit('.', 1)[-1]}"
                     f"; downstream ran {len(workflows.marks(f'{token}-b'))} time(s)")
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.InvalidStepOutput"
    assert "a route label must be a string" in status.error["message"]
    assert workflows.marks(f"{token}-b") == []


def test_RT5_build_time_checks(semantics):
    cases = {
        "unknown target": lambda: queuety.workflow("w").route(
            workflows.classify, {"yes": "nowhere"}).then(workflows.step_b).build(),
        "tuple label with DEFAULT": lambda: queuety.workflow("w").route(
            workflows.classify, {("yes", queuety.DEFAULT): "b"}),
        "non-string label": lambda: queuety.workflow("w").route(
            workflows.classify, {1: "b"}),
        "empty routes": lambda: queuety.workflow("w").route(workflows.classify, {}),
        "unreachable step": lambda: queuety.workflow("w").route(
            workflows.classify, {"yes": "step_c"}).then(workflows.step_b)
        .then(workflows.step_c).build(),
    }
    refused = {}
    for case, build in cases.items():
        with pytest.raises(queuety.WorkflowDefinitionError) as error:
            build()
        refused[case] = str(error.value)
    semantics.record("RT5 unknown target, DEFAULT mixed into a label, non-string label, empty "
                     "routes, unreachable step", "5/5 refused at build",
                     f"{len(refused)}/5 refused at build")
    assert "targets 'nowhere', which name no step" in refused["unknown target"]
    assert "steps no route or sequence leads to: 'step_b'" in refused["unreachable step"]
    # Targets may name steps added after the route step.
    spec = (queuety.workflow("w").route(workflows.classify, {"a": "late"})
            .then(workflows.step_b, name="late").build())
    assert spec.steps[0].routes == {"a": "late"}


def test_delay__short_on_the_broker_long_in_the_database(worker, token):
    short = (queuety.workflow("nap").then(workflows.step_a).delay(seconds=1)
             .then(workflows.when_stamp).dispatch({"token": token}))
    status = wait_for(short, worker=worker)
    assert status.status == "completed"
    delay_row = StepRun.objects.get(run_id=short, step_name="delay_0")
    slept = (delay_row.finished_at - delay_row.created_at).total_seconds()
    assert 1.0 <= slept <= 1.0 * 1.1 + 0.5

    token2 = token + "x"
    long = (queuety.workflow("long_nap").delay(seconds=6).then(workflows.when_stamp)
            .dispatch({"token": token2}))
    row = StepRun.objects.get(run_id=long, step_name="delay_0")
    assert row.published_at is None and row.status == "pending"
    started = time.time()
    wait_for(long, timeout=20, worker=worker)
    stamped = float(workflows.marks(f"{token2}-stamp")[0].split()[1])
    assert 6 <= stamped - started <= 6 + 3


def test_delay__negative_is_refused_and_zero_advances():
    with pytest.raises(queuety.WorkflowDefinitionError, match="0 or more"):
        queuety.workflow("w").delay(seconds=-1)
    spec = queuety.workflow("w").delay(seconds=30, minutes=2, hours=1, days=1).delay().build()
    assert spec.steps[0].delay_seconds == 90150 and spec.steps[1].name == "delay_1"


def test_repeat_until__loops_back_until_the_state_matches(worker, token):
    run_id = (queuety.workflow("loop_until").then(workflows.increment)
              .repeat_until("increment", "counter", 3).then(workflows.step_a)
              .dispatch({"token": token}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed" and status.state["counter"] == 3
    assert len(workflows.marks(f"{token}-inc")) == 3
    evaluations = Event.objects.filter(run_id=run_id, kind="repeat_evaluated")
    assert [e.data["again"] for e in evaluations.order_by("pk")] == [True, True, False]
    # 3 increments + 3 evaluations + step_a: each evaluation is a transition.
    assert status.budget is None
    from queuety.models import WorkflowRun

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.transitions == 7 and run.loops == {}


def test_repeat_while_and_conditions(worker, token):
    polled = (queuety.workflow("loop_while").then(workflows.poll)
              .repeat_while("poll", "should_repeat", True).dispatch({"token": token, "limit": 3}))
    assert wait_for(polled, worker=worker).state == {"token": token, "limit": 3, "counter": 3,
                                                     "should_repeat": False}
    by_condition = (queuety.workflow("loop_cond").then(workflows.increment)
                    .repeat_until("increment", condition=workflows.counter_at_least_3,
                                  max_iterations=5)
                    .dispatch({"token": token + "c"}))
    assert wait_for(by_condition, worker=worker).state["counter"] == 3


def test_repeat__max_iterations_and_max_transitions_stop_a_runaway_loop(worker, token):
    capped = (queuety.workflow("loop_cap").then(workflows.increment)
              .repeat_while("increment", condition=workflows.always, max_iterations=2)
              .dispatch({"token": token}))
    status = wait_for(capped, worker=worker)
    assert status.status == "failed" and status.error["budget"] == "max_iterations"
    assert len(workflows.marks(f"{token}-inc")) == 3
    budgeted = (queuety.workflow("loop_budget").max_transitions(4).then(workflows.increment)
                .repeat_while("increment", condition=workflows.always)
                .dispatch({"token": token + "b"}))
    status = wait_for(budgeted, worker=worker)
    assert status.status == "failed" and status.error["budget"] == "max_transitions"


@pytest.mark.parametrize("build, message", [
    (lambda: queuety.workflow("w").then(workflows.step_a).repeat_until("later", "x"),
     "must name an earlier step"),
    (lambda: queuety.workflow("w").then(workflows.step_a).repeat_until(
        "step_a", "x", condition=workflows.always), "either a state_key or a condition"),
    (lambda: queuety.workflow("w").then(workflows.step_a).repeat_until(
        "step_a", "x", max_iterations=0), "at least 1"),
])
def test_repeat__build_time_checks(build, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        build()


def child_flow():
    return queuety.workflow("ignored").then(workflows.step_b).then(workflows.increment)


def test_run_workflow__the_child_feeds_the_parent(worker, token):
    from queuety.models import WorkflowRun

    run_id = (queuety.workflow("parent").then(workflows.step_a)
              .run_workflow("child", child_flow()).then(workflows.step_c)
              .dispatch({"token": token}))
    status = wait_for(run_id, timeout=30, worker=worker)
    child = WorkflowRun.objects.get(parent_id=run_id)
    assert status.status == "completed" and status.state["log"] == ["a", "b", "c"]
    assert status.state["counter"] == 1
    assert (child.name, child.parent_step, child.status) == ("child", 1, "completed")
    assert child.state["log"] == ["a", "b"]  # it started from the parent's state


def test_run_workflow__waiting_parent_shows_the_child_and_a_failed_child_fails_it(worker,
                                                                                token):
    from queuety.models import WorkflowRun

    run_id = (queuety.workflow("parent_fail")
              .run_workflow("slow_child", queuety.workflow("x").then(workflows.slow)
                            .then(workflows.boom))
              .then(workflows.step_c).dispatch({"token": token, "sleep": 1.0}))
    child = WorkflowRun.objects.get(parent_id=run_id)
    waiting = queuety.workflow_status(run_id)
    assert waiting.status == "waiting_for_workflows" and waiting.wait_type == "workflow"
    assert waiting.waiting_for == [str(child.pk)]
    status = wait_for(run_id, timeout=30, worker=worker)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.ChildRunFailed"
    assert f"Child run {child.pk}" in status.error["message"]
    assert "boom for order" in status.error["message"]
    assert workflows.marks(f"{token}-c") == []


def test_run_workflow__cancelling_the_parent_cancels_the_child(worker, token):
    from queuety.models import WorkflowRun

    run_id = (queuety.workflow("parent_cancel")
              .run_workflow("waiting_child", queuety.workflow("x").wait_for_approval())
              .dispatch({"token": token}))
    child = WorkflowRun.objects.get(parent_id=run_id)
    assert queuety.workflow_status(child.pk).status == "waiting_for_signal"
    queuety.cancel(run_id)
    assert queuety.workflow_status(child.pk).status == "cancelled"
    assert queuety.workflow_status(run_id).status == "cancelled"


def test_run_workflow__a_lost_wake_up_is_repaired_by_the_sweeper(worker, token):
    from queuety import publish
    from queuety.models import WorkflowRun
    from queuety.runtime import attempt

    with publish.captured():  # no message leaves: the child's steps run here, in-process
        run_id = (queuety.workflow("parent_swept")
                  .run_workflow("child_swept", queuety.workflow("x").then(workflows.step_b))
                  .then(workflows.step_c).dispatch({"token": token}))
    child = WorkflowRun.objects.get(parent_id=run_id)
    row = StepRun.objects.get(run_id=child.pk)
    with publish.captured():
        attempt.execute_step(row.pk)
    # The child completed, but its parent's wake-up went nowhere; the sweeper moves it on.
    assert queuety.workflow_status(child.pk).status == "completed"
    assert queuety.workflow_status(run_id).status == "waiting_for_workflows"
    assert wait_for(run_id, timeout=30, worker=worker).status == "completed"
