"""API views that start and steer runs, and list runs and registered workflows: thin over
``queuety.registry``, ``queuety.operations`` and ``queuety.queries``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from queuety import (
    exceptions,
    keyed,
    operations,
    quarantine,
    queries,
    registry,
    scope,
    state_edits,
)
from queuety.api import exceptions as api_errors
from queuety.api import serializers
from queuety.api.views import (
    ERRORS,
    IDEMPOTENCY_KEY,
    RUN_ID,
    RunAPIView,
    read_json_body,
    replayable,
)
from queuety.conf import settings
from queuety.core import tags as tag_rules
from queuety.core.keyed import Batch, FlowOptions, flow_options
from queuety.core.status import RunStatus
from queuety.masking import mask
from queuety.models import WorkflowRun
from queuety.store.definitions import find_definition


class RunCursorPagination(CursorPagination):
    """Newest first, by id: the cursor is an id, so a page is an index range scan however
    many runs there are (no OFFSET, no COUNT)."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


LIST_FILTERS = [
    OpenApiParameter("status", str, enum=[str(each) for each in RunStatus],
                     description="Only runs with this status."),
    OpenApiParameter("workflow", str, description="Only runs of this workflow (its name)."),
    OpenApiParameter("version", str, description="Only runs of definitions with this "
                                                 "version() label."),
    OpenApiParameter("waiting", str, description="true / false (waiting for anything or "
                                                 "not), or a kind of wait: approval, "
                                                 "decision, input, person (any of those "
                                                 "three), signal, workflows."),
    OpenApiParameter("tag", str, many=True, explode=True,
                     description="Only runs carrying this tag, as key:value (customer:42); "
                                 "repeat it for several, all of which must match."),
    OpenApiParameter("definition", str, description="Only runs of this definition: its id, "
                                                    "hash or a hash prefix (8 characters at "
                                                    "least)."),
    OpenApiParameter("older_than", str, description="Only runs created longer ago than this: "
                                                    "seconds, or a number with s, m, h, d or "
                                                    "w (7d, 12h)."),
    OpenApiParameter("error_type", str, description="Only runs whose recorded error is of "
                                                    "this exception type (ValueError, "
                                                    "myapp.errors.Declined)."),
    OpenApiParameter("cursor", str, description="The page: from a previous answer's next or "
                                                "previous link."),
    OpenApiParameter("page_size", int, description="Runs per page (default 50, at most 500)."),
]


class RunListSchema(AutoSchema):
    """``runs_list`` and ``runs_start``: drf-spectacular would name ``GET runs/`` like
    ``GET runs/<id>/`` (``runs_retrieve``), and an operation id in a class's @extend_schema
    is refused."""

    def get_operation_id(self) -> str:
        return "runs_list" if self.method == "GET" else "runs_start"


@extend_schema(methods=["GET"], parameters=LIST_FILTERS,
               responses={200: serializers.RunPageSerializer, **ERRORS})
@extend_schema(methods=["POST"], request=serializers.StartRunSerializer,
               parameters=[IDEMPOTENCY_KEY],
               responses={201: serializers.StartedRunSerializer,
                          200: serializers.StartedRunSerializer, **ERRORS})
