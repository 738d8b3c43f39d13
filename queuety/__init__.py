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
    BudgetExceeded,
    IdempotencyConflict,
    InvalidStepOutput,
    PermanentError,
    QueuetyError,
    RunNotFound,
    StepTimeout,
    UnknownStep,
    WorkerLost,
    WorkflowDefinitionError,
)

__all__ = [
    "Budget",
    "BudgetExceeded",
    "BudgetView",
    "IdempotencyConflict",
    "InvalidStepOutput",
    "PermanentError",
    "QueuetyError",
    "RetryPolicy",
    "RunNotFound",
    "Step",
    "StepContext",
    "StepTimeout",
    "UnknownStep",
    "WorkerLost",
    "WorkflowBuilder",
    "WorkflowDefinitionError",
    "WorkflowStatus",
    "list_workflows",
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
