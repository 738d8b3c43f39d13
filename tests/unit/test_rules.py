"""Pure rules moved into the core: a definition's next step and dispatch payload, signal data
and human replies, and the run ids a workflow wait waits for."""

from __future__ import annotations

import pytest

import queuety
from queuety.core import dependencies, waits
from queuety.core.definition import check_payload
from queuety.core.dependencies import WaitWorkflowsSpec
from tests import workflows


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


TOO_DEEP = nested(100_000)

# -- WorkflowSpec.next_index ----------------------------------------------------------------

THREE = (queuety.workflow("w").then(workflows.step_a).then(workflows.step_b)
         .then(workflows.step_c).build())
ONE = queuety.workflow("w").then(workflows.step_a).build()


@pytest.mark.parametrize("spec, index, following", [
    (THREE, 0, 1),
    (THREE, 1, 2),
    (THREE, 2, None),
    (ONE, 0, None),
])
def test_next_index__the_following_step_or_none_after_the_last(spec, index, following):
    assert spec.next_index(index) == following


# -- check_payload --------------------------------------------------------------------------


def test_check_payload__none_is_an_empty_state():
    first, second = check_payload("orders", None), check_payload("orders", None)
    assert first == {} and first is not second


@pytest.mark.parametrize("payload, message", [
    ([1], "must be a dict (got list)"),
    ("text", "must be a dict (got str)"),
    (3, "must be a dict (got int)"),
    ((("a", 1),), "must be a dict (got tuple)"),
    ({"_x": 1}, "uses reserved or non-string keys ['_x']"),
    ({"ok": 1, "_b": 1, "_a": 2}, "uses reserved or non-string keys ['_a', '_b']"),
    ({"_": 1}, "uses reserved or non-string keys ['_']"),
    ({1: "a"}, "uses reserved or non-string keys [1]"),
    ({None: "a", "ok": 1}, "uses reserved or non-string keys [None]"),
    ({"x": object()}, "is not JSON-serialisable: Object of type object"),
    ({"x": {1, 2}}, "is not JSON-serialisable: Object of type set"),
    ({"x": b"bytes"}, "is not JSON-serialisable: Object of type bytes"),
    ({"x": {(1, 2): "tuple key"}}, "is not JSON-serialisable: keys must be"),
    ({"x": float("nan")}, "is not JSON-serialisable: Out of range float values"),
    ({"x": [float("-inf")]}, "is not JSON-serialisable: Out of range float values"),
    ({"x": TOO_DEEP}, "is nested too deeply to be stored as JSON"),
])
def test_check_payload__refused_with_the_workflow_named(payload, message):
    with pytest.raises(queuety.WorkflowDefinitionError) as refused:
        check_payload("orders", payload)
    assert str(refused.value).startswith("The payload of workflow 'orders' ")
    assert message in str(refused.value)


@pytest.mark.parametrize("payload, state", [
    ({}, {}),
    ({"a": (1, 2)}, {"a": [1, 2]}),
    ({"a": {"b": [1.5, None, True, (3,)]}}, {"a": {"b": [1.5, None, True, [3]]}}),
    ({"é": "ü", "n": 1.0, "i": 1}, {"é": "ü", "n": 1.0, "i": 1}),
    ({"inner": {"_private": 1, "2": 2}}, {"inner": {"_private": 1, "2": 2}}),  # only top level
    ({"x": nested(100)}, {"x": nested(100)}),
])
def test_check_payload__a_json_round_trip_copy(payload, state):
    checked = check_payload("orders", payload)
    assert checked == state
    assert [type(v) for v in checked.values()] == [type(v) for v in state.values()]
    assert checked is not payload


def test_check_payload__nested_values_are_copies():
    payload = {"list": [1], "dict": {"k": "v"}}
    checked = check_payload("orders", payload)
    checked["list"].append(2)
    checked["dict"]["k"] = "changed"
    assert payload == {"list": [1], "dict": {"k": "v"}}


