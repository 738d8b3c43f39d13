"""Queue operations over the API: ``GET queues/``, ``POST queues/<name>/pause/`` and
``resume/``; thin over ``queuety.queues``.

Queues are site-wide. Listing is a read (``queuety.view_workflowrun``); on a site with a
``QUEUETY["RUN_SCOPE"]`` its counts cover only the runs the user may reach, so a tenant never
learns another tenant's volume. A site with only ``QUEUETY["RUN_ACCESS"]`` (a per-run check,
which no count can apply) shows the list to superusers only. Pausing and resuming need
``queuety.change_workflowrun``, and on a site with either setting the user must also be a
superuser: a pause holds every tenant's steps.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers as fields
from rest_framework.exceptions import ParseError, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from queuety import queues, scope
from queuety.api import serializers
from queuety.api.views import ERRORS, IDEMPOTENCY_KEY, RunAPIView, replayable
from queuety.conf import settings
from queuety.models import WorkflowRun


class QueueSerializer(fields.Serializer[Any]):
    """One queue in ``GET queues/`` (``queuety.queues.QueueStats``)."""

    name = fields.CharField()
    paused = fields.BooleanField()
    paused_at = fields.DateTimeField(allow_null=True)
    paused_by = fields.CharField(allow_blank=True)
    reason = fields.CharField(allow_blank=True)
    waiting = fields.IntegerField(help_text="Steps due and not started (pending or throttled).")
    running = fields.IntegerField(help_text="Steps a worker is running.")
    oldest_wait = fields.FloatField(allow_null=True,
                                    help_text="Seconds the longest-waiting step has been due.")
    finished = fields.IntegerField(help_text="Steps finished in the last 5 minutes.")
    throughput = fields.FloatField(help_text="Steps finished per minute, last 5 minutes.")


class QueueActionSerializer(fields.Serializer[Any]):
    """The answer of ``POST queues/<name>/pause/`` or ``resume/``."""

    queue = QueueSerializer()
    released = fields.IntegerField(help_text="Held steps a resume released (0 for a pause).")


QUEUE_NAME = OpenApiParameter("name", str, OpenApiParameter.PATH,
                              description="The Celery queue's name.")


def _tenanted() -> bool:
    return scope.is_scoped() or settings.RUN_ACCESS is not None


def _visible(request: Request) -> Any:
    """The runs whose steps the user's numbers count (None: all, on an unscoped site)."""
    if not scope.is_scoped():
        return None
    return scope.scoped_runs(request.user, WorkflowRun.objects.all())


@extend_schema(responses={200: QueueSerializer(many=True),
                          403: OpenApiResponse(serializers.ErrorSerializer)})
class QueueListView(RunAPIView):
    """``GET queues/``: every known queue (paused, or with waiting, running or recently
    finished steps), with its numbers."""

    required_permissions = {"GET": "queuety.view_workflowrun"}

    def get(self, request: Request) -> Response:
        if settings.RUN_ACCESS is not None and not scope.is_scoped() \
                and not request.user.is_superuser:
            raise PermissionDenied("Queue numbers count every tenant's steps, and "
                                   "QUEUETY['RUN_ACCESS'] cannot narrow a count: only "
                                   "superusers see them (a RUN_SCOPE shows each user their "
                                   "own runs' numbers).")
        stats = queues.queue_stats(runs=_visible(request))
        return Response(QueueSerializer([item.to_dict() for item in stats], many=True).data)


@extend_schema(parameters=[QUEUE_NAME, IDEMPOTENCY_KEY], request=None,
               responses={200: QueueActionSerializer, **ERRORS})
class QueueActionView(RunAPIView):
    """``POST queues/<name>/pause/``: no step of the queue starts until it is resumed (its
    steps wait throttled, ``queue paused``); ``resume/``: its held steps start. Safe to
    repeat. 400 for a name longer than 255 characters."""

    action = ""
    required_permissions = {"POST": "queuety.change_workflowrun"}

    def post(self, request: Request, name: str) -> Response:
        if _tenanted() and not request.user.is_superuser:
            raise PermissionDenied("Queues are site-wide: on a site with QUEUETY['RUN_SCOPE'] "
                                   "or RUN_ACCESS, only superusers may pause or resume them.")
        if len(name) > queues.MAX_NAME:
            raise ParseError(f"A queue name has at most {queues.MAX_NAME} characters "
                                  f"(got {len(name)}).")
        return replayable(request, lambda: self._act(request, name))

    def _act(self, request: Request, name: str) -> Response:
        actor = f"api:user:{request.user.pk}:{request.user.get_username()}"
        released = 0
        if self.action == "pause":
            queues.pause_queue(name, actor=actor)
        else:
            released = queues.resume_queue(name, actor=actor)
        stats = queues.queue_stats([name], runs=_visible(request))[0]
        return Response({"queue": QueueSerializer(stats.to_dict()).data, "released": released})


class PauseQueueView(QueueActionView):
    action = "pause"


class ResumeQueueView(QueueActionView):
    action = "resume"
