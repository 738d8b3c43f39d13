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

from queuety import queues
from queuety.api import serializers
from queuety.api.views import ERRORS, IDEMPOTENCY_KEY, RunAPIView, replayable


class QueueSerializer(fields.Serializer[Any]):
    """One queue in ``GET queues/`` (``queuety.queues.QueueStats``)."""

    name = fields.CharField()
    paused = fields.BooleanField()
    paused_at = fields.DateTimeField(allow_null=True)
    paused_by = fields.CharField(allow_blank=True, help_text=(
        "Who paused it; shown only to users who may pause and resume queues ('' otherwise)."))
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
    warning = fields.CharField(allow_blank=True, help_text=(
        "Set when a pause names a queue no step, pause or Celery setting names (a typo?); "
        "the pause is made anyway."))


QUEUE_NAME = OpenApiParameter("name", str, OpenApiParameter.PATH,
                              description="The Celery queue's name.")


def _shown(request: Request, stats: queues.QueueStats) -> dict[str, Any]:
    """``stats`` as ``request``'s user may see it: who paused only for those who may pause."""
    data = stats.to_dict()
    if not queues.may_act(request.user):
        data["paused_by"] = ""
    return data


@extend_schema(responses={200: QueueSerializer(many=True),
                          403: OpenApiResponse(serializers.ErrorSerializer)})
class QueueListView(RunAPIView):
    """``GET queues/``: every known queue (paused, or with waiting, running or recently
    finished steps), with its numbers."""

    required_permissions = {"GET": "queuety.view_workflowrun"}

    def get(self, request: Request) -> Response:
        if not queues.may_see(request.user):
            raise PermissionDenied("Queue numbers count every tenant's steps, and "
                                   "QUEUETY['RUN_ACCESS'] cannot narrow a count: only "
                                   "superusers see them (a RUN_SCOPE shows each user their "
                                   "own runs' numbers).")
        stats = queues.queue_stats(runs=queues.visible_runs(request.user))
        return Response(QueueSerializer([_shown(request, item) for item in stats],
                                        many=True).data)


@extend_schema(parameters=[QUEUE_NAME, IDEMPOTENCY_KEY], request=None,
               responses={200: QueueActionSerializer, **ERRORS})
class QueueActionView(RunAPIView):
    """``POST queues/<name>/pause/``: no step of the queue starts until it is resumed (its
    steps wait throttled, ``queue paused``); ``resume/``: its held steps start. Safe to
    repeat. 400 for a name longer than 255 characters."""

    action = ""
    required_permissions = {"POST": "queuety.change_workflowrun"}

    def post(self, request: Request, name: str) -> Response:
        if not queues.may_act(request.user):
            raise PermissionDenied("Queues are site-wide: on a site with QUEUETY['RUN_SCOPE'] "
                                   "or RUN_ACCESS, only superusers may pause or resume them.")
        if len(name.strip()) > queues.MAX_NAME:
            raise ParseError(f"A queue name has at most {queues.MAX_NAME} characters "
                                  f"(got {len(name)}).")
        return replayable(request, lambda: self._act(request, name))

    def _act(self, request: Request, name: str) -> Response:
        actor = f"api:user:{request.user.pk}:{request.user.get_username()}"
        released, warning = 0, ""
        if self.action == "pause":
            warning = queues.unknown_warning(name)
            name = queues.pause_queue(name, actor=actor).name
        else:
            released = queues.resume_queue(name, actor=actor)
        stats = queues.queue_stats([name], runs=queues.visible_runs(request.user))[0]
        return Response({"queue": QueueSerializer(_shown(request, stats)).data,
                         "released": released, "warning": warning})


class PauseQueueView(QueueActionView):
    action = "pause"


class ResumeQueueView(QueueActionView):
    action = "resume"