class RunListView(RunAPIView):
    """``GET runs/``: runs newest first, cursor-paginated and filtered.
    ``POST runs/``: start a run of a registered workflow (201; 200 with ``"created": false``
    when ``idempotency_key`` had already started it)."""

    schema = RunListSchema()
    required_permissions = {"GET": "queuety.view_workflowrun",
                            "POST": "queuety.add_workflowrun"}

    def get(self, request: Request) -> Response:
        params = request.query_params
        try:
            older = params.get("older_than")
            runs = queries.runs_matching(
                status=params.get("status"), workflow=params.get("workflow"),
                version=params.get("version"), waiting=params.get("waiting"),
                definition=params.get("definition"), error_type=params.get("error_type"),
                older_than=None if older is None else queries.parse_age(older),
                tags=tag_rules.parse_filters(params.getlist("tag"), ":"))
        except (ValueError, exceptions.UnknownDefinition) as error:
            raise api_errors.QueuetyAPIError(str(error), "invalid_filter",
                                             status.HTTP_400_BAD_REQUEST) from None
        paginator = RunCursorPagination()
        # The scope in SQL, so a page is full and its cursor never passes another tenant's
        # runs; RUN_ACCESS then filters the page (which may hold fewer than its size).
        page = paginator.paginate_queryset(scope.scoped_runs(request.user, runs), request,
                                           view=self)
        assert page is not None  # always paginated
        allowed = [run for run in page
                   if all(p.has_object_permission(request, self, run)
                          for p in self.get_permissions())]
        return paginator.get_paginated_response(
            serializers.RunSummarySerializer([queries.run_summary(run) for run in allowed],
                                             many=True).data)

    def post(self, request: Request) -> Response:
        return replayable(request, lambda: self._start(request))

    def _start(self, request: Request) -> Response:
        body = read_json_body(request)
        if not isinstance(body, dict):
            raise ParseError("The request body must be a JSON object: "
                             '{"workflow": "...", "payload": {...}, "idempotency_key": "..."}.')
        unknown = sorted(set(body) - {"workflow", "payload", "idempotency_key", "tags",
                                      *FLOW_FIELDS})
        if unknown:
            raise api_errors.QueuetyAPIError(
                f"Unknown field(s) {', '.join(unknown)}; a run is started with workflow, "
                "payload, idempotency_key, tags and the flow-control fields "
                f"{', '.join(FLOW_FIELDS)}.", "invalid_request", status.HTTP_400_BAD_REQUEST)
        name = body.get("workflow")
        if not isinstance(name, str) or not name:
            raise api_errors.QueuetyAPIError(
                "The field workflow must name a registered workflow (GET workflows/ lists "
                "them).", "invalid_request", status.HTTP_400_BAD_REQUEST)
        key = body.get("idempotency_key")
        flow = _flow_of(name, body)
        if flow is not None:
            self._check_flow_owner(request, name, flow)
        try:
            # A key used for another workflow or payload is a 409, not that run's status.
            run_id, reused = registry.start_run(name, body.get("payload"),
                                                idempotency_key=key, on_conflict="error",
                                                flow=flow, tags=body.get("tags"))
        except exceptions.BudgetExceeded as error:  # the payload alone: bad input, not state
            raise api_errors.QueuetyAPIError(str(error), "budget_exceeded",
                                             status.HTTP_400_BAD_REQUEST, budget=error.budget,
                                             limit=error.limit, used=error.used) from None
        except exceptions.IdempotencyConflict as error:
            self._check_key_owner(request, key, error.run_id)
            raise
        except exceptions.RunConflict as error:
            if scope.find_run(request.user, error.run_id, "pk") is None:
                # Another tenant's live run: say the key is busy, name no run.
                raise api_errors.QueuetyAPIError(
                    f"A run of workflow {error.workflow!r} with key {error.key!r} is still "
                    "live; nothing was started.", "run_conflict",
                    status.HTTP_409_CONFLICT) from None
            raise
        if reused:
            if flow is None or flow.mode is None:
                self._check_key_owner(request, key, run_id)
            self.get_run(run_id)  # the original run is answered only to who may see it
        run = queries.workflow_status(run_id).to_dict()
        return Response({"created": not reused, "run": run},
                        status=status.HTTP_200_OK if reused else status.HTTP_201_CREATED)

    @staticmethod
    def _check_flow_owner(request: Request, name: str, flow: FlowOptions) -> None:
        """Refuse, before anything is written, a keyed start whose key has a live or pending
        run outside the user's scope: it would fold into, signal or replace another tenant's
        run. The answer names no run."""
        if any(scope.find_run(request.user, run_id, "pk") is None
               for run_id in keyed.live_runs(name, flow.key)):
            raise api_errors.QueuetyAPIError(
                f"A run of workflow {name!r} with key {flow.key!r} is still live; nothing was "
                "started. Use another key.", "run_conflict", status.HTTP_409_CONFLICT)

    @staticmethod
    def _check_key_owner(request: Request, key: str | None, run_id: int) -> None:
        hidden = scope.hidden_key(request.user, key, run_id)
        if hidden is not None:
            raise api_errors.QueuetyAPIError(hidden, "idempotency_key_taken",
                                             status.HTTP_409_CONFLICT)


