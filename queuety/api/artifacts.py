"""API views of a run's artifacts and of its streaming steps' chunks (REST and Server-Sent
Events): thin over ``queuety.outputs``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import renderers, status
from rest_framework.exceptions import ParseError
from rest_framework.request import Request
from rest_framework.response import Response

from queuety import outputs
from queuety.api import serializers
from queuety.api.views import ERRORS, RUN_ID, RunAPIView
from queuety.conf import settings
from queuety.core import artifacts as rules

KEY = OpenApiParameter("key", str, OpenApiParameter.PATH, description="The artifact's key.")
STEP = OpenApiParameter("step", str, OpenApiParameter.PATH,
                        description="The streaming step's name (or its position).")
AFTER = OpenApiParameter("after", int, OpenApiParameter.QUERY, required=False,
                         description="Only chunks whose index is greater (default: all).")


def _portable(item: dict[str, Any]) -> dict[str, Any]:
    """An artifact as JSON carries it: ``bytes`` content as base64 text."""
    if "content" in item and item["kind"] == "bytes":
        return {**item, "content": rules.portable("bytes", item["content"])}
    return item


def _position(value: str | None, name: str) -> int:
    if value is None or value == "":
        return -1
    try:
        number = int(value)
    except ValueError:
        raise ParseError(f"{name} must be a chunk index (a whole number); got {value!r}.") \
            from None
    if number < -1:
        raise ParseError(f"{name} must be -1 or more; got {number}.")
    return number


@extend_schema(parameters=[RUN_ID],
               responses={200: serializers.ArtifactSerializer(many=True), **ERRORS})
class ArtifactListView(RunAPIView):
    """``GET runs/<id>/artifacts/``: the run's artifacts by key, without their content."""

    def get(self, request: Request, pk: int) -> Response:
        self.get_run(pk)
        return Response(serializers.ArtifactSerializer(outputs.artifacts(pk), many=True).data)


class ArtifactSchema(AutoSchema):
    """The three methods of one URL, each with its own body and answers (an
    ``@extend_schema`` on a method would extend the site's default schema class instead)."""

    def get_request_serializer(self) -> Any:
        return serializers.ArtifactWriteSerializer if self.method == "PUT" else None

    def get_response_serializers(self) -> Any:
        answers: dict[str, dict[int, type[serializers.ArtifactSerializer] | None]] = {
            "GET": {200: serializers.ArtifactContentSerializer},
            "PUT": {200: serializers.ArtifactSerializer},
            "DELETE": {204: None}}
        return {**answers[self.method], **ERRORS}


@extend_schema(parameters=[RUN_ID, KEY])
class ArtifactView(RunAPIView):
    """``GET``, ``PUT``, ``DELETE runs/<id>/artifacts/<key>/``: one artifact with its content
    (``bytes`` as base64 text); write it from outside the run's steps; delete it."""

    schema = ArtifactSchema()
    # Writing a run's artifacts is operating it, not answering it: an approver may not.
    required_permissions = {"GET": "queuety.view_workflowrun",
                            "PUT": "queuety.change_workflowrun",
                            "DELETE": "queuety.change_workflowrun"}

    def get(self, request: Request, pk: int, key: str) -> Response:
        self.get_run(pk)
        return Response(serializers.ArtifactContentSerializer(
            _portable(outputs.artifact(pk, key))).data)

    def put(self, request: Request, pk: int, key: str) -> Response:
        self.get_run(pk)
        body = serializers.ArtifactWriteSerializer(data=request.data)
        if not body.is_valid():
            raise ParseError("The body must be {\"content\": ..., \"kind\": \"json|text|"
                             f"markdown|bytes\", \"metadata\": {{...}}}}: {body.errors}")
        data = body.validated_data
        content = rules.from_portable(data["kind"], data["content"])
        stored = outputs.put_artifact(pk, key, content, data["kind"], data.get("metadata"))
        return Response(serializers.ArtifactSerializer(stored).data)

    def delete(self, request: Request, pk: int, key: str) -> Response:
        self.get_run(pk)
        outputs.delete_artifact(pk, key)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(parameters=[RUN_ID, KEY],
               responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **ERRORS})
class ArtifactDownloadView(RunAPIView):
    """``GET runs/<id>/artifacts/<key>/download/``: the content as a file, typed by kind."""

    def get(self, request: Request, pk: int, key: str) -> HttpResponse:
        self.get_run(pk)
        kind, data = outputs.artifact_bytes(pk, key)
        return download(pk, key, kind, data)


def download(run_id: int, key: str, kind: str, data: bytes) -> HttpResponse:
    """An artifact's stored bytes as an attachment."""
    response = HttpResponse(data, content_type=rules.CONTENT_TYPES[kind])
    response["Content-Disposition"] = (
        f'attachment; filename="{rules.file_name(run_id, key, kind)}"')
    response["X-Content-Type-Options"] = "nosniff"
    return response


