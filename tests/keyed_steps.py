"""Step handlers and workflows of the keyed-run tests (tests/integration/test_keyed_runs.py):
importable by the worker."""

from __future__ import annotations

import queuety


def note(state):
    """Record that the first step ran (its claim time is on its step row)."""
    return {"noted": True}


def after(state):
    """The step after the gate."""
    return {"after": True}


def undo(state):
    """A compensation: records nothing, its completed row is what the tests read."""
    return None


def gated(name: str) -> queuety.WorkflowBuilder:
    """A task step (compensated), then a wait for ``finish``, then a task: live until told."""
    return (queuety.workflow(name).then(note).compensate_with(undo)
            .wait_for_signal("finish").then(after))


def inbox(name: str) -> queuety.WorkflowBuilder:
    """Parks at a wait for ``event`` at once, then at one for ``close``: signal_or_start's
    target, live until closed."""
    return (queuety.workflow(name).wait_for_signal("event").wait_for_signal("close")
            .then(after))


def plain(name: str) -> queuety.WorkflowBuilder:
    """One task step: the debounced and batched workflows."""
    return queuety.workflow(name).then(note)
