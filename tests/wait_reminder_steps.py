"""Steps and callables of the wait-reminder, workflow-timeout and delay_until tests (imported
by the worker)."""

from __future__ import annotations

from datetime import datetime


def note(state):
    return {"noted": True}


def when_from_state(state):
    """The time ``state['at']`` names (ISO 8601, with its offset)."""
    return datetime.fromisoformat(state["at"])


def naive_when(state):
    """A time with no zone: refused when the run reaches the delay_until step."""
    return datetime.fromisoformat(state["at"]).replace(tzinfo=None)
