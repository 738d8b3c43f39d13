"""The pure transition function: merging output and choosing the next step."""

from __future__ import annotations

import pytest

import queuety
from queuety.core import engine
from tests import workflows

SPEC = (queuety.workflow("w").then(workflows.step_a).then(workflows.step_b)
        .then(workflows.step_c).build())


def test_advance__merges_public_keys_and_moves_on():
    result = engine.advance(SPEC, 1, {"x": 1, "y": 2}, 0, {"y": 3, "_private": 9, "z": None})
    assert result.state == {"x": 1, "y": 3, "z": None}
    assert result.output == {"y": 3, "z": None}
    assert (result.next_index, result.jumped) == (1, False)


def test_advance__none_output_and_last_step_completes():
    result = engine.advance(SPEC, 1, {"x": 1}, 2, None)
    assert result.state == {"x": 1} and result.next_index is None


def test_advance__next_step_jumps_by_name_backwards_too():
    assert engine.advance(SPEC, 1, {}, 0, {"_next_step": "step_c"}).next_index == 2
    assert engine.advance(SPEC, 1, {}, 2, {"_next_step": "step_a"}).next_index == 0


@pytest.mark.parametrize("output, error, message", [
    ({"_next_step": "nope"}, queuety.UnknownStep,
     "Step 'step_a' of run 7 jumped to unknown step 'nope'"),
    ({"_next_step": 2}, queuety.InvalidStepOutput, "must be the name of a step"),
    ([1], queuety.InvalidStepOutput, "returned list; a step must return a dict"),
    ({"when": object()}, queuety.InvalidStepOutput, "not JSON"),
    ({"x": float("inf")}, queuety.InvalidStepOutput, "not JSON"),
    ({1: "a"}, queuety.InvalidStepOutput, "non-string keys"),
])
def test_advance__bad_output_is_a_definition_error(output, error, message):
    with pytest.raises(error, match=message):
        engine.advance(SPEC, 7, {}, 0, output)
    assert issubclass(error, queuety.WorkflowDefinitionError)


def test_describe_error__type_message_traceback():
    try:
        raise ConnectionResetError("peer gone")
    except ConnectionResetError as error:
        record = engine.describe_error(error)
    assert record["type"] == "ConnectionResetError" and record["message"] == "peer gone"
    assert "Traceback (most recent call last)" in record["traceback"]
    assert engine.describe_error(queuety.StepTimeout("late"), False) == {
        "type": "queuety.exceptions.StepTimeout", "message": "late"}
