"""API views: thin over ``queuety.queries`` and ``queuety.inbox`` (and ``queuety.approvals``
for links)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.utils.module_loading import import_string
from django.views import View
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queuety import approvals, exceptions, inbox, machines, queries, replyforms, scope
from queuety.api import exceptions as api_errors
from queuety.api import serializers
from queuety.conf import settings
from queuety.core.definition import WaitStep
from queuety.core.waits import WaitSpec
from queuety.masking import mask
from queuety.models import ApiReply, RunStatus, WorkflowRun
from queuety.store.definitions import load_spec
from queuety.version import __version__

logger = logging.getLogger("queuety")

ERRORS = {code: OpenApiResponse(serializers.ErrorSerializer) for code in (400, 403, 404, 409, 413)}
#: Run ids are positive bigints; the URL's ``<int:pk>`` matches no sign, and the database
#: column holds no more than this.
MAX_RUN_ID = 2**63 - 1
RUN_ID = OpenApiParameter(
    "id", {"type": "integer", "minimum": 1, "maximum": MAX_RUN_ID}, OpenApiParameter.PATH,
    description="The workflow run's id.")
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="Retrying a POST with the same key returns the first answer and records "
                "nothing new.")


class RunAPIView(APIView):
    """Base: permissions from settings, domain errors as JSON answers."""

    # Its own schema class, so the OpenAPI schema does not depend on the site's
    # REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] (DRF's default is not drf-spectacular's). The
    # views below are documented with @extend_schema on the CLASS: on a method it would
    # extend the schema class the site's settings name.
    schema = AutoSchema()

    def get_permissions(self) -> list[BasePermission]:
        return [import_string(path)() for path in settings.API_PERMISSION_CLASSES]

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, exceptions.QueuetyError):
            exc = api_errors.translate(exc)
        response = super().handle_exception(exc)
        if isinstance(exc, api_errors.QueuetyAPIError):
            response.data = {"detail": str(exc.detail), "code": exc.detail.code, **exc.extra}
        elif isinstance(response.data, dict) and "detail" in response.data:
            detail = response.data["detail"]
            response.data = {"detail": str(detail), "code": getattr(detail, "code", "error")}
        return response

    def get_run(self, pk: int) -> WorkflowRun:
        """Run ``pk`` as this request's user may reach it. A run outside their
        ``RUN_SCOPE`` is answered as one that does not exist (404: a 403 would confirm the
        id); ``RUN_ACCESS`` then decides the run (403)."""
        run = scope.find_run(self.request.user, pk, "pk", "name", "status")
        if run is None:
            raise exceptions.RunNotFound(pk)
        self.check_object_permissions(self.request, run)
        return run


@extend_schema(parameters=[RUN_ID],
               responses={200: serializers.WorkflowStatusSerializer, **ERRORS})
class RunDetailView(RunAPIView):
    """``GET runs/<id>/``: the run's status, as ``queuety.workflow_status()`` returns it, and
    under ``machine`` a state machine run's ``queuety.machine_status()`` (null for others)."""

    def get(self, request: Request, pk: int) -> Response:
        self.get_run(pk)
        body = queries.workflow_status(pk).to_dict()
        machine = machines.machine_or_none(pk)
        body["machine"] = None if machine is None else machine.to_dict()
        return Response(body)


def read_json_body(request: Request) -> Any:
    """The request's JSON body (None when empty), at most ``MAX_SIGNAL_BYTES``; NaN and
    Infinity are refused (they are not JSON).

    Raises:
        InvalidSignalData: the body is over the limit (a 413). ParseError: not valid JSON.
    """
    limit = settings.MAX_SIGNAL_BYTES
    if len(request.body) > limit:
        raise exceptions.InvalidSignalData(
            f"The request body is {len(request.body)} bytes; the limit is {limit} "
            "(QUEUETY['MAX_SIGNAL_BYTES']).", too_large=True)
    if not request.body.strip():
        return None
    try:
        return json.loads(request.body, parse_constant=replyforms.refuse_constant)
    except ValueError as error:
        raise ParseError(f"The request body is not valid JSON: {error}.") from None
    except RecursionError:
        raise ParseError("The request body is not valid JSON here: it is nested too "
                         "deeply.") from None


class PostReplyView(RunAPIView):
    """A POST that delivers something to a run, replayable with ``Idempotency-Key``."""

    def body(self, request: Request) -> Any:
        return read_json_body(request)

    # The URL's other captures follow pk, as each subclass names them: mypy accepts any
    # override of a signature ending in *args: Any, **kwargs: Any.
    def deliver(self, request: Request, pk: int, *args: Any,
                **kwargs: Any) -> inbox.SignalReceipt:
        raise NotImplementedError

    def post(self, request: Request, pk: int, *args: Any, **kwargs: Any) -> Response:
        self.get_run(pk)
        return replayable(request,
                          lambda: self._answer(self.deliver(request, pk, *args, **kwargs)))

    @staticmethod
    def _answer(receipt: inbox.SignalReceipt) -> Response:
        return Response({"signal_id": receipt.signal_id, "run_id": receipt.run_id,
                         "name": receipt.name, "settled": receipt.settled,
                         "status": receipt.status},
                        status=status.HTTP_200_OK if receipt.settled
                        else status.HTTP_202_ACCEPTED)


