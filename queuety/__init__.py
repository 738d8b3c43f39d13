"""Queuety for Django: durable workflows whose steps run on Celery workers.

The public API::

    import queuety

    run_id = queuety.workflow("order").then(Validate).then(charge_card).dispatch({"id": 7})
    queuety.workflow_status(run_id).status     # "running", "completed", "failed", ...

Importing this package does not import Django; the functions that touch the database import
the modules that do the work (``queuety.queries``, ``inbox``, ``operations``, ``timeline``,
``export``) when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from queuety.core.budget import Budget, BudgetView
from queuety.core.builder import WorkflowBuilder, workflow
from queuety.core.engine import DEFAULT, Route
from queuety.core.handlers import Step, StepContext
from queuety.core.retry import RetryPolicy
from queuety.core.status import WorkflowStatus
from queuety.exceptions import (
    AlreadyAnswered,
    BudgetExceeded,
    ChildRunFailed,
    IdempotencyConflict,
    InvalidSignalData,
    InvalidStepOutput,
    InvalidTransition,
    PermanentError,
    QueuetyError,
    RunNotFound,
    RunNotWaiting,
    StepTimeout,
    UnknownStep,
    UnmatchedRoute,
    WorkerLost,
    WorkflowDefinitionError,
    WorkflowWaitFailed,
)

__all__ = [
    "DEFAULT",
    "AlreadyAnswered",
    "Budget",
    "BudgetExceeded",
    "BudgetView",
    "ChildRunFailed",
    "IdempotencyConflict",
    "InvalidSignalData",
    "InvalidStepOutput",
    "InvalidTransition",
    "PermanentError",
    "QueuetyError",
    "RetryPolicy",
    "Route",
    "RunNotFound",
    "RunNotWaiting",
    "Step",
    "StepContext",
    "StepTimeout",
    "UnknownStep",
    "UnmatchedRoute",
    "WorkerLost",
    "WorkflowBuilder",
    "WorkflowDefinitionError",
    "WorkflowStatus",
    "WorkflowWaitFailed",
    "approve",
    "cancel",
    "export_workflow",
    "fork",
    "list_workflows",
    "pause",
    "reject",
    "replay_workflow",
    "resource_groups",
    "resume",
    "retry",
    "rewind",
    "signal",
    "submit_input",
    "workflow",
    "workflow_state_at",
    "workflow_status",
    "workflow_timeline",
]

if TYPE_CHECKING:  # for annotations only: importing it would import Django
    from queuety.inbox import SignalReceipt

__version__ = "0.1.0"


def workflow_status(run_id: int) -> WorkflowStatus:
    """Return a :class:`WorkflowStatus` snapshot of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
    """
    from queuety import queries

    return queries.workflow_status(run_id)


def list_workflows(status: str | None = None, limit: int = 50) -> list[WorkflowStatus]:
    """Return up to ``limit`` runs, newest first, optionally only those with ``status``."""
    from queuety import queries

    return queries.list_workflows(status=status, limit=limit)


def resource_groups() -> list[dict[str, Any]]:
    """Every concurrency group with a step in flight or waiting: ``group``, ``in_flight``,
    ``limit``, ``waiting``, ``woken``, ``running_cost``, ``cost_budget``, ``rate_limit`` and
    ``recent_starts`` (docs/guide/resources.md)."""
    from queuety import queries

    return queries.resource_groups()


def signal(run_id: int, name: str, data: Any = None) -> SignalReceipt:
    """Send signal ``name`` with JSON ``data`` to run ``run_id``; return a receipt.

    A signal sent before its wait is reached is kept until the wait consumes it.

    Raises:
        RunNotFound, RunNotWaiting, InvalidSignalData, BudgetExceeded: nothing is recorded.
    """
    from queuety import inbox

    return inbox.send_signal(run_id, name, data)


def approve(run_id: int, data: Any = None, *, signal: str | None = None) -> SignalReceipt:
    """Approve the run's current ``wait_for_approval()`` or ``wait_for_decision()``.

    Raises:
        RunNotWaiting: the run is not waiting for an approval (``AlreadyAnswered`` if its
            wait was answered already).
    """
    from queuety import inbox

    return inbox.reply(run_id, "approve", data, signal=signal)


def reject(run_id: int, data: Any = None, *, signal: str | None = None) -> SignalReceipt:
    """Reject the run's current ``wait_for_decision()``."""
    from queuety import inbox

    return inbox.reply(run_id, "reject", data, signal=signal)


def submit_input(run_id: int, data: Any = None, *, signal: str | None = None) -> SignalReceipt:
    """Answer the run's current ``wait_for_input()``; ``data`` must match its schema as sent.

    Raises:
        InvalidSignalData: ``errors`` lists each failing path; the run keeps waiting.
    """
    from queuety import inbox

    return inbox.reply(run_id, "input", data, signal=signal)


def cancel(run_id: int) -> None:
    """Cancel a run; its compensations and ``on_cancel`` handler then run durably.

    Raises:
        InvalidTransition: the run is already completed or cancelled.
    """
    from queuety import operations

    operations.cancel(run_id)


def pause(run_id: int) -> None:
    """Pause a running or waiting run (a step in flight finishes; nothing new starts)."""
    from queuety import operations

    operations.pause(run_id)


def resume(run_id: int) -> str:
    """Resume a paused run where it stands; return its new status."""
    from queuety import operations

    return operations.resume(run_id)


def retry(run_id: int) -> None:
    """Run a failed run again from its failed step, keeping earlier outputs."""
    from queuety import operations

    operations.retry(run_id)


def rewind(run_id: int, step: int | str) -> None:
    """Go back to the state recorded right after ``step`` and continue from the next step."""
    from queuety import operations

    operations.rewind(run_id, step)


def fork(run_id: int) -> int:
    """Start a new run from this run's current state and step; return its id."""
    from queuety import operations

    return operations.fork(run_id)


def workflow_timeline(run_id: int, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
    """Return the run's events, oldest first."""
    from queuety import timeline

    return timeline.timeline(run_id, limit, offset)


def workflow_state_at(run_id: int, step: int | str) -> dict[str, Any]:
    """Return the public state right after ``step`` (index or name) last completed."""
    from queuety import timeline

    return timeline.state_at(run_id, step)


def export_workflow(run_id: int) -> dict[str, Any]:
    """Return the run as a versioned JSON document (``format_version`` 1)."""
    from queuety import export

    return export.export(run_id)


def replay_workflow(document: Any) -> int:
    """Start a run that continues where an exported one stood; return its id."""
    from queuety import export

    return export.replay(document)
