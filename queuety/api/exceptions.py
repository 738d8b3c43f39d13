"""Domain errors mapped to HTTP answers, in one place."""

from __future__ import annotations

from rest_framework import status
from rest_framework.exceptions import APIException, ErrorDetail

from queuety import exceptions


class QueuetyAPIError(APIException):
    """An API error whose body may carry more than ``detail`` and ``code``."""

    # APIException stores a str detail as one ErrorDetail (with its code), never as the list
    # or dict it allows for validation errors.
    detail: ErrorDetail

    def __init__(self, detail: str, code: str, http_status: int, **extra: object) -> None:
        super().__init__(detail=detail, code=code)
        self.status_code = http_status
        self.extra = extra


def translate(error: Exception) -> QueuetyAPIError:
    """Return the API error for a domain error raised by the service layer."""
    if isinstance(error, exceptions.RunNotFound):
        return QueuetyAPIError(str(error), "run_not_found", status.HTTP_404_NOT_FOUND)
    if isinstance(error, exceptions.WaitExpired):
        return QueuetyAPIError(str(error), "wait_expired", status.HTTP_409_CONFLICT)
    if isinstance(error, exceptions.AlreadyAnswered):
        return QueuetyAPIError(str(error), "already_answered", status.HTTP_409_CONFLICT)
    if isinstance(error, exceptions.RunNotWaiting):
        return QueuetyAPIError(str(error), "run_not_waiting", status.HTTP_409_CONFLICT)
    if isinstance(error, exceptions.BudgetExceeded):
        return QueuetyAPIError(str(error), "budget_exceeded", status.HTTP_409_CONFLICT,
                               budget=error.budget, limit=error.limit, used=error.used)
    if isinstance(error, exceptions.InvalidSignalData):
        if error.too_large:
            return QueuetyAPIError(str(error), "payload_too_large",
                                   status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        return QueuetyAPIError(str(error), "invalid_payload", status.HTTP_400_BAD_REQUEST,
                               errors=error.errors)
    if isinstance(error, exceptions.IdempotencyConflict):
        return QueuetyAPIError(str(error), "idempotency_conflict", status.HTTP_409_CONFLICT)
    if isinstance(error, exceptions.InvalidTransition):
        return QueuetyAPIError(str(error), "invalid_transition", status.HTTP_409_CONFLICT)
    if isinstance(error, exceptions.UnknownWorkflow):
        return QueuetyAPIError(str(error), "unknown_workflow", status.HTTP_400_BAD_REQUEST,
                               known=list(error.known))
    if isinstance(error, exceptions.InvalidPayload):
        return QueuetyAPIError(str(error), "invalid_payload", status.HTTP_400_BAD_REQUEST)
    if isinstance(error, exceptions.ArtifactNotFound):
        return QueuetyAPIError(str(error), "artifact_not_found", status.HTTP_404_NOT_FOUND)
    if isinstance(error, exceptions.InvalidArtifact):
        if error.too_large:
            return QueuetyAPIError(str(error), "artifact_too_large",
                                   status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        return QueuetyAPIError(str(error), "invalid_artifact", status.HTTP_400_BAD_REQUEST)
    if isinstance(error, exceptions.UnknownStep):
        return QueuetyAPIError(str(error), "step_not_found", status.HTTP_404_NOT_FOUND)
    if isinstance(error, exceptions.WorkflowDefinitionError):
        # The run's stored definition no longer loads (a deploy removed code it names):
        # nothing can move it until that is fixed, and nothing was written.
        return QueuetyAPIError(str(error), "definition_unloadable", status.HTTP_409_CONFLICT)
    raise error