#: The flow-control fields of ``POST runs/`` (``queuety.start()``'s keyword options).
FLOW_FIELDS = ("key", "debounce", "singleton", "on_conflict", "signal", "batch")


def _flow_of(name: str, body: dict[str, Any]) -> FlowOptions | None:
    """The checked flow-control options of a start request (InvalidPayload: a 400)."""
    batch = body.get("batch")
    if batch is not None:
        if not isinstance(batch, dict) or set(batch) - {"max_items", "max_wait"}:
            raise exceptions.InvalidPayload(
                'The field batch must be {"max_items": n, "max_wait": seconds} (got '
                f"{batch!r:.80}).")
        batch = Batch(**batch)
    return flow_options(name, key=body.get("key"), debounce=body.get("debounce"),
                        singleton=body.get("singleton", False),
                        on_conflict=body.get("on_conflict"),
                        signal=body.get("signal", "input"), batch=batch)


@extend_schema(parameters=[RUN_ID, IDEMPOTENCY_KEY], request=None,
               responses={200: serializers.WorkflowStatusSerializer, **ERRORS})
class RunActionView(RunAPIView):
    """``POST runs/<id>/cancel/``, ``pause/``, ``resume/``, ``retry/``: the CLI's lifecycle
    operations, with its state rules: a run whose status does not allow it is a 409."""

    action = ""
    required_permissions = {"POST": "queuety.change_workflowrun"}
    _OPERATIONS: dict[str, Any] = {"cancel": operations.cancel, "pause": operations.pause,
                                   "resume": operations.resume, "retry": operations.retry}

    def post(self, request: Request, pk: int) -> Response:
        self.get_run(pk)
        return replayable(request, lambda: self._act(request, pk))

    def _act(self, request: Request, pk: int) -> Response:
        self._OPERATIONS[self.action](pk, actor=_actor(request))  # InvalidTransition: a 409
        return Response(queries.workflow_status(pk).to_dict())


def _actor(request: Request) -> str:
    """How a run's timeline names the API user who operated it."""
    return f"api:user:{request.user.pk}:{request.user.get_username()}"


class CancelView(RunActionView):
    action = "cancel"


class PauseView(RunActionView):
    action = "pause"


class ResumeView(RunActionView):
    action = "resume"


@extend_schema(parameters=[RUN_ID, IDEMPOTENCY_KEY], request=serializers.RetryRequestSerializer,
               responses={200: serializers.WorkflowStatusSerializer, **ERRORS})
class RetryView(RunActionView):
    """``POST runs/<id>/retry/``: retry a failed run from its failed step, or with
    ``{"from_step": "name"}`` from an earlier step (discarding what it and later steps
    merged)."""

    action = "retry"

    def _act(self, request: Request, pk: int) -> Response:
        body = read_json_body(request)
        body = {} if body is None else body  # an empty body; [] or 0 is a wrong one
        if not isinstance(body, dict) or set(body) - {"from_step"} or not isinstance(
                body.get("from_step"), (str, int, type(None))) or isinstance(
                body.get("from_step"), bool):
            raise api_errors.QueuetyAPIError(
                'The body of a retry must be empty or {"from_step": "<step name or index>"}.',
                "invalid_request", status.HTTP_400_BAD_REQUEST)
        try:
            operations.retry(pk, actor=_actor(request), from_step=body.get("from_step"))
        except exceptions.UnknownStep as error:  # a field of the body, not a missing resource
            raise api_errors.QueuetyAPIError(str(error), "invalid_request",
                                             status.HTTP_400_BAD_REQUEST) from None
        return Response(queries.workflow_status(pk).to_dict())


@extend_schema(parameters=[RUN_ID, IDEMPOTENCY_KEY],
               request=serializers.EditStateRequestSerializer,
               responses={200: serializers.StateEditSerializer, **ERRORS})
