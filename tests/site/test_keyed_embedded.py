"""Keyed runs on the test settings' database in one process (the embedded SQLite default
without DATABASE_URL): the key's lock is a no-op there, and the rules still hold."""

from __future__ import annotations

import uuid

import pytest

import queuety
from queuety.models import Signal, StepRun, WorkflowRun
from tests import keyed_steps


@pytest.fixture
def key() -> str:
    return f"k-{uuid.uuid4().hex[:10]}"


def test_debounce__later_starts_replace_the_pending_runs_state(db, key):
    builder = keyed_steps.plain("site_debounce")
    first = builder.dispatch({"n": 1}, key=key, debounce=60)
    second = builder.dispatch({"n": 2}, key=key, debounce=60)
    assert first == second
    assert queuety.workflow_status(first).state == {"n": 2}
    row = StepRun.objects.get(run_id=first, seq=0)
    assert (row.status, row.attempt) == ("pending", 0)


def test_signal_or_start__one_run_for_the_key(db, key):
    builder = keyed_steps.inbox("site_inbox")
    first = queuety.signal_or_start(builder, key, "event", {"n": 1})
    second = queuety.signal_or_start(builder, key, "event", {"n": 2})
    assert first.started and not second.started and first.run_id == second.run_id
    assert list(Signal.objects.filter(run_id=first.run_id).order_by("pk")
                .values_list("payload", flat=True)) == [{"n": 1}, {"n": 2}]


def test_singleton_queue__held_until_the_live_run_is_cancelled(db, key):
    builder = keyed_steps.gated("site_queue")
    first = builder.dispatch({}, key=key, singleton=True)
    second = builder.dispatch({}, key=key, singleton=True, on_conflict="queue")
    assert StepRun.objects.get(run_id=second, seq=0).status == "held"
    with pytest.raises(queuety.RunConflict):
        builder.dispatch({}, key=key, singleton=True)
    queuety.cancel(first)
    assert StepRun.objects.get(run_id=second, seq=0).status == "pending"
    assert WorkflowRun.objects.get(pk=second).key == key
