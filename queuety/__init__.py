"""Queuety for Django: durable workflows whose steps run on Celery workers.

The public API::

    import queuety

    run_id = queuety.workflow("order").then(Validate).then(charge_card).dispatch({"id": 7})
    queuety.workflow_status(run_id).status     # "running", "completed", "failed", ...

Importing this package does not import Django; the functions that touch the database import
the service layer when called.
"""

from __future__ import annotations


from queuety.core.builder import WorkflowBuilder, workflow
from queuety.core.handlers import Step
from queuety.core.retry import RetryPolicy
from queuety.core.status import WorkflowStatus
from queuety.core.budget import Budget, BudgetView
from queuety.core.handlers import StepContext
from queuety.exceptions import (
    AlreadyAnswered,
    BudgetExceeded,
    IdempotencyConflict,
    InvalidSignalData,
    InvalidStepOutput,
    PermanentError,
    QueuetyError,
    RunNotFound,
    RunNotWaiting,
    StepTimeout,
    UnknownStep,
    WorkerLost,
    WorkflowDefinitionError,
)

__all__ = [
    "AlreadyAnswered",
    "Budget",
    "BudgetExceeded",
    "BudgetView",
    "IdempotencyConflict",
    "InvalidSignalData",
    "InvalidStepOutput",
    "PermanentError",
    "QueuetyError",
    "RetryPolicy",
    "RunNotFound",
    "RunNotWaiting",
    "Step",
    "StepContext",
    "StepTimeout",
    "UnknownStep",
    "WorkerLost",
    "WorkflowBuilder",
    "WorkflowDefinitionError",
    "WorkflowStatus",
    "approve",
    "list_workflows",
    "reject",
    "signal",
    "submit_input",
    "workflow",
    "workflow_status",
]

__version__ = "0.1.0"


def workflow_status(run_id: int) -> WorkflowStatus:
    """Return a :class:`WorkflowStatus` snapshot of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
    """
    from queuety import services

    return services.workflow_status(run_id)


def list_workflows(status: str | None = None, limit: int = 50) -> list[WorkflowStatus]:
    """Return up to ``limit`` runs, newest first, optionally only those with ``status``."""
    from queuety import services

    return services.list_workflows(status=status, limit=limit)


def signal(run_id: int, name: str, data=None):
    """Send signal ``name`` with JSON ``data`` to run ``run_id``; return a receipt.

    A signal sent before its wait is reached is kept until the wait consumes it.

    Raises:
        RunNotFound, RunNotWaiting, InvalidSignalData, BudgetExceeded: nothing is recorded.
    """
    from queuety import services

    return services.send_signal(run_id, name, data)


def approve(run_id: int, data=None, *, signal: str | None = None):
    """Approve the run's current ``wait_for_approval()`` or ``wait_for_decision()``.

    Raises:
        RunNotWaiting: the run is not waiting for an approval (``AlreadyAnswered`` if its
            wait was answered already).
    """
    from queuety import services

    return services.reply(run_id, "approve", data, signal=signal)


def reject(run_id: int, data=None, *, signal: str | None = None):
    """Reject the run's current ``wait_for_decision()``."""
    from queuety import services

    return services.reply(run_id, "reject", data, signal=signal)


def submit_input(run_id: int, data=None, *, signal: str | None = None):
    """Answer the run's current ``wait_for_input()``; ``data`` must match its schema as sent.

    Raises:
        InvalidSignalData: ``errors`` lists each failing path; the run keeps waiting.
    """
    from queuety import services

    return services.reply(run_id, "input", data, signal=signal)
