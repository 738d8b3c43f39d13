"""Retention rules (queuety.core.retention): the written durations and which rule keeps a run."""

from __future__ import annotations

from datetime import timedelta

import pytest

from queuety.core.retention import Clause, compile_rules, parse_duration

ISSUE = {"default": "30d", "order_fulfilment": {"completed": "7d", "failed": "90d"}}


@pytest.mark.parametrize("written, meant", [
    ("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), ("90m", timedelta(minutes=90)),
    (" 7d ", timedelta(days=7)), (timedelta(seconds=5), timedelta(seconds=5)), (None, None),
])
def test_parse_duration__accepted_forms(written, meant):
    assert parse_duration(written, "X") == meant


@pytest.mark.parametrize("written", ["30x", "30", "d", "0d", "-1d", "1.5d", 30, True,
                                     timedelta(0), timedelta(days=-1)])
def test_parse_duration__other_values_are_refused_naming_the_key(written):
    with pytest.raises(ValueError, match=r"^QUEUETY\['RETENTION'\]\['x'\] must be a positive "):
        parse_duration(written, "QUEUETY['RETENTION']['x']")


def test_rules__per_workflow_status_then_default_then_forever():
    rules = compile_rules({**ISSUE, "nightly": "2d", "audit": None})
    assert rules.keep("order_fulfilment", "completed") == timedelta(days=7)
    assert rules.keep("order_fulfilment", "failed") == timedelta(days=90)
    # A status the workflow's dict leaves out takes the default's.
    assert rules.keep("order_fulfilment", "cancelled") == timedelta(days=30)
    assert rules.keep("nightly", "failed") == timedelta(days=2)
    assert rules.keep("audit", "completed") is None  # None: kept forever
    assert rules.keep("unlisted", "cancelled") == timedelta(days=30)
    no_default = compile_rules({"order_fulfilment": {"completed": "7d"}})
    assert no_default.keep("unlisted", "completed") is None
    assert no_default.keep("order_fulfilment", "failed") is None
    assert compile_rules(None).empty and not no_default.empty


def test_rules__clauses_are_disjoint_filters():
    clauses = compile_rules({**ISSUE, "audit": None}).clauses()
    assert Clause("completed", timedelta(days=7), workflow="order_fulfilment") in clauses
    assert Clause("failed", timedelta(days=90), workflow="order_fulfilment") in clauses
    # The default's clause per status leaves out the workflows that set that status.
    assert Clause("completed", timedelta(days=30),
                  excluded=("audit", "order_fulfilment")) in clauses
    assert Clause("cancelled", timedelta(days=30), excluded=("audit",)) in clauses
    assert len(clauses) == 5  # audit keeps forever: no clause of its own


def test_rules__retention_days_is_the_default_when_retention_gives_none():
    rules = compile_rules({"order_fulfilment": {"completed": "7d"}}, 45)
    assert rules.keep("other", "failed") == timedelta(days=45)
    assert rules.keep("order_fulfilment", "completed") == timedelta(days=7)
    assert compile_rules(None, 3).keep("any", "completed") == timedelta(days=3)
    with pytest.raises(ValueError, match="both set"):
        compile_rules(ISSUE, 30)
    with pytest.raises(ValueError, match=r"RETENTION_DAYS'\] must be None or a positive"):
        compile_rules(None, 0)
