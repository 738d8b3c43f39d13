"""The builder refuses what a worker could not run, when the workflow is built."""

from __future__ import annotations

import pytest

import queuety
from tests import workflows


def test_builder__is_immutable_and_names_default_to_the_callable():
    base = queuety.workflow("order").then(workflows.step_a)
    longer = base.then(workflows.StepB).then("tests.workflows.step_c")

    assert [s.name for s in base.build().steps] == ["step_a"]
    assert [(s.name, s.handler) for s in longer.build().steps] == [
        ("step_a", "tests.workflows.step_a"), ("StepB", "tests.workflows.StepB"),
        ("step_c", "tests.workflows.step_c")]


def test_builder__step_class_attributes_are_defaults():
    class_policy = queuety.RetryPolicy(max_attempts=2)

    class Timed(queuety.Step):
        retry = class_policy
        timeout = 5

        def handle(self, state):
            return None

    # A class defined here cannot be imported by a worker: refused, with the reason.
    with pytest.raises(queuety.WorkflowDefinitionError, match="inside a function"):
        queuety.workflow("w").then(Timed)


@pytest.mark.parametrize("build, message", [
    (lambda: queuety.workflow("  "), "non-blank name"),
    (lambda: queuety.workflow("w").build(), "has no steps"),
    (lambda: queuety.workflow("w").then(workflows.step_a).then(workflows.step_a),
     "two steps named 'step_a' (positions 0 and 1)"),
    (lambda: queuety.workflow("w").then(lambda state: None), "inside a function"),
    (lambda: queuety.workflow("w").then("tests.workflows.nope"), "cannot be imported"),
    (lambda: queuety.workflow("w").then("no_such_module.step"), "cannot be imported"),
    (lambda: queuety.workflow("w").then(42), "is not a step"),
    (lambda: queuety.workflow("w").then(dict), "has no handle"),
    (lambda: queuety.workflow("w").then(workflows.step_a, timeout=0), "positive number"),
    (lambda: queuety.workflow("w").then(workflows.step_a, timeout=True), "positive number"),
    (lambda: queuety.workflow("w").then(workflows.step_a, retry=3), "must be a queuety"),
    (lambda: queuety.workflow("w").then(workflows.step_a, name=""), "non-blank strings"),
])
def test_builder__refuses_bad_definitions_with_a_clear_message(build, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message.replace("(", r"\(")
                       .replace(")", r"\)")):
        build()


def test_builder__same_step_twice_with_explicit_names():
    spec = (queuety.workflow("w").then(workflows.step_a)
            .then(workflows.step_a, name="again").build())
    assert [s.name for s in spec.steps] == ["step_a", "again"]
    assert spec.index_of("again") == 1
    with pytest.raises(queuety.UnknownStep, match="has no step named 'x'; its steps are "
                                                  "'step_a', 'again'"):
        spec.index_of("x")
