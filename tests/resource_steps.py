"""Steps of the resource-control tests and benchmarks: each records when it ran, so a test
can rebuild from the ledger how many ran at once.

Importable by the worker subprocesses (the project root is on their path). Each handler writes
``<pid> start <t>`` when it starts and ``<pid> end <t0> <t1> <label>`` when it ends to the mark
file ``<token>-ledger`` (tests.workflows.mark: O_APPEND, safe across processes).
"""

from __future__ import annotations

import time
from typing import Any

import queuety
from tests.workflows import mark, marks


def _ledgered(state: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    mark(f"{state['token']}-ledger", f"start {started!r} {state.get('label', '')}")
    time.sleep(float(state.get("nap", 0.2)))
    ended = time.time()
    mark(f"{state['token']}-ledger", f"end {started!r} {ended!r} {state.get('label', '')}")
    return {"ran_for": round(ended - started, 4)}


def ledgered(state: dict[str, Any]) -> dict[str, Any]:
    """Sleeps ``state['nap']`` seconds (default 0.2), recording its start and end."""
    return _ledgered(state)


class CallModel(queuety.Step):
    """The issue's example: a step of the shared ``openai`` group, limit 2 in the tests."""

    concurrency_group = "openai-test"
    concurrency_limit = 2
    cost_units = 1

    def handle(self, state: dict[str, Any]) -> dict[str, Any]:
        return _ledgered(state)


def intervals(token: str) -> list[tuple[float, float, str]]:
    """``(start, end, label)`` of every finished step of ``token``, by start."""
    found = []
    for line in marks(f"{token}-ledger"):
        parts = line.split()
        if parts[1] == "end":
            found.append((float(parts[2]), float(parts[3]), parts[4] if len(parts) > 4 else ""))
    return sorted(found)


def starts(token: str) -> list[tuple[float, int, str]]:
    """``(time, pid, label)`` of every start of ``token``, finished or not, by time."""
    found = []
    for line in marks(f"{token}-ledger"):
        parts = line.split()
        if parts[1] == "start":
            found.append((float(parts[2]), int(parts[0]), parts[3] if len(parts) > 3 else ""))
    return sorted(found)


def peak(spans: list[tuple[float, float, str]], label: str | None = None) -> int:
    """Most steps running at one moment (of ``label`` only, when given)."""
    mine = [(start, end) for start, end, own in spans if label is None or own == label]
    # An end sorts before a start at the same instant: the slot was free by then.
    edges = sorted([(start, 1) for start, _ in mine] + [(end, -1) for _, end in mine])
    running = best = 0
    for _, change in edges:
        running += change
        best = max(best, running)
    return best


def max_in_window(times: list[float], window: float) -> int:
    """Most of ``times`` inside any half-open window of ``window`` seconds."""
    times = sorted(times)
    best, first = 0, 0
    for last, moment in enumerate(times):
        while moment - times[first] >= window:
            first += 1
        best = max(best, last - first + 1)
    return best
