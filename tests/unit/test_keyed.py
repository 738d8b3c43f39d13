"""Keyed runs, the pure rules: flow-control options and when a batch closes
(queuety.core.keyed)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

import queuety
from queuety.core.keyed import FlowOptions, batch_state, debounce_due, flow_options


def test_no_options__a_plain_start():
    assert flow_options("w") is None


def test_a_key_alone__stored_without_flow_control():
    assert flow_options("w", key="order:7") == FlowOptions(key="order:7", mode=None)


@pytest.mark.parametrize("options, mode", [
    ({"debounce": 2}, "debounce"),
    ({"singleton": True}, "singleton"),
    ({"batch": queuety.Batch(max_items=3, max_wait=1)}, "batch"),
])
def test_each_mode__checked_with_its_defaults(options, mode):
    checked = flow_options("w", key="k", **options)
    assert checked is not None and checked.mode == mode
    assert (checked.on_conflict, checked.signal) == ("reject", "input")


def test_debounce__seconds_as_float():
    assert flow_options("w", key="k", debounce=2).debounce == 2.0


@pytest.mark.parametrize("options, message", [
    ({"debounce": 1}, "debounce= on workflow 'w' needs key="),
    ({"singleton": True}, "singleton= on workflow 'w' needs key="),
    ({"key": "", "debounce": 1}, "must be a non-blank string"),
    ({"key": "x" * 256}, "at most 255 characters"),
    ({"key": 7}, "must be a non-blank string"),
    ({"key": "a\x00b"}, "without NUL"),
    ({"key": "k", "debounce": 1, "singleton": True}, "both debounce= and singleton="),
    ({"key": "k", "debounce": 0}, "debounce= must be a positive number"),
    ({"key": "k", "debounce": True}, "debounce= must be a positive number"),
    ({"key": "k", "debounce": float("inf")}, "debounce= must be a positive number"),
    ({"key": "k", "debounce": 1e300}, "at most 31622400"),
    ({"key": "k", "singleton": "yes"}, "must be True or False"),
    ({"key": "k", "singleton": True, "on_conflict": "error"},
     "idempotency-key option: pass it as .idempotency_key"),
    ({"key": "k", "singleton": True, "on_conflict": "report"}, "idempotency-key option"),
    ({"key": "k", "singleton": True, "on_conflict": "merge"}, "on_conflict must be one of"),
    ({"key": "k", "on_conflict": "queue"}, "needs singleton=True"),
    ({"key": "k", "debounce": 1, "on_conflict": "queue"}, "needs singleton=True"),
    ({"key": "k", "singleton": True, "signal": "go"}, "used only with singleton=True and "
                                                     "on_conflict='signal'"),
    ({"key": "k", "singleton": True, "on_conflict": "signal", "signal": ""},
     "signal= must name a signal"),
    ({"key": "k", "batch": {"max_items": 3}}, "batch= takes queuety.Batch"),
])
def test_bad_options__refused_naming_the_fix(options, message):
    with pytest.raises(queuety.InvalidPayload, match=message.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        flow_options("w", **options)


def test_signal_conflict__takes_its_signal_name():
    checked = flow_options("w", key="k", singleton=True, on_conflict="signal", signal="go")
    assert checked is not None and (checked.on_conflict, checked.signal) == ("signal", "go")


@pytest.mark.parametrize("arguments, message", [
    ({"max_items": 3}, "max_wait=...\\) is required"),
    ({"max_items": 0, "max_wait": 1}, "max_items=...\\) must be a whole number"),
    ({"max_items": 2.5, "max_wait": 1}, "max_items=...\\) must be a whole number"),
    ({"max_items": True, "max_wait": 1}, "max_items=...\\) must be a whole number"),
    ({"max_items": 2, "max_wait": -1}, "max_wait=...\\) must be a positive number"),
    ({"max_items": 2, "max_wait": "1"}, "max_wait=...\\) must be a positive number"),
])
def test_batch__validated(arguments, message):
    with pytest.raises(queuety.InvalidPayload, match=message):
        queuety.Batch(**arguments)


def test_batch__frozen_and_closes_at_max_items():
    batch = queuety.Batch(max_items=3, max_wait=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.max_items = 4  # type: ignore[misc]
    assert [batch.is_full(n) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert batch.to_dict() == {"max_items": 3, "max_wait": 5.0}


def test_batch__without_max_items_closes_by_time_only():
    batch = queuety.Batch(max_wait=2)
    assert not batch.is_full(10_000)


def test_batch_state_and_debounce_due():
    items = [{"n": 1}]
    state = batch_state(items)
    items.append({"n": 2})
    assert state == {"items": [{"n": 1}]}
    now = datetime(2026, 12, 3, tzinfo=timezone.utc)
    assert debounce_due(now, 1.5) == now + timedelta(seconds=1.5)
