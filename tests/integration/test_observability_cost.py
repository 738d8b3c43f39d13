"""Signals, webhooks and metrics add no round trip to the step boundary: with a receiver on
every signal and the worker's metrics on, a step costs the same statements as without."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import queuety
from queuety import publish, signals
from queuety.runtime import attempt
from queuety.store.definitions import definition_id
from queuety.webhooks import outbox
from tests import workflows


def three_steps():
    return (queuety.workflow("observed_three")
            .then(workflows.step_a).then(workflows.step_b).then(workflows.step_c))


@pytest.fixture
def everything_on():
    received = []

    def receiver(sender, signal, **arguments):
        received.append(arguments)

    for kind in signals.EVENTS.values():
        kind.signal.connect(receiver, weak=False, dispatch_uid="cost")
    outbox.forget()
    with override_settings(QUEUETY={**settings.QUEUETY, "METRICS": True}):
        yield received
    for kind in signals.EVENTS.values():
        kind.signal.disconnect(dispatch_uid="cost")


def test_step_boundary__same_statements_with_signals_and_metrics_on(everything_on, token):
    definition_id(three_steps().build())
    outbox.subscribers()  # the endpoint cache, read at most every CACHE_SECONDS
    with publish.captured() as sent:
        with CaptureQueriesContext(connection) as dispatched:
            run_id = three_steps().dispatch({"token": token})
        with CaptureQueriesContext(connection) as own_message:
            attempt.execute_step(sent[0].step_run_id, inline=False)
        with CaptureQueriesContext(connection) as inline:
            attempt.execute_step(sent[1].step_run_id)

    def statements(captured):
        return [q["sql"].split()[0] for q in captured.captured_queries]

    assert statements(dispatched) == ["WITH"]
    assert statements(own_message) == ["UPDATE", "WITH"]
    # No SELECT of waiters at the end: no wait named the run.
    assert statements(inline) == ["UPDATE", "WITH", "WITH"]
    assert [a["run_id"] for a in everything_on] == [run_id, run_id]  # started, completed
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("queuety_steps_total", {
        "workflow": "observed_three", "step": "step_c", "outcome": "completed"}) >= 1


def _steps_per_second(n: int, token: str) -> float:
    definition_id(three_steps().build())
    started = time.perf_counter()
    with publish.captured() as sent:
        for _ in range(n):
            three_steps().dispatch({"token": token})
        for message in list(sent):
            attempt.execute_step(message.step_run_id)
    return 3 * n / (time.perf_counter() - started)


def test_throughput__measured_on_and_off(everything_on, token):
    """In-process, no broker: dispatch and run n three-step runs (inline), on then off."""
    n = 100
    on = _steps_per_second(n, token)
    for kind in signals.EVENTS.values():
        kind.signal.disconnect(dispatch_uid="cost")
    with override_settings(QUEUETY={**settings.QUEUETY, "METRICS": False}):
        off = _steps_per_second(n, token)
    print(f"\nsteps/s with signals+metrics on: {on:.0f}; off: {off:.0f}; "
          f"cost {(1 - on / off):.1%}")
    assert on > 0.5 * off  # a gross regression; the figure itself goes to docs/performance.md
