"""Budgets: validation, the check order, the status summary and the view steps get."""

from __future__ import annotations

import pytest

import queuety
from queuety.core import budget
from tests import workflows


@pytest.mark.parametrize("method", ["max_transitions", "max_for_each_items", "max_state_bytes",
                                    "max_cost_units", "max_started_workflows"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_builder__budgets_below_one_are_refused(method, value):
    with pytest.raises(queuety.WorkflowDefinitionError,
                       match=f"Workflow {method} must be a whole number of at least 1"):
        getattr(queuety.workflow("w").then(workflows.step_a), method)(value)


def test_builder__every_budget_is_in_the_definition():
    spec = (queuety.workflow("w").max_transitions(8).max_for_each_items(16)
            .max_state_bytes(4096).max_cost_units(32).max_started_workflows(12)
            .then(workflows.step_a).build())
    assert spec.to_dict()["budget"] == {"max_transitions": 8, "max_for_each_items": 16,
                                        "max_state_bytes": 4096, "max_cost_units": 32,
                                        "max_started_workflows": 12}


@pytest.mark.parametrize("call, message", [
    (lambda b: b.version("  "), "version\\(\\) needs a non-blank label"),
    (lambda b: b.version(None), "version\\(\\) needs a non-blank label"),
    (lambda b: b.idempotency_key(""), "idempotency_key\\(\\) needs a non-blank string"),
    (lambda b: b.idempotency_key("k" * 256), "at most 255 characters \\(got 256\\)"),
    (lambda b: b.idempotency_key("k", on_conflict="ignore"), "must be 'report' or 'error'"),
    (lambda b: b.then(workflows.step_b, cost_units=-1), "at least 0 \\(got -1\\)"),
    (lambda b: b.on_queue(""), "non-blank queue name"),
])
def test_builder__guardrail_options_are_validated(call, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        call(queuety.workflow("w").then(workflows.step_a))


def test_builder__version_and_key_are_trimmed():
    builder = queuety.workflow("w").version(" v2 ").idempotency_key(" k:1 ").then(
        workflows.step_a)
    assert builder.build().version == "v2" and builder.dispatch_key == "k:1"


def test_cost_units__resolution_order():
    spec = (queuety.workflow("w").then(workflows.step_a).then(workflows.Costly)
            .then(workflows.Costly, name="free", cost_units=0).build())
    assert [s.cost_units for s in spec.steps] == [1, 2, 0]


def test_check__order_and_message():
    limits = budget.Budget(max_transitions=2, max_state_bytes=10, max_cost_units=1)
    with pytest.raises(queuety.BudgetExceeded) as breach:
        budget.check(limits, budget.Usage(3, 5, 0, 50), 7, "w")
    assert (breach.value.budget, breach.value.limit, breach.value.used) == \
        ("max_transitions", 2, 3)
    assert str(breach.value) == "Run 7 of workflow 'w' exceeded its max_transitions budget: 3 > 2."
    with pytest.raises(queuety.BudgetExceeded, match="max_state_bytes budget: 50 > 10"):
        budget.check(limits, budget.Usage(2, 5, 0, 50), 7, "w")
    budget.check(limits, budget.Usage(2, 1, 99, 10), 7, "w")  # at the limit is fine


def test_summary__limits_then_usage_or_none():
    assert budget.summary(budget.Budget(), budget.Usage(1, 2, 0, 3)) is None
    assert budget.summary(budget.Budget(max_cost_units=5, max_transitions=9),
                          budget.Usage(1, 2, 0, 3)) == {
        "max_transitions": 9, "max_cost_units": 5, "transitions": 1, "cost_units": 2,
        "started_workflows": 0, "public_state_bytes": 3}


def test_view__remaining():
    view = budget.BudgetView(budget.Budget(max_cost_units=5), budget.Usage(cost_units=2))
    assert view.remaining("max_cost_units") == 3
    assert view.remaining("max_transitions") is None
    with pytest.raises(KeyError, match="'max_for_each_items' is not a budget with a counter"):
        view.remaining("max_for_each_items")


def test_state_bytes__compact_utf8():
    assert budget.state_bytes({"a": "é"}) == len('{"a":"é"}'.encode()) == 10


def test_budget_exceeded__survives_pickling():
    import pickle

    error = queuety.BudgetExceeded("max_cost_units", 3, 4, 9, "w")
    again = pickle.loads(pickle.dumps(error))
    assert (again.budget, again.limit, again.used, again.run_id, str(again)) == \
        ("max_cost_units", 3, 4, 9, str(error))
