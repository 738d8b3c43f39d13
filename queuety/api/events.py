"""``GET events/``: events across runs, newest first, cursor-paginated and filtered as
``manage.py queuety log`` filters them; thin over ``queuety.events_query``."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils.dateparse import parse_datetime
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from queuety import events_query
from queuety.api import exceptions as api_errors
from queuety.api.views import ERRORS, MAX_RUN_ID, RunAPIView
from queuety.masking import mask

EVENT_FILTERS = [
    OpenApiParameter("workflow", str, description="Only events of runs of this workflow "
                                                  "(its name)."),
    OpenApiParameter("run", {"type": "integer", "minimum": 1, "maximum": MAX_RUN_ID},
                     description="Only events of this run."),
    OpenApiParameter("event", str, description="Only events of this kind (step_failed, "
                                               "workflow_started ...)."),
    OpenApiParameter("error_type", str, description="Only events whose error has this type "
                     "(data.error.type: ValueError, myapp.errors.Timeout): failed and retried "
                     "attempts, failed runs."),
    OpenApiParameter("since", str, description="Only events since then: an age (30s, 15m, "
                     "1h, 2d, 1w) or an ISO 8601 date or time (2026-03-01T09:30:00Z)."),
    OpenApiParameter("tag", str, many=True, explode=True,
                     description="Only events of runs carrying this tag, as key:value "
                                 "(customer:42); repeat it for several, all must match."),
    OpenApiParameter("cursor", str, description="The page: from a previous answer's next or "
                                                "previous link."),
    OpenApiParameter("page_size", {"type": "integer", "minimum": 1},
                     description="Events per page (default 50, at most 500)."),
]


class EventSerializer(serializers.Serializer[Any]):
    """One event of a run's timeline, with its run and workflow."""

    id = serializers.IntegerField()
    run_id = serializers.IntegerField()
    workflow = serializers.CharField(help_text="The run's workflow name.")
    kind = serializers.CharField(help_text="step_started, step_completed, step_failed, "
                                           "workflow_failed, signal_received ...")
    step_index = serializers.IntegerField(allow_null=True)
    step_name = serializers.CharField(allow_blank=True)
    attempt = serializers.IntegerField(allow_null=True)
    duration_ms = serializers.FloatField(allow_null=True)
    # Popped into the declared fields by DRF's metaclass: Serializer.data stays as it is.
    data = serializers.JSONField(  # type: ignore[assignment]
        help_text="What the event recorded (keys named in QUEUETY['SECRET_KEYS'] masked).")
    error_type = serializers.CharField(allow_null=True, help_text="data.error.type, if the "
                                                                  "event records an error.")
    created_at = serializers.DateTimeField()
    run_url = serializers.URLField(help_text="The event's run: GET runs/<id>/.")


class EventPageSerializer(serializers.Serializer[Any]):
    """A page of ``GET events/``: follow ``next`` (a URL with a cursor) for older events."""

    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = EventSerializer(many=True)


class EventCursorPagination(CursorPagination):
    """Newest first, by ``(created_at, id)``: the cursor is a time, so a page is a range scan
    of an index ending in that order, whichever filter leads it (no OFFSET past the
    cursor's own ties, no COUNT)."""

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def decode_cursor(self, request: Request) -> Cursor | None:
        # DRF decodes the cursor's text; its position must also be a time, or the filter on
        # created_at would fail as a server error rather than as a bad cursor.
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            try:
                moment = parse_datetime(str(cursor.position))
            except ValueError:
                moment = None
            if moment is None:
                raise NotFound(self.invalid_cursor_message)
        return cursor


class EventListSchema(AutoSchema):
    """``events_list``, as ``runs_list`` and ``jobs_list`` are named."""

    def get_operation_id(self) -> str:
        return "events_list"


@extend_schema(parameters=EVENT_FILTERS, responses={200: EventPageSerializer, **ERRORS})
class EventListView(RunAPIView):
    """``GET events/``: the events of every run the user may reach (``RUN_SCOPE`` in SQL;
    ``RUN_ACCESS`` then filters the page), newest first, filtered by ``workflow``, ``run``,
    ``event``, ``error_type``, ``since`` and ``tag``."""

    schema = EventListSchema()
    required_permissions = {"GET": "queuety.view_workflowrun"}

    def get(self, request: Request) -> Response:
        params = request.query_params
        try:
            filters = events_query.EventFilters.parse(
                workflow=params.get("workflow"), run=params.get("run"),
                kind=params.get("event"), error_type=params.get("error_type"),
                since=params.get("since"), tags=params.getlist("tag"))
        except events_query.InvalidEventFilter as error:
            raise api_errors.QueuetyAPIError(str(error), "invalid_filter",
                                             status.HTTP_400_BAD_REQUEST) from None
        paginator = EventCursorPagination()
        page = paginator.paginate_queryset(events_query.events_matching(filters, request.user),
                                           request, view=self)
        assert page is not None  # always paginated
        found = [{**row, "data": mask(row["data"]),
                  "run_url": request.build_absolute_uri(
                      reverse("queuety:run-detail", args=[row["run_id"]]))}
                 for row in events_query.rows(page, request.user)]
        return paginator.get_paginated_response(EventSerializer(found, many=True).data)
