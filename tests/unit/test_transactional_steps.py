"""Exactly-once ORM steps' definition rules: where ``transactional`` comes from, that it is
kept in the definition only when set (existing hashes unchanged), and what it is refused on."""

from __future__ import annotations

import pytest

import queuety
from queuety.core.definition import DelayStep, StepSpec, TaskStep, WorkflowSpec
from tests import txn_steps, workflows


class AsyncBump(queuety.Step):
    transactional = True

    async def handle(self, state):
        return {}


async def async_step(state):
    return {}


def test_transactional__keyword_then_class_attribute_then_false():
    spec = (queuety.workflow("t").then(txn_steps.bump, transactional=True)
            .then(txn_steps.Bump).then(txn_steps.Bump, name="off", transactional=False)
            .then(workflows.step_a).build())
    assert [step.transactional for step in spec.steps] == [True, True, False, False]


def test_transactional__left_out_of_the_definition_at_its_default():
    plain = queuety.workflow("t").then(workflows.step_a).build()
    explicit = queuety.workflow("t").then(workflows.step_a, transactional=False).build()
    assert "transactional" not in plain.canonical_json()
    assert explicit.definition_hash == plain.definition_hash


def test_transactional__kept_when_set_and_round_trips():
    spec = queuety.workflow("t").then(txn_steps.bump, transactional=True).build()
    data = spec.to_dict()
    assert data["steps"][0]["transactional"] is True
    again = WorkflowSpec.from_dict(data)
    assert again.steps[0].transactional is True
    assert again.definition_hash == spec.definition_hash
    assert spec.definition_hash != queuety.workflow("t").then(txn_steps.bump).build() \
        .definition_hash


@pytest.mark.parametrize("handler", [AsyncBump, async_step])
def test_transactional__an_async_handler_is_refused_naming_the_step(handler):
    with pytest.raises(queuety.WorkflowDefinitionError,
                       match=r"Step '(AsyncBump|async_step)' is transactional but its "
                             r"handler is an async def"):
        queuety.workflow("t").then(handler, transactional=True)


def test_transactional__an_async_handler_is_fine_without_it():
    spec = queuety.workflow("t").then(AsyncBump, transactional=False).build()
    assert spec.steps[0].transactional is False


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_transactional__not_a_bool_is_refused(bad):
    with pytest.raises(queuety.WorkflowDefinitionError,
                       match=r"transactional for step 'bump' must be True or False"):
        queuety.workflow("t").then(txn_steps.bump, transactional=bad)


def test_transactional__only_task_steps_may_set_it():
    with pytest.raises(queuety.WorkflowDefinitionError,
                       match=r"Step 'nap' sets transactional=True; only a task step"):
        DelayStep(name="nap", delay_seconds=1.0, transactional=True)
    with pytest.raises(queuety.WorkflowDefinitionError, match=r"only a task step"):
        StepSpec.from_dict({"name": "nap", "kind": "delay", "delay_seconds": 1.0,
                            "transactional": True})
    assert TaskStep(name="s", handler="tests.workflows.step_a", transactional=True) \
        .transactional is True