# -- check_signal_data ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "   ", "\n\t", None, 5, b"go", ["go"], "x" * 256])
def test_check_signal_data__bad_names(name):
    with pytest.raises(queuety.InvalidSignalData,
                       match=r"^Signal names are non-blank strings of at most 255 characters "
                             r"\(got .* for run 7\)\.$") as refused:
        waits.check_signal_data(7, name, {"ok": True}, 1000)
    assert refused.value.errors == [] and refused.value.too_large is False


def test_check_signal_data__the_name_is_checked_before_the_data():
    with pytest.raises(queuety.InvalidSignalData, match="^Signal names are"):
        waits.check_signal_data(7, "", object(), 1)


@pytest.mark.parametrize("data, problem", [
    (object(), "Object of type object is not JSON serializable"),
    ({"x": {1, 2}}, "Object of type set is not JSON serializable"),
    ({(1, 2): "tuple key"}, "keys must be"),
    (float("nan"), "Out of range float values are not JSON compliant"),
    ({"x": [float("inf")]}, "Out of range float values are not JSON compliant"),
])
def test_check_signal_data__not_json(data, problem):
    with pytest.raises(queuety.InvalidSignalData,
                       match="^The data of signal 'go' for run 7 is not JSON: ") as refused:
        waits.check_signal_data(7, "go", data, 10**6)
    [error] = refused.value.errors
    assert error["path"] == "/" and problem in error["message"]
    assert error["message"] in str(refused.value)
    assert refused.value.too_large is False


def test_check_signal_data__nested_too_deeply():
    with pytest.raises(queuety.InvalidSignalData,
                       match="^The data of signal 'go' for run 7 is not storable JSON: it is "
                             "nested too deeply.$") as refused:
        waits.check_signal_data(7, "go", {"x": TOO_DEEP}, 10**9)
    assert refused.value.errors == [{"path": "/", "message": "it is nested too deeply"}]
    assert refused.value.too_large is False


@pytest.mark.parametrize("data, size, limit", [
    ("é", 4, 3),                       # '"é"': UTF-8 bytes are counted, not characters
    ({"a": 1}, 7, 6),                  # compact: '{"a":1}'
    ([1, 2, 3], 7, 1),
    ("x" * 100, 102, 101),
])
def test_check_signal_data__over_the_byte_limit(data, size, limit):
    with pytest.raises(queuety.InvalidSignalData,
                       match=rf"^The data of signal 'go' for run 7 is {size} bytes; the limit is "
                             rf"{limit} \(QUEUETY\['MAX_SIGNAL_BYTES'\]\)\.$") as refused:
        waits.check_signal_data(7, "go", data, limit)
    assert refused.value.too_large is True and refused.value.errors == []
    assert waits.check_signal_data(7, "go", data, size) is data  # at the limit is fine


@pytest.mark.parametrize("data", [
    None, True, 0, 1.5, "text", [], [1, "a", None], {}, {"a": {"b": [1, 2]}}, {"_private": 1},
    (1, 2),              # returned as given: unlike check_payload, no JSON round trip
])
def test_check_signal_data__valid_data_comes_back_unchanged(data):
    assert waits.check_signal_data(7, "g" * 255, data, 1000) is data


# -- reply_signal ---------------------------------------------------------------------------

HUMAN = (queuety.workflow("w").then(workflows.step_a)
         .wait_for_approval()
         .wait_for_approval("ok", name="custom_approval")
         .wait_for_decision()
         .wait_for_decision("yes", "no", name="custom_decision")
         .wait_for_input()
         .wait_for_input({"type": "object"}, signal="form", name="custom_input")
         .wait_for_signal("approval", name="plain_signal")
         .wait_for_signals(["approval", "rejection"], mode="any", name="plain_signals")
         .build())


