"""Every step kind in one definition: its JSON form and hash are pinned.

The hash below was computed on main (211cf93), before steps became one class per kind; a
change here means stored definitions change identity.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import queuety
from queuety import exceptions
from queuety.core.definition import (
    STEP_KINDS,
    FanOutStep,
    StepSpec,
    TaskStep,
    WaitStep,
    WorkflowSpec,
)

W = "tests.workflows"


def every_kind() -> WorkflowSpec:
    child = queuety.workflow("child").then(f"{W}.child_work")
    return (queuety.workflow("every_kind")
            .version("kinds.v1")
            .on_queue("main").with_priority("low").prune_state_after(3)
            .max_transitions(99).max_for_each_items(10).max_started_workflows(5)
            .retry(max_attempts=2, initial_delay=0.25)
            .then(f"{W}.step_a", timeout=5, cost_units=2, queue="io", priority="high",
                  concurrency_group="openai", concurrency_limit=3, rate_limit=(10, 60))
            .compensate_with(f"{W}.undo")
            .route(f"{W}.classify", {"left": "wait_go", queuety.DEFAULT: "wait_go"},
                   name="router")
            .wait_for_signal("go", result_key="go", timeout=30, on_timeout="continue",
                             name="wait_go")
            .wait_for_approval()
            .delay(seconds=1.5)
            .parallel([(f"{W}.step_a", {"timeout": 1, "cost_units": 2}), f"{W}.step_b"],
                      timeout=10, max_concurrency=1)
            .for_each("tasks", f"{W}.run_task", mode="quorum", quorum=1,
                      reducer=f"{W}.summarise", max_concurrency=2, concurrency_group="g")
            .repeat_until("router", state_key="done", max_iterations=4)
            .run_workflow("kid", child, retry=queuety.RetryPolicy(max_attempts=3))
            .start_workflows("items", child, group_key="batch", name="starter")
            .wait_for_workflow_group("batch", mode="quorum", quorum=1, result_key="got")
            .wait_for_workflows("started_workflow_ids", name="wait_ids")
            .build())


# Computed on main 211cf93 (StepSpec with 21 fields), before the tagged union.
EVERY_KIND_HASH = "fbd92fc98c99eb87e05d3f4f4b673e2e16779140c063c33e01c702cbf2d32bc6"


def test_every_kind__hash_is_pinned():
    assert every_kind().definition_hash == EVERY_KIND_HASH


def test_every_kind__round_trips_through_json():
    spec = every_kind()
    again = WorkflowSpec.from_dict(json.loads(spec.canonical_json()))
    assert again == spec
    assert again.to_dict() == spec.to_dict()
    assert again.definition_hash == EVERY_KIND_HASH
    kinds = [step.kind for step in spec.steps]
    assert set(kinds) == {"task", "wait", "delay", "parallel", "for_each", "repeat", "child",
                          "start", "wait_workflows"}


def test_every_kind__one_class_per_kind():
    classes = {step.kind: type(step) for step in every_kind().steps}
    assert classes == {kind: cls for kind, cls in STEP_KINDS.items()}
    again = WorkflowSpec.from_dict(every_kind().to_dict())
    assert [type(step) for step in again.steps] == [type(step) for step in every_kind().steps]


def test_step__kind_is_read_only_and_other_kinds_fields_read_as_none():
    task, wait = every_kind().steps[0], every_kind().steps[2]
    assert isinstance(task, TaskStep) and isinstance(wait, WaitStep)
    # A ClassVar, not a field: a frozen, slotted dataclass refuses it with TypeError (the
    # zero-argument super() of the slotted copy, bpo-46404) rather than FrozenInstanceError.
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError, AttributeError)):
        task.kind = "wait"  # type: ignore[misc]
    assert task.kind == "task"
    assert (task.wait, task.fanout, task.child, task.start, task.workflows, task.repeat,
            task.delay_seconds) == (None,) * 7
    assert (wait.handler, wait.routes, wait.default_route) == ("", None, None)


def test_step__replace_keeps_the_class():
    task = every_kind().steps[0]
    again = dataclasses.replace(task, compensation="tests.workflows.hook")
    assert type(again) is TaskStep and again.compensation == "tests.workflows.hook"
    assert again.handler == task.handler


def test_step__the_bases_are_not_steps():
    with pytest.raises(TypeError, match="base of the step classes"):
        StepSpec(name="x")
    with pytest.raises(TypeError, match="base of the step classes"):
        FanOutStep(name="x", fanout=every_kind().steps[5].fanout)


@pytest.mark.parametrize("change, message", [
    ({"kind": "teleport"}, "kind 'teleport', which is none of"),
    ({"kind": "wait", "wait": None}, "lacks wait"),
    ({"kind": "delay"}, "lacks delay_seconds"),
    ({"handler": ""}, "lacks handler"),
    ({"delay_seconds": 3.0}, "sets delay_seconds, which it has not"),
    ({"kind": "repeat", "handler": "", "repeat": {"target": "a"}, "fanout": {"branches": ["x"]}},
     "sets fanout"),
])
def test_step_from_dict__refuses_fields_of_another_kind(change, message):
    data = {**every_kind().to_dict()["steps"][0], **change}
    with pytest.raises(exceptions.WorkflowDefinitionError, match=message):
        StepSpec.from_dict(data)
