"""Domain errors mapped to HTTP answers, in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException, ErrorDetail

from queuety import exceptions, scope
from queuety.conf import settings


class QueuetyAPIError(APIException):
    """An API error whose body may carry more than ``detail`` and ``code``."""

    # APIException stores a str detail as one ErrorDetail (with its code), never as the list
    # or dict it allows for validation errors.
    detail: ErrorDetail

    def __init__(self, detail: str, code: str, http_status: int, **extra: object) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = http_status
        self.extra = extra


def _no_extra(error: Any) -> dict[str, object]:
    return {}


#: Each domain error's code, HTTP status and extra body, matched in this order (a subclass
#: before its base); the first class the error is an instance of answers.
_ANSWERS: tuple[tuple[type[Exception], str, int, Callable[[Any], dict[str, object]]], ...] = (
    (exceptions.RunNotFound, "run_not_found", status.HTTP_404_NOT_FOUND, _no_extra),
    (exceptions.BulkOperationNotFound, "bulk_operation_not_found", status.HTTP_404_NOT_FOUND,
     _no_extra),
    (exceptions.WaitExpired, "wait_expired", status.HTTP_409_CONFLICT, _no_extra),
    (exceptions.AlreadyAnswered, "already_answered", status.HTTP_409_CONFLICT, _no_extra),
    (exceptions.RunNotWaiting, "run_not_waiting", status.HTTP_409_CONFLICT, _no_extra),
    (exceptions.BudgetExceeded, "budget_exceeded", status.HTTP_409_CONFLICT,
     lambda e: {"budget": e.budget, "limit": e.limit, "used": e.used}),
    (exceptions.InvalidSignalData, "invalid_payload", status.HTTP_400_BAD_REQUEST,
     lambda e: {"errors": e.errors}),
    (exceptions.IdempotencyConflict, "idempotency_conflict", status.HTTP_409_CONFLICT,
     _no_extra),
    (exceptions.RunPurged, "run_purged", status.HTTP_409_CONFLICT,
     lambda e: {"key": e.key, "purged_at": e.purged_at}),
    (exceptions.RunConflict, "run_conflict", status.HTTP_409_CONFLICT,
     lambda e: {"key": e.key, "run_id": e.run_id}),
    (exceptions.InvalidTransition, "invalid_transition", status.HTTP_409_CONFLICT, _no_extra),
    (exceptions.UnknownWorkflow, "unknown_workflow", status.HTTP_400_BAD_REQUEST,
     lambda e: {"known": list(e.known)}),
    (exceptions.InvalidStateEdit, "invalid_state_edit", status.HTTP_400_BAD_REQUEST, _no_extra),
    (exceptions.InvalidPayload, "invalid_payload", status.HTTP_400_BAD_REQUEST, _no_extra),
    (exceptions.ArtifactNotFound, "artifact_not_found", status.HTTP_404_NOT_FOUND, _no_extra),
    (exceptions.InvalidArtifact, "invalid_artifact", status.HTTP_400_BAD_REQUEST, _no_extra),
    (exceptions.UnknownStep, "step_not_found", status.HTTP_404_NOT_FOUND, _no_extra),
    (exceptions.UnknownDefinition, "definition_not_found", status.HTTP_404_NOT_FOUND,
     _no_extra),
    (exceptions.InvalidMigration, "invalid_migration", status.HTTP_400_BAD_REQUEST, _no_extra),
    # The run's stored definition no longer loads (a deploy removed code it names): nothing
    # can move it until that is fixed, and nothing was written.
    (exceptions.WorkflowDefinitionError, "definition_unloadable", status.HTTP_409_CONFLICT,
     _no_extra),
)

#: The errors that say a body was too large, and their code then (HTTP 413, no extra body).
_TOO_LARGE: tuple[tuple[type[Exception], str], ...] = (
    (exceptions.InvalidSignalData, "payload_too_large"),
    (exceptions.InvalidArtifact, "artifact_too_large"),
)


def translate(error: Exception) -> QueuetyAPIError:
    """Return the API error for a domain error raised by the service layer; re-raise any
    other error."""
    if isinstance(error, exceptions.RunPurged) and settings.RUN_SCOPE is not None:
        # A purged run can no longer be checked against the caller's scope: a site with
        # tenants keeps the contract's code but is told no run id, workflow or date.
        return QueuetyAPIError(scope.purged_key(error.key), "run_purged",
                               status.HTTP_409_CONFLICT, key=error.key)
    for cls, code in _TOO_LARGE:
        if isinstance(error, cls) and getattr(error, "too_large", False):
            return QueuetyAPIError(str(error), code, status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    for cls, code, http_status, extra in _ANSWERS:
        if isinstance(error, cls):
            return QueuetyAPIError(str(error), code, http_status, **extra(error))
    raise error