@pytest.mark.parametrize("step, kind, signal", [
    ("wait_for_approval", "approve", "approval"),
    ("wait_for_approval", "reject", None),
    ("wait_for_approval", "input", None),
    ("custom_approval", "approve", "ok"),
    ("wait_for_decision", "approve", "approval"),
    ("wait_for_decision", "reject", "rejection"),
    ("wait_for_decision", "input", None),
    ("custom_decision", "approve", "yes"),
    ("custom_decision", "reject", "no"),
    ("wait_for_input", "input", "input"),
    ("wait_for_input", "approve", None),
    ("wait_for_input", "reject", None),
    ("custom_input", "input", "form"),
    *[(step, kind, None) for step in ("plain_signal", "plain_signals")
      for kind in ("approve", "reject", "input")],
    *[(step, "cancel", None) for step in ("wait_for_approval", "wait_for_decision",
                                          "wait_for_input", "plain_signal")],
])
def test_reply_signal__by_wait_and_reply_kind(step, kind, signal):
    wait = HUMAN.steps[HUMAN.index_of(step)].wait
    assert waits.reply_signal(wait, kind) == signal


# -- awaited_ids ----------------------------------------------------------------------------

GROUPS = {"g": [5, 6, 7], "other": [8]}


@pytest.mark.parametrize("wait, state, ids", [
    # its own list, duplicates dropped, first occurrence kept; state and groups unused
    (WaitWorkflowsSpec(ids=(3, 1, 3, 2, 1)), {"ids": [9]}, [3, 1, 2]),
    (WaitWorkflowsSpec(ids=(4,)), {}, [4]),
    (WaitWorkflowsSpec(ids=()), {}, []),
    # a group filled by a start_workflows step; a group never filled waits for nothing
    (WaitWorkflowsSpec(group="g"), {"g": [1]}, [5, 6, 7]),
    (WaitWorkflowsSpec(group="missing"), {}, []),
    # a state key holding an id or a list of ids
    (WaitWorkflowsSpec(state_key="ids"), {"ids": [4, 2, 4]}, [4, 2]),
    (WaitWorkflowsSpec(state_key="ids"), {"ids": 9}, [9]),
    (WaitWorkflowsSpec(state_key="ids"), {"ids": []}, []),
])
def test_awaited_ids__by_source(wait, state, ids):
    assert dependencies.awaited_ids(wait, "wait", state, GROUPS) == ids


def test_awaited_ids__from_the_builder():
    spec = (queuety.workflow("w").then(workflows.step_a)
            .wait_for_workflows([3, 1, 3], name="listed")
            .wait_for_workflows("children", name="keyed")
            .wait_for_workflow_group("g", name="grouped").build())
    state = {"children": [8, 8, 2]}
    assert [dependencies.awaited_ids(step.workflows, step.name, state, GROUPS)
            for step in spec.steps[1:]] == [[3, 1], [8, 2], [5, 6, 7]]


def test_awaited_ids__a_group_list_is_a_copy():
    groups = {"g": [5, 6]}
    ids = dependencies.awaited_ids(WaitWorkflowsSpec(group="g"), "wait", {}, groups)
    ids.append(99)
    assert groups == {"g": [5, 6]}


@pytest.mark.parametrize("state", [
    {}, {"ids": None}, {"ids": "5"}, {"ids": [1, True]}, {"ids": [0]}, {"ids": -3},
    {"ids": [1.0]}, {"ids": [[1]]}, {"ids": {"a": 1}},
])
def test_awaited_ids__a_state_key_without_run_ids(state):
    with pytest.raises(queuety.InvalidStepOutput,
                       match=r"^Workflow wait 'wait' needs state\['ids'\] to hold a run id or "
                             r"a list of run ids \(got .*\)\.$"):
        dependencies.awaited_ids(WaitWorkflowsSpec(state_key="ids"), "wait", {**state}, GROUPS)


@pytest.mark.parametrize("payload", [{1: "a", "_b": 2}, {None: 1, 2: 3}])
def test_check_payload__mixed_bad_key_types_are_named(payload):
    with pytest.raises(queuety.WorkflowDefinitionError, match="reserved or non-string keys"):
        check_payload("orders", payload)


def test_reply_signal__decision_without_that_outcome_takes_no_reply():
    wait = waits.WaitSpec(signals=("yes",), mode="any", human="decision",
                          decision={"yes": "approved"})
    assert waits.reply_signal(wait, "reject") is None
    assert waits.reply_signal(wait, "approve") == "yes"
