"""Pure rules of start_workflows / wait_for_workflows, and their builder checks."""

from __future__ import annotations

import pytest

import queuety
from queuety.core import dependencies
from queuety.core.definition import WorkflowSpec
from queuety.core.dependencies import StartSpec, WaitWorkflowsSpec


def wait(**options):
    return WaitWorkflowsSpec(**{"ids": (1, 2, 3), **options})


DONE = ("completed", {"v": 1})


@pytest.mark.parametrize(("mode", "quorum", "runs", "verdict"), [
    ("all", None, {1: DONE, 2: DONE, 3: DONE}, "satisfied"),
    ("all", None, {1: DONE, 2: DONE, 3: ("running", {})}, "pending"),
    ("all", None, {1: DONE, 2: DONE}, "impossible"),                 # 3 does not exist
    ("all", None, {1: DONE, 2: ("cancelled", {}), 3: DONE}, "impossible"),
    ("any", None, {1: ("failed", {}), 2: ("running", {}), 3: DONE}, "satisfied"),
    ("any", None, {1: ("failed", {}), 2: ("failed", {}), 3: ("running", {})}, "pending"),
    ("any", None, {1: ("failed", {}), 2: ("failed", {})}, "impossible"),
    ("quorum", 2, {1: DONE, 2: ("running", {}), 3: ("failed", {})}, "pending"),
    ("quorum", 2, {1: DONE, 2: ("failed", {}), 3: ("failed", {})}, "impossible"),
    ("quorum", 2, {1: DONE, 2: ("running", {}), 3: DONE}, "satisfied"),
])
def test_evaluate__verdict_by_mode(mode, quorum, runs, verdict):
    assert dependencies.evaluate(wait(mode=mode, quorum=quorum), [1, 2, 3], runs).verdict \
        == verdict


def test_evaluate__results_in_listed_order_and_any_takes_the_first_listed():
    runs = {3: ("completed", {"n": 3}), 1: ("completed", {"n": 1}), 2: ("running", {})}
    keyed = dependencies.evaluate(wait(mode="quorum", quorum=2, result_key="r"), [1, 2, 3],
                                  runs)
    assert list(keyed.output["r"]) == ["1", "3"]
    assert keyed.details == {"matched": [1, 3], "failed": [], "remaining": [2]}
    first = dependencies.evaluate(wait(mode="any", result_key="r"), [1, 2, 3], runs)
    assert first.output == {"r": {"1": {"n": 1}}}
    merged = dependencies.evaluate(wait(mode="any"), [3, 1], runs)
    assert merged.output == {"n": 3}


def test_evaluate__one_awaited_run_is_stored_as_its_state_and_none_is_all_done():
    single = WaitWorkflowsSpec(ids=(7,), result_key="dep")
    assert dependencies.evaluate(single, [7], {7: DONE}).output == {"dep": {"v": 1}}
    assert dependencies.evaluate(wait(), [], {}).verdict == "satisfied"
    assert dependencies.evaluate(wait(mode="any"), [], {}).verdict == "impossible"


def test_child_payloads__inherit_items_and_index():
    spec = StartSpec(items_key="tasks", result_key="ids", payload_key="topic")
    state = {"brief_id": 42, "tasks": [{"topic": "pricing", "_secret": 1, "x": 2}, "reviews"],
             "ids": [9]}
    assert dependencies.child_payloads(spec, "start", state) == [
        {"brief_id": 42, "topic": "pricing", "x": 2, "start_item_index": 0},
        {"brief_id": 42, "topic": "reviews", "start_item_index": 1},
    ]
    bare = StartSpec(items_key="tasks", result_key="ids", inherit_state=False)
    assert dependencies.child_payloads(bare, "s", {"a": 1, "tasks": [5]}) == \
        [{"item": 5, "start_item_index": 0}]
    with pytest.raises(queuety.InvalidStepOutput, match=r"state\['tasks'\] to be a list"):
        dependencies.child_payloads(spec, "start", {"tasks": "nope"})


@pytest.mark.parametrize(("value", "ids"), [(5, [5]), ([3, 4, 3], [3, 4])])
def test_ids_from_state(value, ids):
    spec = WaitWorkflowsSpec(state_key="k")
    assert dependencies.ids_from_state(spec, "w", {"k": value}) == ids


@pytest.mark.parametrize("value", [None, "12", [1, True], [0], 2.0])
def test_ids_from_state__refuses_what_is_not_run_ids(value):
    with pytest.raises(queuety.InvalidStepOutput, match=r"state\['k'\] to hold a run id"):
        dependencies.ids_from_state(WaitWorkflowsSpec(state_key="k"), "w", {"k": value})


@pytest.mark.parametrize(("call", "message"), [
    (lambda b: b.wait_for_workflows([1], "quorum"), "quorum=n with n >= 1"),
    (lambda b: b.wait_for_workflows([1], "all", quorum=2), "only applies to mode='quorum'"),
    (lambda b: b.wait_for_workflows([1], "most"), "'all', 'any', 'quorum' or 'settled'"),
    (lambda b: b.wait_for_workflows([1, "2"]), "positive integers"),
    (lambda b: b.wait_for_workflows({"a": 1}), "a list of run ids or a state key"),
    (lambda b: b.wait_for_workflow(" "), "non-blank"),
    (lambda b: b.wait_for_workflow_group(""), "non-blank"),
    (lambda b: b.start_workflows("", queuety.workflow("c").then(_noop)), "items_key"),
    (lambda b: b.start_workflows("t", queuety.workflow("c").then(_noop), result_key="_x"),
     "result_key"),
    (lambda b: b.start_workflows("t", "not a builder"), "builder"),
    (lambda b: b.parallel([_noop, _noop], max_concurrency=0), "max_concurrency"),
    (lambda b: b.for_each("t", _noop, max_concurrency=True), "max_concurrency"),
    (lambda b: b.max_step_attempts(0), "max_step_attempts must be a whole number"),
    (lambda b: b.run_workflow("c", queuety.workflow("c").then(_noop), retry=3),
     "must be a queuety.RetryPolicy"),
])
def test_builder_refuses_bad_options(call, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        call(queuety.workflow("w").then(_noop))


def _noop(state):
    return {}


def test_new_options_round_trip_and_keep_old_hashes():
    child = queuety.workflow("child").then(_noop)
    spec = (queuety.workflow("w").then(_noop)
            .start_agents("tasks", child, group_key="agents")
            .wait_for_agent_group(mode="quorum", quorum=2)
            .wait_for_workflows("agent_workflow_ids", "any", name="first")
            .for_each("tasks", _noop, max_concurrency=3)
            .run_workflow("sub", child, retry=queuety.RetryPolicy(max_attempts=2))
            .max_step_attempts(9).build())
    again = WorkflowSpec.from_dict(spec.to_dict())
    assert again == spec and again.definition_hash == spec.definition_hash
    kinds = [s.kind for s in spec.steps]
    assert kinds == ["task", "start", "wait_workflows", "wait_workflows", "for_each", "child"]
    assert spec.steps[1].name == "start_agents" and spec.steps[2].name == "wait_for_agent_group"
    # Definitions that use none of the new options serialise exactly as before.
    plain = queuety.workflow("w").then(_noop).for_each("t", _noop).max_transitions(3).build()
    text = plain.canonical_json()
    assert "max_step_attempts" not in text and "max_concurrency" not in text
