"""The jobs admin: Django tasks run by Queuety (``queuety.tasks_backend``), listed as jobs.

A job is a run (of a task's one-step workflow, ``task:<module path>``), so this is a second
changelist over the same rows, the :class:`queuety.models.Job` proxy: filtered by task, queue
and status in the framework's words (and buried), each row showing what the job returned or
why it failed. A job's page is its run's page (the timeline, the state, the actions); the bulk
actions retry and cancel through ``queuety.operations``, as the runs list's do. The runs'
permissions govern jobs, and ``QUEUETY["RUN_SCOPE"]`` narrows the list as it narrows runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings as django_settings
from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from queuety import operations
from queuety.admin import display
from queuety.admin.actions import bulk_outcome
from queuety.admin.display import STATUS_COLOURS
from queuety.admin.filters import EstimatedCountPaginator
from queuety.masking import mask
from queuety.models import (
    JOB_PREFIX,
    Job,
    RunStatus,
    StepRun,
    StepStatus,
    WorkflowDefinition,
)

#: Columns the list reads. The state is read for the task's queue and its return value (a
#: job's state is its arguments and its result, not a workflow's growing document).
LIST_COLUMNS = ("id", "definition_id", "name", "status", "state", "error", "created_at",
                "finished_at")

#: Characters of a return value or an error shown in the list.
PREVIEW_CHARS = 200

#: The framework's words for a job's status (``TaskResultStatus``), and "buried"; each with
#: the runs that have it and the colour of the run status it stands for.
STATUSES: dict[str, tuple[Q, str]] = {
    "READY": (Q(status__in=[RunStatus.RUNNING, RunStatus.PAUSED]) & Q(attempt_running=False),
              RunStatus.PAUSED),
    "RUNNING": (Q(status=RunStatus.RUNNING) & Q(attempt_running=True), RunStatus.RUNNING),
    "SUCCESSFUL": (Q(status=RunStatus.COMPLETED), RunStatus.COMPLETED),
    "FAILED": (Q(status__in=[RunStatus.FAILED, RunStatus.CANCELLED]), RunStatus.FAILED),
}

if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs only: not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[Job]
else:
    _ModelAdmin = admin.ModelAdmin


def task_status(job: Any) -> str:
    """A listed job's status in the framework's words (``READY``, ``RUNNING``,
    ``SUCCESSFUL``, ``FAILED``), from its run's status and whether an attempt is running."""
    if job.status == RunStatus.COMPLETED:
        return "SUCCESSFUL"
    if job.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        return "FAILED"
    return "RUNNING" if getattr(job, "attempt_running", False) else "READY"


def site_queues() -> list[str]:
    """The queue names the site's Queuety tasks backends list (``TASKS[...]['QUEUES']``;
    a backend that lists none takes ``default`` only)."""
    found: set[str] = set()
    for params in getattr(django_settings, "TASKS", {}).values():
        if str(params.get("BACKEND", "")).startswith("queuety."):
            found.update(params.get("QUEUES") or ["default"])
    return sorted(found)


