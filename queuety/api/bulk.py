"""``POST runs/bulk/``, ``GET runs/bulk/<id>/`` and ``POST runs/bulk/<id>/cancel/``: bulk
actions by filter, thin over ``queuety.bulk_actions``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from queuety import bulk_actions, exceptions, queries
from queuety.api import exceptions as api_errors
from queuety.api import serializers
from queuety.api.views import ERRORS, IDEMPOTENCY_KEY, RunAPIView, read_json_body, replayable
from queuety.models import BulkOperation

BULK_ID = OpenApiParameter(
    "id", {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}, OpenApiParameter.PATH,
    description="The bulk operation's id.")
#: The filter keys ``POST runs/bulk/`` takes: ``GET runs/``'s.
QUERY_KEYS = ("status", "workflow", "version", "waiting", "definition", "older_than",
              "error_type", "tag")
#: The action arguments the API takes (migrate's ``state`` function is not among them: an
#: API request may not name code for a worker to import).
API_ARGUMENTS = ("step", "to", "step_map")


def _invalid(message: str) -> api_errors.QueuetyAPIError:
    return api_errors.QueuetyAPIError(message, "invalid_request", status.HTTP_400_BAD_REQUEST)


def filter_of(query: dict[str, Any]) -> dict[str, Any]:
    """The runs list's query keys as ``bulk_actions.start`` takes them (``older_than``
    parsed, ``tag`` ``key:value`` items as ``tags``).

    Raises:
        ValueError: an unknown key or a bad value, saying what is accepted.
    """
    unknown = sorted(set(query) - set(QUERY_KEYS))
    if unknown:
        raise ValueError(f"Unknown filter key(s) {', '.join(unknown)}; use the runs list's: "
                         f"{', '.join(QUERY_KEYS)}.")
    found: dict[str, Any] = {}
    for key in ("status", "workflow", "version", "waiting", "definition", "error_type"):
        value = query.get(key)
        if value is not None and not isinstance(value, str | int) or isinstance(value, bool):
            raise ValueError(f"The filter's {key} must be a string (got {value!r:.80}).")
        if value is not None:
            found[key] = str(value)
    older = query.get("older_than")
    if older is not None:
        found["older_than"] = queries.parse_age(str(older))
    tags = query.get("tag")
    if tags is not None:
        items = [tags] if isinstance(tags, str) else tags
        if not isinstance(items, list) or not all(isinstance(t, str) and ":" in t
                                                  for t in items):
            raise ValueError("The filter's tag must be key:value, or a list of them (got "
                             f"{tags!r:.80}).")
        found["tags"] = dict(item.split(":", 1) for item in items)
    return found


def visible_operation(request: Request, op_id: int) -> BulkOperation:
    """Operation ``op_id`` as this user may see it (``bulk_actions.operations_of``: with a
    ``RUN_SCOPE`` or ``RUN_ACCESS``, only one they requested; another's is answered as
    missing: its filter and counts are of runs they may not see)."""
    op = bulk_actions.operations_of(request.user).filter(pk=op_id).first()
    if op is None:
        raise exceptions.BulkOperationNotFound(op_id)
    return op


def _actor(request: Request) -> str:
    return f"api:user:{request.user.pk}:{request.user.get_username()}"


@extend_schema(request=serializers.BulkRequestSerializer, parameters=[IDEMPOTENCY_KEY],
               responses={202: serializers.BulkProgressSerializer,
                          200: serializers.BulkProgressSerializer, **ERRORS})
class BulkView(RunAPIView):
    """``POST runs/bulk/``: act on every run a filter matches, within the user's scope, as a
    durable operation (202 with its progress); a dry run counts them and changes nothing
    (200, ``matched``)."""

    required_permissions = {"POST": "queuety.change_workflowrun"}

    def post(self, request: Request) -> Response:
        return replayable(request, lambda: self._start(request))

    def _start(self, request: Request) -> Response:
        body = read_json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("action"), str):
            raise _invalid('The request body must be a JSON object: {"action": "cancel", '
                           '"filter": {...}, "dry_run": false}.')
        extra = sorted(set(body) - {"action", "filter", "dry_run", "arguments"})
        query, arguments = body.get("filter") or {}, body.get("arguments") or {}
        if extra or not isinstance(query, dict) or not isinstance(arguments, dict) \
                or not isinstance(body.get("dry_run", False), bool):
            raise _invalid("A bulk request has action, filter (an object of the runs list's "
                           "query keys), dry_run (true or false) and arguments (an object)"
                           + (f"; unknown field(s) {', '.join(extra)}." if extra else "."))
        unknown = sorted(set(arguments) - set(API_ARGUMENTS))
        if unknown:
            raise _invalid(f"Unknown argument(s) {', '.join(unknown)}; the API takes "
                           f"{', '.join(API_ARGUMENTS)}.")
        try:
            progress = bulk_actions.start(body["action"], filter_of(query), arguments,
                                          dry_run=body.get("dry_run", False),
                                          user=request.user, actor=_actor(request))
        except ValueError as error:
            raise _invalid(str(error)) from None
        except exceptions.UnknownDefinition as error:
            if str(query.get("definition")) != str(error.ref):
                raise  # migrate's target: the definition_not_found 404
            # A filter value that names nothing: a bad filter (400), as GET runs/ answers it.
            raise api_errors.QueuetyAPIError(str(error), "invalid_filter",
                                             status.HTTP_400_BAD_REQUEST) from None
        return Response(progress.to_dict(), status=status.HTTP_200_OK if progress.dry_run
                        else status.HTTP_202_ACCEPTED)


@extend_schema(parameters=[BULK_ID], responses={200: serializers.BulkProgressSerializer,
                                                **ERRORS})
class BulkDetailView(RunAPIView):
    """``GET runs/bulk/<id>/``: a bulk operation's progress and audit record."""

    required_permissions = {"GET": "queuety.view_workflowrun"}

    def get(self, request: Request, pk: int) -> Response:
        return Response(bulk_actions.progress_of(visible_operation(request, pk)).to_dict())


@extend_schema(parameters=[BULK_ID, IDEMPOTENCY_KEY], request=None,
               responses={200: serializers.BulkProgressSerializer, **ERRORS})
class BulkCancelView(RunAPIView):
    """``POST runs/bulk/<id>/cancel/``: stop a bulk operation (runs acted on stay so)."""

    required_permissions = {"POST": "queuety.change_workflowrun"}

    def post(self, request: Request, pk: int) -> Response:
        visible_operation(request, pk)
        return replayable(request, lambda: Response(bulk_actions.cancel(pk).to_dict()))
