"""Django signals for what runs do: started, completed, failed, cancelled, waiting, a step
attempt failed, a budget exceeded, throttled.

Each is sent once per event, after the transaction that caused it commits (nothing is sent
for a transaction that rolls back), with ``sender=WorkflowRun`` and keyword arguments named in
:data:`EVENTS`. A receiver that raises is logged and never breaks the engine::

    from queuety.signals import run_failed

    @receiver(run_failed)
    def page_someone(sender, run_id, workflow, error, **kwargs): ...

Sending costs nothing while no receiver is connected and no webhook endpoint listens for the
event: the engine asks :func:`wanted` first, so an unobserved event adds no work, no query and
no callback. Arguments are taken from what the transaction that caused the event already holds
(no extra query on the step boundary).

To add an event: a :class:`django.dispatch.Signal` below, a row of :data:`EVENTS`, a call to
:func:`emit` where it happens, and a line in ``docs/guide/observability.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger("queuety")

run_started = Signal()
run_completed = Signal()
run_failed = Signal()
run_cancelled = Signal()
run_waiting = Signal()
step_failed = Signal()
budget_exceeded = Signal()
run_throttled = Signal()


@dataclass(frozen=True, slots=True)
class EventKind:
    """One observable event: its signal, its webhook event name and the arguments it carries
    (besides ``sender``, always ``WorkflowRun``)."""

    signal: Signal
    webhook: str
    arguments: tuple[str, ...]


#: Every event, by signal name: the one table the signals, the webhooks and the docs follow.
EVENTS: dict[str, EventKind] = {
    "run_started": EventKind(run_started, "run.started", ("run_id", "workflow", "version")),
    "run_completed": EventKind(run_completed, "run.completed",
                               ("run_id", "workflow", "version")),
    "run_failed": EventKind(run_failed, "run.failed", ("run_id", "workflow", "error")),
    "run_cancelled": EventKind(run_cancelled, "run.cancelled",
                               ("run_id", "workflow", "actor", "previous_status")),
    "run_waiting": EventKind(run_waiting, "run.waiting",
                             ("run_id", "workflow", "step", "waiting_for", "kind")),
    "step_failed": EventKind(step_failed, "step.failed", (
        "run_id", "workflow", "step", "step_run_id", "attempt", "max_attempts", "error",
        "will_retry", "retry_in")),
    "budget_exceeded": EventKind(budget_exceeded, "budget.exceeded",
                                 ("run_id", "workflow", "budget", "limit", "used", "step")),
    "run_throttled": EventKind(run_throttled, "run.throttled",
                               ("run_id", "workflow", "step", "reason")),
}

#: Webhook event name -> signal name.
BY_WEBHOOK: dict[str, str] = {kind.webhook: name for name, kind in EVENTS.items()}

#: Called in the event's transaction with (signal name, arguments): the webhook outbox writes
#: its durable delivery rows there. Each tells :func:`wanted` whether it wants an event.
_Sink = tuple[Callable[[str], bool], Callable[[str, dict[str, Any]], None]]
_sinks: list[_Sink] = []


def add_sink(wants: Callable[[str], bool], write: Callable[[str, dict[str, Any]], None]
             ) -> None:
    """Have ``write(name, arguments)`` called in the transaction of each event ``wants(name)``
    accepts (the webhook outbox: its rows must commit or roll back with the event)."""
    _sinks.append((wants, write))


def wanted(name: str) -> bool:
    """Whether event ``name`` has a receiver or a sink that wants it (else :func:`emit`
    would do nothing, and a caller may skip computing its arguments)."""
    if EVENTS[name].signal.receivers:
        return True
    return any(wants(name) for wants, _ in _sinks)


def sinks_want(name: str) -> bool:
    """Whether a sink (the webhook outbox) wants event ``name``: its rows must then be written
    in the event's transaction, so a one-statement fast path takes a transaction instead."""
    return any(wants(name) for wants, _ in _sinks)


def emit(name: str, **arguments: Any) -> None:
    """Record event ``name``: sinks write now, in the current transaction; receivers get the
    signal once it commits (at once outside a transaction, which has then committed).

    Raises:
        KeyError: ``name`` is not in :data:`EVENTS` (a programming error).
    """
    kind = EVENTS[name]
    for wants, write in _sinks:
        if wants(name):
            write(name, arguments)
    if kind.signal.receivers:
        transaction.on_commit(partial(_send, name, arguments), robust=True)


def emit_to_receivers(name: str, **arguments: Any) -> None:
    """:func:`emit` without the sinks: for an event whose transaction committed although its
    answer was lost, so its sinks' rows (the webhook deliveries) are already stored, but
    receivers were never sent it (on-commit callbacks do not run when the commit raises)."""
    if EVENTS[name].signal.receivers:
        transaction.on_commit(partial(_send, name, arguments), robust=True)


def _send(name: str, arguments: dict[str, Any]) -> None:
    from queuety.models import WorkflowRun  # the sender; imported late, as signals load early

    for receiver, result in EVENTS[name].signal.send_robust(WorkflowRun, **arguments):
        if isinstance(result, Exception):
            logger.error("Receiver %s of queuety signal %s raised %s: %s (run id=%s); the run "
                         "is not affected.", getattr(receiver, "__qualname__", receiver), name,
                         type(result).__name__, result, arguments.get("run_id"),
                         exc_info=result)