class EditStateView(RunAPIView):
    """``POST runs/<id>/edit-state/``: apply a JSON merge patch to a paused or failed run's
    state, with a reason; 409 ``invalid_transition`` on any other run (or one whose step is
    running), 400 ``invalid_state_edit`` for a patch it cannot take. Secret keys' values are
    masked throughout the answer (its changes and the run's state)."""

    required_permissions = {"POST": "queuety.change_workflowrun"}

    def post(self, request: Request, pk: int) -> Response:
        self.get_run(pk)
        return replayable(request, lambda: self._edit(request, pk))

    def _edit(self, request: Request, pk: int) -> Response:
        body = read_json_body(request)
        if not isinstance(body, dict) or set(body) - {"patch", "reason"} or "patch" not in body:
            raise api_errors.QueuetyAPIError(
                'The body must be {"patch": {...}, "reason": "..."}: a JSON merge patch of '
                "the run's state and why.", "invalid_request", status.HTTP_400_BAD_REQUEST)
        reason = body.get("reason")
        edit = state_edits.edit_state(pk, body["patch"], actor=_actor(request),
                                      reason=reason if isinstance(reason, str) else "")
        # Masked throughout (the changes and the run's state), as the events endpoint shows
        # the timeline: the reply is also stored for an Idempotency-Key replay.
        return Response(mask({**edit.to_dict(), "run": queries.workflow_status(pk).to_dict()}))


DEFINITION_PATH = [
    OpenApiParameter("name", str, OpenApiParameter.PATH,
                     description="The workflow's name: the definition must be one of its."),
    OpenApiParameter("hash", str, OpenApiParameter.PATH,
                     description="The definition's hash, or a unique prefix of it (8 "
                                 "characters at least)."),
]


@extend_schema(parameters=[*DEFINITION_PATH, IDEMPOTENCY_KEY], request=None,
               responses={200: serializers.BulkResultSerializer, **ERRORS})
class DefinitionActionView(RunAPIView):
    """``POST workflows/<name>/definitions/<hash>/pause/``: pause every running or waiting run
    of one definition; ``resume/``: resume its paused runs. 200 with the counts, also when
    some runs failed (listed in ``failed``); 404 ``definition_not_found`` when ``<hash>``
    names no definition of workflow ``<name>``. Safe to repeat: a second pause pauses
    nothing more. Only the runs inside the user's ``QUEUETY["RUN_SCOPE"]`` are read and
    counted; with ``QUEUETY["RUN_ACCESS"]``, only those it lets the user act on are changed."""

    action = ""
    required_permissions = {"POST": "queuety.change_workflowrun"}

    def post(self, request: Request, name: str, hash: str) -> Response:
        definition = find_definition(hash, name=name)  # UnknownDefinition: a 404
        return replayable(request, lambda: self._act(request, definition.pk))

    def _act(self, request: Request, definition_id: int) -> Response:
        operation = quarantine.pause_definition if self.action == "pause" else \
            quarantine.resume_definition
        result = operation(definition_id, actor=_actor(request),
                           include=None if settings.RUN_ACCESS is None
                           else lambda run: self._may_act_on(request, run),
                           scope=None if not scope.is_scoped()
                           else lambda runs: scope.scoped_runs(request.user, runs))
        return Response(result.to_dict())

    def _may_act_on(self, request: Request, run: WorkflowRun) -> bool:
        return all(p.has_object_permission(request, self, run) for p in self.get_permissions())


class PauseDefinitionView(DefinitionActionView):
    action = "pause"


class ResumeDefinitionView(DefinitionActionView):
    action = "resume"


@extend_schema(responses={200: serializers.RegisteredWorkflowSerializer(many=True),
                          403: OpenApiResponse(serializers.ErrorSerializer)})
class WorkflowListView(RunAPIView):
    """``GET workflows/``: the registered workflows, with their version and definition hash
    (what ``POST runs/`` can start)."""

    required_permissions = {"GET": "queuety.view_workflowrun"}

    def get(self, request: Request) -> Response:
        return Response(serializers.RegisteredWorkflowSerializer(
            [entry.to_dict() for entry in registry.registered()], many=True).data)
