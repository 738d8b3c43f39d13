"""Django signals for what runs do: started, completed, failed, cancelled, waiting, reminded
at a wait, a step attempt failed, a budget exceeded, throttled.

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

Jobs (Django tasks run by ``queuety.tasks_backend``, runs of workflows named ``task:...``) have
events of their own, ``job_completed``, ``job_failed`` and ``job_buried``, derived from their
run's: :func:`emit` of ``run_completed``, ``step_failed`` (an attempt that will be retried) or
``run_failed`` for a job's run emits the job's event too (see :data:`JOB_EVENTS`). So they are
sent wherever the run's are, an operator's bury (which fails the run) included, and a run
that is no job pays one string comparison.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from queuety import instruments
from queuety.conf import settings

logger = logging.getLogger("queuety")

run_started = Signal()
run_completed = Signal()
run_failed = Signal()
run_cancelled = Signal()
run_waiting = Signal()
run_reminder = Signal()
step_failed = Signal()
budget_exceeded = Signal()
run_throttled = Signal()
job_completed = Signal()
job_failed = Signal()
job_buried = Signal()


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
    "run_reminder": EventKind(run_reminder, "wait.reminder", (
        "run_id", "workflow", "step", "kind", "count", "waited_seconds")),
    "step_failed": EventKind(step_failed, "step.failed", (
        "run_id", "workflow", "step", "step_run_id", "attempt", "max_attempts", "error",
        "will_retry", "retry_in")),
    "budget_exceeded": EventKind(budget_exceeded, "budget.exceeded",
                                 ("run_id", "workflow", "budget", "limit", "used", "step")),
    "run_throttled": EventKind(run_throttled, "run.throttled",
                               ("run_id", "workflow", "step", "reason")),
    # Jobs: derived from their runs' events (JOB_EVENTS), never emitted directly.
    "job_completed": EventKind(job_completed, "job.completed",
                               ("result_id", "run_id", "task")),
    "job_failed": EventKind(job_failed, "job.failed", (
        "result_id", "run_id", "task", "attempt", "max_attempts", "error", "retry_in")),
    "job_buried": EventKind(job_buried, "job.buried",
                            ("result_id", "run_id", "task", "error")),
}

#: What a job's workflow name starts with (``queuety.jobs.specs.PREFIX``, which sits above
#: this module; a unit test keeps the two equal).
JOB_PREFIX = "task:"

#: Run event -> the job event it implies for a job's run.
JOB_EVENTS: dict[str, str] = {"run_completed": "job_completed", "step_failed": "job_failed",
                              "run_failed": "job_buried"}

#: Job event -> how its metric counts it (``queuety_jobs_total{outcome}``).
JOB_OUTCOMES: dict[str, str] = {"job_completed": "completed", "job_failed": "failed",
                                "job_buried": "buried"}

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


def wanted(name: str, workflow: str | None = None) -> bool:
    """Whether event ``name`` has a receiver or a sink that wants it (else :func:`emit`
    would do nothing, and a caller may skip computing its arguments). For a run of
    ``workflow`` that is a job's, the job event it implies counts too (and the job metrics,
    while ``METRICS`` is on); ``workflow=None`` (not known) counts it for any run."""
    if EVENTS[name].signal.receivers or any(wants(name) for wants, _ in _sinks):
        return True
    job = _job_event_of(name, workflow)
    return job is not None and (settings.METRICS or bool(EVENTS[job].signal.receivers)
                                or any(wants(job) for wants, _ in _sinks))


def sinks_want(name: str, workflow: str | None = None) -> bool:
    """Whether a sink (the webhook outbox) wants event ``name`` (or, for a run of
    ``workflow`` that is a job's, the job event it implies): its rows must then be written
    in the event's transaction, so a one-statement fast path takes a transaction instead."""
    job = _job_event_of(name, workflow)
    return any(wants(name) or (job is not None and wants(job)) for wants, _ in _sinks)


def is_job_workflow(workflow: str) -> bool:
    """Whether runs of ``workflow`` are jobs."""
    return workflow.startswith(JOB_PREFIX)


def _job_event_of(name: str, workflow: str | None) -> str | None:
    """The job event run event ``name`` may imply for a run of ``workflow`` (None: any)."""
    if workflow is not None and not is_job_workflow(workflow):
        return None
    return JOB_EVENTS.get(name)


def job_event(name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The job event (name and arguments) that run event ``name`` with ``arguments`` implies,
    or None: the run is no job's, or the event implies none (an attempt out of retries sends
    ``step_failed`` with ``will_retry`` false; the job's ``job_buried`` comes with its
    ``run_failed``)."""
    workflow = arguments.get("workflow")
    job = JOB_EVENTS.get(name)
    if job is None or not isinstance(workflow, str) or not is_job_workflow(workflow):
        return None
    run_id = arguments.get("run_id")
    found: dict[str, Any] = {"result_id": str(run_id), "run_id": run_id,
                             "task": workflow[len(JOB_PREFIX):]}
    if name == "step_failed":
        if not arguments.get("will_retry"):
            return None
        found.update(attempt=arguments.get("attempt"),
                     max_attempts=arguments.get("max_attempts"),
                     error=arguments.get("error"), retry_in=arguments.get("retry_in"))
    elif name == "run_failed":
        found["error"] = arguments.get("error")
    return job, found


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
    job = job_event(name, arguments)
    if job is not None:
        emit(job[0], **job[1])
        _count_job(job[0], job[1]["task"])


def emit_to_receivers(name: str, **arguments: Any) -> None:
    """:func:`emit` without the sinks: for an event whose transaction committed although its
    answer was lost, so its sinks' rows (the webhook deliveries) are already stored, but
    receivers were never sent it (on-commit callbacks do not run when the commit raises)."""
    if EVENTS[name].signal.receivers:
        transaction.on_commit(partial(_send, name, arguments), robust=True)
    job = job_event(name, arguments)
    if job is not None:
        emit_to_receivers(job[0], **job[1])
        # The lost answer's on-commit callbacks never ran: the job is counted here.
        _count_job(job[0], job[1]["task"])


def _count_job(name: str, task: str) -> None:
    """Count job event ``name`` of ``task`` in the job metrics once this transaction
    commits (a rolled-back outcome counts nothing)."""
    if settings.METRICS:
        transaction.on_commit(partial(instruments.job_finished, task, JOB_OUTCOMES[name]),
                              robust=True)


def _send(name: str, arguments: dict[str, Any]) -> None:
    from queuety.models import WorkflowRun  # the sender; imported late, as signals load early

    for receiver, result in EVENTS[name].signal.send_robust(WorkflowRun, **arguments):
        if isinstance(result, Exception):
            logger.error("Receiver %s of queuety signal %s raised %s: %s (run id=%s); the run "
                         "is not affected.", getattr(receiver, "__qualname__", receiver), name,
                         type(result).__name__, result, arguments.get("run_id"),
                         exc_info=result)
