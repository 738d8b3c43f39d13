"""The events list: every run's timeline events in one changelist, newest first.

Read-only, and only the events of runs in the user's ``RUN_SCOPE``. Filtered by kind,
workflow and age (the list filters), and by a run id or an error type (the search box),
through ``queuety.events_query``, so each filter reads an index (migration 0019); counts are
the planner's estimate past 10,000 rows, and only the default order is offered. Each row
links to its run's page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from queuety import events_query, scope
from queuety.admin.display import EVENT_DATA_CHARS, pretty_json
from queuety.admin.filters import EstimatedCountPaginator, NameFilter
from queuety.events_query import EventFilters
from queuety.models import Event

if TYPE_CHECKING:  # generic in django-stubs only: not subscriptable at run time
    _EventAdmin = admin.ModelAdmin[Event]
else:
    _EventAdmin = admin.ModelAdmin

#: The kinds the kind filter offers (any other works in the URL: ``?kind=...``).
KINDS = ("workflow_started", "step_completed", "step_retried", "step_failed", "item_failed",
         "workflow_failed", "workflow_completed", "signal_received", "wait_settled",
         "wait_timed_out", "workflow_paused", "workflow_resumed", "workflow_cancelled",
         "workflow_deadline_exceeded", "workflow_retried", "state_edited")
#: The ages the "since" filter offers.
AGES = (("15m", "last 15 minutes"), ("1h", "last hour"), ("1d", "last day"),
        ("7d", "last 7 days"))


class KindFilter(admin.SimpleListFilter):
    """Events of one kind."""

    title = "event"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in KINDS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return events_query.narrow(queryset, EventFilters(kind=value)) if value else queryset


class WorkflowFilter(NameFilter):
    """Events of the runs of one workflow (the choices: the definitions' names)."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return (events_query.narrow(queryset, EventFilters(workflow=value)) if value
                else queryset)


class SinceFilter(admin.SimpleListFilter):
    """Events of the last quarter hour, hour, day or week."""

    title = "since"
    parameter_name = "since"

    def lookups(self, request: HttpRequest,
                model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return list(AGES)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        try:
            since = events_query.parse_since(value)
        except events_query.InvalidEventFilter:
            return queryset.none()
        return events_query.narrow(queryset, EventFilters(since=since))


@admin.register(Event)
class EventAdmin(_EventAdmin):
    """Events across runs: kind, run (a link to its page), workflow, step, error."""

    list_display = ("pk", "created_at", "kind", "run_link", "workflow", "step_name", "attempt",
                    "duration_ms", "error")
    list_display_links = ("pk",)
    list_filter = (KindFilter, WorkflowFilter, SinceFilter)
    search_fields = ("kind",)  # see get_search_results
    search_help_text = "A run id (123 or #123), or an error type (ValueError, exact)."
    ordering = ("-created_at", "-id")
    sortable_by = ()  # only the indexed order: any other would sort the whole table
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 100
    readonly_fields = ("run_link", "workflow", "kind", "step_index", "step_name", "attempt",
                       "duration_ms", "created_at", "data_json")
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Event]:
        # An event is its run's data: only those of runs in the user's RUN_SCOPE, in the
        # list, its filters, its search and each event's page. The run's name comes by a
        # join, without the run's big JSON columns.
        events = super().get_queryset(request).select_related("run").only(
            "id", "run_id", "run__name", "kind", "step_index", "step_name", "attempt",
            "duration_ms", "data", "created_at")
        return scope.through_runs(request.user, events)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Event],
                           search_term: str) -> tuple[QuerySet[Event], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        number = term.removeprefix("#")
        try:
            filters = (EventFilters(run_id=events_query.parse_run(number)) if number.isdigit()
                       else EventFilters.parse(error_type=term))
        except events_query.InvalidEventFilter:
            return queryset.none(), False
        return events_query.narrow(queryset, filters), False

    @admin.display(description="run")
    def run_link(self, event: Event) -> str:
        return format_html('<a href="{}">#{}</a>', reverse(
            "admin:queuety_workflowrun_change", args=[event.run_id]), event.run_id)

    @admin.display(description="workflow")
    def workflow(self, event: Event) -> str:
        return str(event.run.name)

    @admin.display(description="error")
    def error(self, event: Event) -> str:
        found = events_query.error_type(event.data)
        if found is None:
            return "-"
        message = str((event.data.get("error") or {}).get("message", ""))
        return f"{found}: {message}"[:80]

    @admin.display(description="data")
    def data_json(self, event: Event) -> Any:
        return format_html("<pre>{}</pre>", pretty_json(event.data, EVENT_DATA_CHARS)[0])

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Events are runs' data: whoever may view runs may view them.
        return bool(request.user.has_perm("queuety.view_workflowrun")
                    or super().has_view_permission(request, obj))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