class TaskFilter(admin.SimpleListFilter):
    """Filter jobs by task (module path); choices come from the (small) definitions table."""

    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        names = (WorkflowDefinition.objects.filter(name__startswith=JOB_PREFIX)
                 .order_by("name").values_list("name", flat=True).distinct())
        return [(name.removeprefix(JOB_PREFIX), name.removeprefix(JOB_PREFIX))
                for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if not value else queryset.filter(name=JOB_PREFIX + value)


class QueueFilter(admin.SimpleListFilter):
    """Filter jobs by the framework's ``queue_name`` they were enqueued on."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [(name, name) for name in site_queues()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if not value else queryset.filter(state__task__queue_name=value)


class TaskStatusFilter(admin.SimpleListFilter):
    """Filter jobs by status in the framework's words, and by how a failed one ended:
    buried (failed for good) or cancelled."""

    title = "status"
    parameter_name = "task_status"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [("READY", "Ready"), ("RUNNING", "Running"), ("SUCCESSFUL", "Successful"),
                ("FAILED", "Failed (buried or cancelled)"), ("buried", "Buried"),
                ("cancelled", "Cancelled")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in STATUSES:
            return queryset.filter(STATUSES[value][0])
        if value == "buried":
            return queryset.filter(status=RunStatus.FAILED)
        if value == "cancelled":
            return queryset.filter(status=RunStatus.CANCELLED)
        return queryset


def _preview(value: Any) -> str:
    text = str(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


@admin.register(Job)
class JobAdmin(_ModelAdmin):
    """Jobs: the runs of tasks, with their result or error; each links to its run's page.

    Viewing needs ``queuety.view_workflowrun``; retry and cancel need
    ``queuety.change_workflowrun`` (a job is a run). Nothing is editable by hand.
    """

    list_display = ("run_link", "task", "status_display", "queue", "attempts", "result",
                    "errors", "enqueued", "finished")
    list_display_links = None
    list_filter = (TaskStatusFilter, TaskFilter, QueueFilter)
    search_fields = ("name",)  # see get_search_results
    search_help_text = "A job id, or the beginning of a task's module path (case-sensitive)."
    ordering = ("-id",)
    sortable_by = ("run_link", "enqueued")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 100
    actions = ["retry_selected", "cancel_selected"]

    # -- permissions: the runs'

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm("queuety.view_workflowrun"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("queuety.change_workflowrun"))

    # -- the list

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # The user's RUN_SCOPE in SQL, as for the runs list: the list, its filters and the
        # bulk actions never see another tenant's jobs.
        last = StepRun.objects.filter(run_id=OuterRef("pk"), kind="step").order_by("-seq")
        jobs = super().get_queryset(request).only(*LIST_COLUMNS).annotate(
            attempt_running=Exists(StepRun.objects.filter(
                run_id=OuterRef("pk"), kind="step", status=StepStatus.PROCESSING)),
            last_attempt=Subquery(last.values("attempt")[:1]),
            last_error=Subquery(last.values("error")[:1]))
        return cast("QuerySet[Job]", display.reachable(request, jobs))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Job],
                           search_term: str) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        where = Q(name__startswith=JOB_PREFIX + term)
        number = term.removeprefix("#")
        if number.isdigit() and len(number) < 19:
            where |= Q(pk=int(number))
        return queryset.filter(where), False

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """A job's page is its run's page."""
        return HttpResponseRedirect(self._run_url(object_id))

    def _run_url(self, run_id: Any) -> str:
        return reverse(f"{self.admin_site.name}:queuety_workflowrun_change", args=[run_id],
                       current_app=self.admin_site.name)

    @admin.display(description="job", ordering="id")
    def run_link(self, job: Job) -> str:
        return format_html('<a href="{}">#{}</a>', self._run_url(job.pk), job.pk)

    @admin.display(description="task")
    def task(self, job: Job) -> str:
        return format_html("<code>{}</code>", job.name.removeprefix(JOB_PREFIX))

    @admin.display(description="status")
    def status_display(self, job: Job) -> str:
        word = task_status(job)
        colour_of = STATUSES[word][1]
        if job.status == RunStatus.FAILED:
            word, colour_of = "FAILED (buried)", RunStatus.FAILED
        elif job.status == RunStatus.CANCELLED:
            word, colour_of = "FAILED (cancelled)", RunStatus.CANCELLED
        return format_html(
            '<span class="queuety-status" style="background:{};color:#fff;padding:1px 7px;'
            'border-radius:9px;white-space:nowrap;font-size:0.92em">{}</span>',
            STATUS_COLOURS.get(colour_of, "#444444"), word)

    @admin.display(description="queue")
    def queue(self, job: Job) -> str:
        recorded = job.state.get("task") if isinstance(job.state, dict) else None
        return str(recorded.get("queue_name", "-")) if isinstance(recorded, dict) else "-"

    @admin.display(description="attempts")
    def attempts(self, job: Job) -> int:
        return int(getattr(job, "last_attempt", 0) or 0)

    @admin.display(description="result")
    def result(self, job: Job) -> str:
        if job.status != RunStatus.COMPLETED or not isinstance(job.state, dict):
            return "-"
        # Values of keys a site marks secret (SECRET_KEYS) are masked, as on the run page.
        value = mask({"return_value": job.state.get("return_value")})["return_value"]
        return format_html("<code>{}</code>", _preview(value))

    @admin.display(description="errors")
    def errors(self, job: Job) -> str:
        error = job.error or getattr(job, "last_error", None)
        if not isinstance(error, dict) or not error:
            return "-"
        will_retry = job.error is None and job.status == RunStatus.RUNNING
        note = " (will retry)" if will_retry else ""
        return format_html('<span title="{}">{}: {}{}</span>', error.get("message", ""),
                           error.get("type", "error"), _preview(error.get("message", "")), note)

    @admin.display(description="enqueued", ordering="id")
    def enqueued(self, job: Job) -> str:
        return timezone.localtime(job.created_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="finished")
    def finished(self, job: Job) -> str:
        if job.finished_at is None:
            return "-"
        return timezone.localtime(job.finished_at).strftime("%Y-%m-%d %H:%M:%S")

    # -- bulk actions, over queuety.operations as the runs list's

    def _bulk(self, request: HttpRequest, queryset: QuerySet[Job],
              operation: Callable[..., Any], done_one: str, done_many: str) -> None:
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:display.BULK_LIMIT + 1])
        if len(ids) > display.BULK_LIMIT:
            self.message_user(request, f"At most {display.BULK_LIMIT} jobs can be handled at "
                              "once; select fewer jobs (filter the list first).", messages.ERROR)
            return
        for text, level in bulk_outcome(request, ids, operation, done_one, done_many,
                                        ("job", "jobs")):
            self.message_user(request, text, level)

    @admin.action(description="Retry selected failed jobs", permissions=["operate"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._bulk(request, queryset, operations.retry,
                   "Job %(ids)s was scheduled for retry.",
                   "Jobs %(ids)s were scheduled for retry.")

    @admin.action(description="Cancel selected jobs", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._bulk(request, queryset, operations.cancel,
                   "Job %(ids)s was cancelled.", "Jobs %(ids)s were cancelled.")