@extend_schema(parameters=[RUN_ID, STEP, AFTER,
                           OpenApiParameter("limit", int, OpenApiParameter.QUERY,
                                            required=False, description="At most this many "
                                            "chunks (1-1000, default 1000).")],
               responses={200: serializers.ChunkPageSerializer, **ERRORS})
class ChunkListView(RunAPIView):
    """``GET runs/<id>/steps/<step>/chunks/``: the chunks the step stored so far (readable
    while it runs); ``finished`` says whether more can come."""

    def get(self, request: Request, pk: int, step: str) -> Response:
        self.get_run(pk)
        after = _position(request.query_params.get("after"), "after")
        limit = _position(request.query_params.get("limit") or "1000", "limit")
        if not 1 <= limit <= 1000:
            raise ParseError(f"limit must be between 1 and 1000; got {limit}.")
        page = outputs.chunks(pk, step, after=after, limit=limit)
        return Response(serializers.ChunkPageSerializer(page.to_dict()).data)


#: One event of the stream, as an SSE client parses it.
SSE_EVENT = {"type": "object", "properties": {
    "event": {"type": "string", "enum": ["chunk", "end"]},
    "id": {"type": "string", "description": "The chunk's index (chunk events)."},
    "data": {"type": "string", "description": "The chunk as JSON, or {\"status\": ...}."},
    "retry": {"type": "integer"}}}


class EventStreamRenderer(renderers.BaseRenderer):
    """Lets a client ask for ``text/event-stream`` (an ``EventSource`` does); an error answer
    is still JSON text."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        return json.dumps(data).encode()


@extend_schema(parameters=[RUN_ID, STEP, AFTER, OpenApiParameter(
    "Last-Event-ID", int, OpenApiParameter.HEADER, required=False,
    description="Sent by a reconnecting EventSource: resume after that chunk index.")],
    responses={(200, "text/event-stream"): OpenApiResponse(
        SSE_EVENT, description="Server-Sent Events: `chunk` events (id: the chunk's "
        "index; data: the chunk as JSON) as they are stored, then one `end` event (data: "
        "{\"status\": the step row's status}) once the step or the run is finished."),
        **ERRORS})
class ChunkStreamView(RunAPIView):
    """``GET runs/<id>/steps/<step>/chunks/stream/``: new chunks pushed as they are stored.

    Polls the database every ``QUEUETY["STREAM_POLL_INTERVAL"]`` seconds; ends with an ``end``
    event when the step row (or the run) is finished, or after ``STREAM_MAX_SECONDS`` (the
    browser's ``EventSource`` then reconnects with ``Last-Event-ID`` and misses nothing).
    """

    renderer_classes = [renderers.JSONRenderer, EventStreamRenderer]

    def get(self, request: Request, pk: int, step: str) -> StreamingHttpResponse:
        self.get_run(pk)
        name = outputs.step_name_of(pk, step)
        if not outputs.can_stream(pk, name):
            # No chunk can ever come (a wait, a delay, a fan-out): end at once.
            response = StreamingHttpResponse(iter(["retry: 1000\n\n", 'event: end\ndata: '
                                                   '{"status": null}\n\n']),
                                             content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            return response
        after = _position(request.headers.get("Last-Event-ID")
                          or request.query_params.get("after"), "after")
        response = StreamingHttpResponse(_events(pk, name, after),
                                         content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
        return response


#: Seconds of silence after which a comment line keeps proxies from closing the stream.
KEEP_ALIVE = 15.0


def _events(run_id: int, step_name: str, after: int) -> Iterator[str]:
    """The Server-Sent Events of one step's chunks, from index ``after + 1`` on."""
    yield "retry: 1000\n\n"
    started = quiet = time.monotonic()
    last = after
    while True:
        # The row's state first, then the chunks: a row found finished has stored its last
        # chunk already, so the read that follows sees every chunk.
        step_run_id, row_status, finished = outputs.latest_step_row(run_id, step_name)
        found: list[Any] = []
        if step_run_id is not None:
            found = outputs.raw_chunks(run_id, step_name, step_run_id, last)
            for index, text, _attempt, _created in found:
                yield f"id: {index}\nevent: chunk\ndata: {text}\n\n"
                last = index
        if found:
            quiet = time.monotonic()
            if len(found) == 500:
                continue  # more waiting: read on before sleeping
        if finished:
            yield f"event: end\ndata: {json.dumps({'status': row_status})}\n\n"
            return
        now = time.monotonic()
        if now - started > settings.STREAM_MAX_SECONDS:
            return
        if now - quiet > KEEP_ALIVE:
            yield ": keep-alive\n\n"
            quiet = now
        time.sleep(settings.STREAM_POLL_INTERVAL)