class _Replay(Exception):
    """Internal: this Idempotency-Key already has an answer."""


def replayable(request: Request, answer: Callable[[], Response]) -> Response:
    """Answer a POST with ``answer()``, once per ``Idempotency-Key``: a retry with the same
    key (by the same user) gets the first answer back, marked ``Idempotent-Replayed``, and
    records nothing new; a key reused on another path is a 409."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return answer()
    if len(key) > 255:
        raise ParseError("The Idempotency-Key header is longer than 255 characters.")
    user_id = request.user.pk
    # Answers are kept by user id: the default permission classes let only authenticated
    # users this far, and an anonymous one (whom a site's own classes may admit) has none.
    assert user_id is not None
    try:
        with transaction.atomic():
            # The key row goes first: a concurrent retry blocks here until this answer is
            # committed, then replays it instead of delivering twice.
            try:
                with transaction.atomic():
                    ApiReply.objects.create(user_id=user_id, key=key,
                                            method="POST", path=request.path,
                                            status_code=0, body={})
            except IntegrityError:
                raise _Replay from None
            try:
                response = answer()
            except exceptions.WaitExpired as error:
                # The reply found the wait past its timeout and settled it by the timeout:
                # that must commit; the refusal is not an answer to store.
                ApiReply.objects.filter(user_id=user_id, key=key).delete()
                expired = error
            else:
                ApiReply.objects.filter(user_id=user_id, key=key).update(
                    status_code=response.status_code,
                    body=json.loads(json.dumps(response.data, cls=DjangoJSONEncoder)))
                return response
        raise expired
    except _Replay:
        stored = ApiReply.objects.get(user_id=user_id, key=key)
        if stored.path != request.path:
            raise api_errors.QueuetyAPIError(
                f"Idempotency-Key {key!r} was already used for {stored.path}; use a new "
                "key for a new request.", "idempotency_key_reused",
                status.HTTP_409_CONFLICT) from None
        return Response(stored.body, status=stored.status_code,
                        headers={"Idempotent-Replayed": "true"})


def _sender(request: Request) -> str:
    return f"user:{request.user.pk}:{request.user.get_username()}"


REPLY_DOC: dict[str, Any] = {
    "request": {"application/json": {}}, "parameters": [RUN_ID, IDEMPOTENCY_KEY],
    "responses": {200: serializers.SignalReceiptSerializer,
                  202: serializers.SignalReceiptSerializer, **ERRORS}}


@extend_schema(**REPLY_DOC)
class SignalView(PostReplyView):
    """``POST runs/<id>/signals/<name>/``: the JSON body is the signal's data.

    200 when it completed the wait the run was parked at, 202 when it was stored for later.
    """

    def post(self, request: Request, pk: int, name: str) -> Response:
        return super().post(request, pk, name=name)

    def deliver(self, request: Request, pk: int, name: str) -> inbox.SignalReceipt:
        return inbox.send_signal(pk, name, self.body(request), sent_by=_sender(request))


@extend_schema(**REPLY_DOC)
class ReplyView(PostReplyView):
    """``POST runs/<id>/approve/``, ``reject/``, ``input/``: answer the run's human wait."""

    kind = ""

    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)

    def deliver(self, request: Request, pk: int) -> inbox.SignalReceipt:
        data = self.body(request)
        if data is None and self.kind != "input":
            data = {}
        return inbox.reply(pk, self.kind, data, signal=request.query_params.get("signal"),
                              sent_by=_sender(request))


class ApproveView(ReplyView):
    kind = "approve"


class RejectView(ReplyView):
    kind = "reject"


class InputView(ReplyView):
    kind = "input"


@extend_schema(responses={200: OpenApiTypes.OBJECT})
class SchemaView(SpectacularAPIView):
    """``GET schema/``: the OpenAPI 3 schema of Queuety's endpoints, and of them only.

    Titled and versioned here, so the site's ``SPECTACULAR_SETTINGS`` (which describe its own
    API, if it has one) neither need to nor can change it.
    """

    schema = AutoSchema()
    custom_settings = {
        "TITLE": "Queuety API",
        "DESCRIPTION": "Signals, approvals, input and status of durable workflow runs.",
        "VERSION": __version__,
        "PREPROCESSING_HOOKS": ["queuety.api.views.queuety_endpoints"],
    }

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # A method of its own: the inherited one is documented on DRF's default schema class
        # unless the site's settings name drf-spectacular's (see RunAPIView).
        # drf-spectacular leaves SpectacularAPIView.get unannotated.
        response: Response = super().get(request, *args, **kwargs)  # type: ignore[no-untyped-call]
        return response


