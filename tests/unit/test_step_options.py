"""One resolution of a handler's retry, timeout and cost, wherever the handler runs."""

from __future__ import annotations

import pytest

import queuety
from queuety.core.handlers import branch_entry, step_options
from queuety.store.definitions import effective_policy
from tests import workflows

CLASS = "tests.timeout_steps.SlowWithOwnTimeout"
POLICY = queuety.RetryPolicy(max_attempts=5, retry_on=[ConnectionError])


class Plain(queuety.Step):
    def handle(self, state):
        return {}


class Declared(queuety.Step):
    retry = POLICY
    timeout = 2
    cost_units = 3

    def handle(self, state):
        return {}


@pytest.mark.parametrize("keywords, expected", [
    ({}, (POLICY, 2.0, 3)),
    ({"timeout": 9}, (POLICY, 9.0, 3)),
    ({"cost_units": 0}, (POLICY, 2.0, 0)),
    ({"retry": queuety.RetryPolicy(max_attempts=1)}, (queuety.RetryPolicy(max_attempts=1), 2.0, 3)),
])
def test_step_options__keyword_then_class_attribute(keywords, expected):
    options = step_options("s", Declared, **keywords)
    assert (options.retry, options.timeout, options.cost_units) == expected


def test_step_options__defaults_for_a_plain_handler():
    for handler in (Plain, workflows.step_a):
        options = step_options("s", handler)
        assert (options.retry, options.timeout, options.cost_units) == (None, None, 1)


@pytest.mark.parametrize("keywords, message", [
    ({"timeout": 0}, "timeout for step 's' must be a positive number of seconds"),
    ({"timeout": True}, "positive number of seconds"),
    ({"retry": "often"}, "retry for step 's' must be a queuety.RetryPolicy"),
    ({"cost_units": -1}, "cost_units for step 's' must be a whole number of at least 0"),
])
def test_step_options__bad_values_are_refused_naming_the_step(keywords, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        step_options("s", Plain, **keywords)


def test_for_each__takes_the_item_class_timeout():
    spec = queuety.workflow("w").for_each("items", CLASS).build()
    assert spec.steps[0].timeout == 0.3


def test_for_each__a_class_without_handle_item_is_refused_at_build():
    with pytest.raises(queuety.WorkflowDefinitionError,
                       match=r"names class 'tests.unit.test_step_options.Plain', which has no "
                             r"handle_item\(self, state, item, index\) method"):
        queuety.workflow("w").for_each("items", Plain)


def test_parallel__branch_timeouts_and_retries_come_from_options_keyword_or_class():
    spec = (queuety.workflow("w")
            .parallel([CLASS, (workflows.step_a, {"timeout": 7, "retry": POLICY}),
                       workflows.step_b], timeout=4).build())
    spread = spec.steps[0].fanout
    assert spread.branch_timeouts == (4.0, 7.0, 4.0)  # the keyword wins over the class
    assert [spec.timeout_of(0, branch) for branch in range(3)] == [4.0, 7.0, 4.0]
    assert effective_policy(spec, 0, 1) == POLICY
    assert effective_policy(spec, 0, 0) == effective_policy(spec, 0, 2) != POLICY


def test_parallel__class_timeouts_without_a_keyword():
    spec = queuety.workflow("w").parallel([CLASS, workflows.step_a]).build()
    assert spec.steps[0].fanout.branch_timeouts == (0.3, None)
    assert spec.timeout_of(0, 0) == 0.3 and spec.timeout_of(0, 1) is None


def test_parallel__without_branch_options_the_definition_is_as_before():
    spec = queuety.workflow("w").parallel([workflows.step_a, workflows.step_b]).build()
    stored = spec.to_dict()["steps"][0]["fanout"]
    assert "branch_timeouts" not in stored and "branch_retries" not in stored
    again = type(spec).from_dict(spec.to_dict())
    assert again.definition_hash == spec.definition_hash


def test_parallel__branch_options_survive_storage():
    spec = (queuety.workflow("w")
            .parallel([(workflows.step_a, {"retry": POLICY, "timeout": 1}), workflows.step_b])
            .build())
    again = type(spec).from_dict(spec.to_dict())
    assert again.steps[0].fanout == spec.steps[0].fanout
    assert again.definition_hash == spec.definition_hash


@pytest.mark.parametrize("entry, message", [
    ((workflows.step_a,), "must be a step or a pair"),
    ((workflows.step_a, {"timeout": 1}, 3), "must be a step or a pair"),
    ((workflows.step_a, {"timout": 1}), r"sets unknown options \['timout'\]"),
])
def test_parallel__malformed_branch_entries_are_refused(entry, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        branch_entry("p", 0, entry)
