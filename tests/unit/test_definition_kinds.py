"""Every step kind in one definition: its JSON form and hash are pinned.

The hash below was computed on main (211cf93), before steps became one class per kind; a
change here means stored definitions change identity.
"""

from __future__ import annotations

import json

import queuety
from queuety.core.definition import WorkflowSpec

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