def queuety_endpoints(endpoints: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """drf-spectacular hook: keep the endpoints of Queuety's views, drop the site's others."""
    return [endpoint for endpoint in endpoints
            if getattr(endpoint[3], "cls", None) is not None
            and endpoint[3].cls.__module__.startswith("queuety.")]


def not_found(request: HttpRequest, path: str = "") -> HttpResponse:
    """Any other path under the API: a JSON 404, like every other API answer."""
    from django.http import JsonResponse

    return JsonResponse({"detail": f"There is no API endpoint at {request.path}.",
                         "code": "not_found"}, status=404)


@extend_schema(responses={200: serializers.WaitingRunSerializer(many=True), **ERRORS})
class WaitsView(RunAPIView):
    """``GET waits/``: runs waiting on a person, oldest first (at most 200)."""

    def get(self, request: Request) -> Response:
        found = []
        runs = (scope.scoped_runs(request.user, WorkflowRun.objects.filter(
            status=RunStatus.WAITING_FOR_SIGNAL)).order_by("updated_at")[:1000])
        for run in runs:
            spec = load_spec(run.definition_id)
            step = spec.steps[run.current_step]
            if not (step.wait and step.wait.human):
                continue
            if not all(p.has_object_permission(request, self, run)
                       for p in self.get_permissions()):
                continue
            found.append({"id": run.pk, "name": run.name, "step_name": step.name,
                          "human_wait": step.wait.human, "waiting_since": run.updated_at,
                          "expires_at": run.wait_expires_at, "schema": step.wait.schema})
            if len(found) == 200:
                break
        return Response(serializers.WaitingRunSerializer(found, many=True).data)


class ApprovalPageView(View):
    """``GET``/``POST approvals/<token>/``: the page behind an approval link (no login)."""

    template_name = "queuety/approval.html"

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = super().dispatch(request, *args, **kwargs)
        if response.status_code >= 400:
            # Django would log this answer with the request's path, which holds the token
            # (a reused, expired or forged link): log it here without the token instead.
            # Django's private flag, which its stubs do not declare.
            response._has_been_logged = True  # type: ignore[attr-defined]
            logger.warning("Approval link refused with status %s.", response.status_code)
        return response

    def get(self, request: HttpRequest, token: str) -> HttpResponse:
        return self._page(request, token)

    def post(self, request: HttpRequest, token: str) -> HttpResponse:
        kind = request.POST.get("action", "")
        if kind not in ("approve", "reject", "input"):
            return self._page(request, token, error="Choose approve, reject or submit.",
                              status=400)
        try:
            ticket = approvals.read_token(token)
            wait = self._wait(ticket.run_id)
            data = replyforms.form_reply(wait.schema if wait else None, request.POST) \
                if kind == "input" else {"note": request.POST.get("note", "")}
            receipt = approvals.redeem(token, kind, data)
        except (approvals.InvalidLink, approvals.ExpiredLink, exceptions.QueuetyError,
                ValueError) as error:
            return self._page(request, token, error=str(error), status=_page_status(error))
        return render(request, self.template_name, {"done": True, "kind": kind,
                                                    "receipt": receipt})

    def _wait(self, run_id: int) -> WaitSpec | None:
        run = WorkflowRun.objects.filter(pk=run_id).first()
        if run is None:
            return None
        spec = load_spec(run.definition_id)
        return spec.steps[run.current_step].wait if run.current_step < len(spec.steps) else None

    def _page(self, request: HttpRequest, token: str, error: str | None = None,
              status: int = 200) -> HttpResponse:
        context: dict[str, Any] = {"error": error, "token": token}
        try:
            ticket = approvals.read_token(token)
        except (approvals.InvalidLink, approvals.ExpiredLink) as problem:
            return render(request, self.template_name, {"error": str(problem), "dead": True},
                          status=_page_status(problem))
        run = WorkflowRun.objects.filter(pk=ticket.run_id).first()
        if run is None:
            return render(request, self.template_name,
                          {"error": "This run no longer exists.", "dead": True}, status=410)
        spec = load_spec(run.definition_id)
        step = spec.steps[ticket.step_index]
        live = (run.status == RunStatus.WAITING_FOR_SIGNAL
                and run.current_step == ticket.step_index and run.transitions ==
                ticket.transitions)
        if not live:  # never show a used link the run's later state
            if error is not None and "already" not in error:
                return render(request, self.template_name, {"error": error, "dead": True},
                              status=status)
            return render(request, self.template_name, {
                "error": "This request was already answered.", "dead": True}, status=410)
        # Links are minted only at a human wait (approvals.make_token), and the run is still
        # parked at that step of the same definition.
        assert isinstance(step, WaitStep)
        context.update(run=run, step=step, wait=step.wait,
                       fields=replyforms.form_fields(step.wait.schema),
                       state=json.dumps(mask(run.state), indent=2, ensure_ascii=False)[:4000])
        return render(request, self.template_name, context, status=status)


def _page_status(error: Exception) -> int:
    if isinstance(error, approvals.InvalidLink):
        return 403
    if isinstance(error, approvals.ExpiredLink | exceptions.RunNotWaiting):
        return 410
    return 400


