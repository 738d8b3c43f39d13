"""API views of jobs (the tasks of Django's tasks framework): ``GET jobs/``,
``GET jobs/<id>/``, ``POST jobs/<id>/retry/`` and ``POST jobs/<id>/cancel/``; thin over
``queuety.jobs.operations``."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from queuety.api import exceptions as api_errors
from queuety.api import job_serializers
from queuety.api.control import RunCursorPagination
from queuety.api.views import ERRORS, IDEMPOTENCY_KEY, MAX_RUN_ID, RunAPIView, replayable
from queuety.jobs import operations as jobs
from queuety.models import WorkflowRun

JOB_ID = OpenApiParameter(
    "id", {"type": "integer", "minimum": 1, "maximum": MAX_RUN_ID}, OpenApiParameter.PATH,
    description="The job's id (its run's id).")
JOB_FILTERS = [
    OpenApiParameter("task", str, description="Only jobs of this task (its module path)."),
    OpenApiParameter("queue_name", str, description="Only jobs with this queue_name."),
    OpenApiParameter("status", str, enum=list(jobs.STATUSES),
                     description="Only jobs with this status (buried: failed for good)."),
    OpenApiParameter("cursor", str, description="The page: from a previous answer's next or "
                                                "previous link."),
    OpenApiParameter("page_size", int, description="Jobs per page (default 50, at most 200)."),
]


class JobCursorPagination(RunCursorPagination):
    """Newest first, by id, as ``GET runs/``; smaller pages, since a job is read in full."""

    max_page_size = 200


class JobAPIView(RunAPIView):
    """Base: a job's own errors as JSON answers (404 ``job_not_found``, 400
    ``invalid_filter``, 403), then the run views' own."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, jobs.JobNotFound):
            exc = api_errors.QueuetyAPIError(str(exc), "job_not_found",
                                             status.HTTP_404_NOT_FOUND)
        elif isinstance(exc, jobs.InvalidJobFilter):
            exc = api_errors.QueuetyAPIError(str(exc), "invalid_filter",
                                             status.HTTP_400_BAD_REQUEST)
        elif isinstance(exc, jobs.JobAccessDenied):
            exc = api_errors.QueuetyAPIError(str(exc), "permission_denied",
                                             status.HTTP_403_FORBIDDEN)
        return super().handle_exception(exc)

    def get_job(self, pk: int) -> WorkflowRun:
        """Job ``pk`` as this request's user may reach it: outside their ``RUN_SCOPE``, or a
        run that is no job, a 404; refused by the permission classes, a 403."""
        run = jobs.find_job(pk, self.request.user)
        self.check_object_permissions(self.request, run)
        return run

    def job_json(self, run: WorkflowRun) -> dict[str, Any]:
        """Job ``run`` as the endpoints answer it, with its links."""
        request = self.request
        return {**jobs.describe(run),
                "url": request.build_absolute_uri(reverse("queuety:job-detail",
                                                          args=[run.pk])),
                "run_url": request.build_absolute_uri(reverse("queuety:run-detail",
                                                              args=[run.pk]))}


class JobListSchema(AutoSchema):
    """``jobs_list``: drf-spectacular would name ``GET jobs/`` like ``GET jobs/<id>/``."""

    def get_operation_id(self) -> str:
        return "jobs_list"


@extend_schema(parameters=JOB_FILTERS,
               responses={200: job_serializers.JobPageSerializer, **ERRORS})
class JobListView(JobAPIView):
    """``GET jobs/``: jobs newest first, cursor-paginated, filtered by ``task``,
    ``queue_name`` and ``status``; only those inside the user's ``RUN_SCOPE``, and with
    ``RUN_ACCESS`` only those it allows."""

    schema = JobListSchema()
    required_permissions = {"GET": "queuety.view_workflowrun"}

    def get(self, request: Request) -> Response:
        params = request.query_params
        runs = jobs.jobs_matching(task=params.get("task"), queue_name=params.get("queue_name"),
                                  status=params.get("status"), user=request.user)
        paginator = JobCursorPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        assert page is not None  # always paginated
        allowed = [run for run in page
                   if all(p.has_object_permission(request, self, run)
                          for p in self.get_permissions())]
        return paginator.get_paginated_response(
            job_serializers.JobSerializer([self.job_json(run) for run in allowed],
                                          many=True).data)


@extend_schema(parameters=[JOB_ID], responses={200: job_serializers.JobSerializer, **ERRORS})
class JobDetailView(JobAPIView):
    """``GET jobs/<id>/``: one job; a run that is no job's is a 404."""

    required_permissions = {"GET": "queuety.view_workflowrun"}

    def get(self, request: Request, pk: int) -> Response:
        return Response(job_serializers.JobSerializer(self.job_json(self.get_job(pk))).data)


@extend_schema(parameters=[JOB_ID, IDEMPOTENCY_KEY], request=None,
               responses={200: job_serializers.JobSerializer, **ERRORS})
class JobActionView(JobAPIView):
    """``POST jobs/<id>/retry/`` (a buried job runs again) and ``POST jobs/<id>/cancel/``
    (an unfinished job): the job as it stands after; a job whose status does not allow it is
    a 409 ``invalid_transition``."""

    action = ""
    required_permissions = {"POST": "queuety.change_workflowrun"}

    def post(self, request: Request, pk: int) -> Response:
        self.get_job(pk)
        return replayable(request, lambda: self._act(request, pk))

    def _act(self, request: Request, pk: int) -> Response:
        operation = jobs.retry if self.action == "retry" else jobs.cancel
        operation(pk, actor=actor(request), user=request.user)
        run = WorkflowRun.objects.get(pk=pk)
        return Response(job_serializers.JobSerializer(self.job_json(run)).data)


def actor(request: Request) -> str:
    """How a job's timeline names the API user who operated it (as for runs)."""
    return f"api:user:{request.user.pk}:{request.user.get_username()}"


class JobRetryView(JobActionView):
    action = "retry"


class JobCancelView(JobActionView):
    action = "cancel"
