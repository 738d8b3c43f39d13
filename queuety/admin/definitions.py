"""The definitions admin: immutable workflow shapes with their run counts per status, what
changed since the workflow's previous definition, and which of its definitions are drained."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, Exists, OuterRef, QuerySet
from django.http import (
    HttpRequest,
)
from django.urls import reverse
from django.utils.formats import date_format, number_format
from django.utils.html import format_html, format_html_join
from django.utils.timezone import localtime

from queuety import definition_diff, exceptions
from queuety.admin.display import pretty_json, reachable, status_badge
from queuety.admin.graph import definition_graph
from queuety.admin.quarantine import QuarantinePages
from queuety.core.definition import WorkflowSpec
from queuety.core.diff import DefinitionDiff
from queuety.models import (
    RunStatus,
    WorkflowDefinition,
    WorkflowRun,
)

# -- the definitions admin -----------------------------------------------------------------------

class DefinitionChangeList(ChangeList):
    """Adds the page's run counts per status, in one grouped query for the whole page."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        counts: dict[int, dict[str, int]] = {}
        for definition_pk, status, n in (
                reachable(request, WorkflowRun.objects.filter(
                    definition_id__in=[d.pk for d in self.result_list]))
                .values_list("definition_id", "status").annotate(n=Count("pk"))
                .order_by()):
            counts.setdefault(definition_pk, {})[status] = n
        for definition in self.result_list:
            definition.run_counts = counts.get(definition.pk, {})


#: The definition page's fields (all read-only: definitions are never edited).
_FIELDS = ("name", "version", "definition_hash", "created_at", "runs", "changes", "drain",
           "graph", "document")


if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs only: not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[WorkflowDefinition]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(QuarantinePages, _ModelAdmin):
    """Workflow definitions (immutable shapes) with their run counts per status."""

    list_display = ("id", "name", "version", "short_hash", "runs", "live_runs", "created_at")
    show_facets = admin.ShowFacets.NEVER
    list_display_links = ("id", "name")
    search_fields = ("name", "=definition_hash")
    ordering = ("-id",)
    fields = _FIELDS
    readonly_fields = _FIELDS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest,
                              obj: WorkflowDefinition | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest,
                              obj: WorkflowDefinition | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest,
                            obj: WorkflowDefinition | None = None) -> bool:
        # Whoever may see runs may see what they execute.
        return super().has_view_permission(request, obj) or request.user.has_perm(
            "queuety.view_workflowrun")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DefinitionChangeList

    def get_fields(self, request: HttpRequest,
                   obj: WorkflowDefinition | None = None) -> tuple[str, ...]:
        # What only an operator may do with the definition's runs.
        operate = request.user.has_perm("queuety.change_workflowrun")
        return (*_FIELDS, "moves") if operate else _FIELDS

    def get_readonly_fields(self, request: HttpRequest,
                            obj: WorkflowDefinition | None = None) -> tuple[str, ...]:
        return self.get_fields(request, obj)

    @admin.display(description="move its live runs")
    def moves(self, definition: WorkflowDefinition) -> str:
        url = reverse(f"{self.admin_site.name}:queuety_workflowrun_migrate")
        query = urlencode({"workflow": definition.name, "from": definition.pk})
        return format_html(
            '<a class="button" id="move-live-runs" href="{}?{}">Move its live runs to the '
            'latest version…</a> <span class="help">The dry run is shown first.</span>',
            url, query)

    def get_object(self, request: HttpRequest, object_id: str,
                   from_field: str | None = None) -> WorkflowDefinition | None:
        definition = super().get_object(request, object_id, from_field)
        if definition is not None:
            # The page's counts are of the runs this user may reach (RUN_SCOPE); the display
            # methods have no request, so the definition carries them.
            setattr(definition, "reachable_runs", reachable(request))  # noqa: B010
        return definition

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowDefinition]:
        # Part of the page's own query: whether a newer definition of the same workflow
        # exists, so the newest one (which new runs get) is never called drained.
        return super().get_queryset(request).annotate(superseded=Exists(
            WorkflowDefinition.objects.filter(name=OuterRef("name"), pk__gt=OuterRef("pk"))))

    @admin.display(description="version")
    def version(self, definition: WorkflowDefinition) -> str:
        return (definition.definition or {}).get("version") or "-"

    @admin.display(description="hash")
    def short_hash(self, definition: WorkflowDefinition) -> str:
        return format_html('<code title="{}">{}</code>', definition.definition_hash,
                           definition.definition_hash[:12])

    def _runs_url(self, definition_pk: int, status: str | None = None) -> str:
        url = reverse(f"{self.admin_site.name}:queuety_workflowrun_changelist")
        return f"{url}?definition={definition_pk}" + (f"&status__exact={status}" if status
                                                      else "")

    def _page_url(self, definition_pk: int) -> str:
        return reverse(f"{self.admin_site.name}:queuety_workflowdefinition_change",
                       args=[definition_pk])

    @admin.display(description="runs per status")
    def runs(self, definition: WorkflowDefinition) -> str:
        counts = getattr(definition, "run_counts", None)
        if counts is None:  # the detail page: one definition, one grouped query
            counts = dict(_runs_of(definition).filter(definition_id=definition.pk)
                          .values_list("status").annotate(n=Count("pk")).order_by()
                          .values_list("status", "n"))
        if not counts:
            return "no runs"
        parts = format_html_join(
            " ", '<a href="{}" style="text-decoration:none">{} {}</a>',
            ((self._runs_url(definition.pk, status), status_badge(status),
              number_format(counts[status], force_grouping=True))
             for status in RunStatus if status in counts))
        return format_html('{} <a href="{}">all</a>', parts, self._runs_url(definition.pk))

    @admin.display(description="live runs")
    def live_runs(self, definition: WorkflowDefinition) -> str:
        # From the changelist's grouped counts: no query of its own.
        live = definition_diff.live_count(getattr(definition, "run_counts", {}))
        if live or not getattr(definition, "superseded", False):
            return number_format(live, force_grouping=True)
        return format_html('0 <span title="{}">(drained: its code can go)</span>', _DRAINED)

    @admin.display(description="changes since the previous definition")
    def changes(self, definition: WorkflowDefinition) -> str:
        previous = definition_diff.previous_definition(definition)
        if previous is None:
            return "First definition of this workflow."
        diff = definition_diff.diff_rows(previous, definition)
        against = format_html('Against <a href="{}">{}</a>, the previous definition of this '
                              "workflow", self._page_url(previous.pk), diff.old.label())
        if diff.identical:
            return format_html("{}: no differences.", against)
        return format_html("{}:{}", against, _diff_table(diff))

    @admin.display(description="definitions of this workflow")
    def drain(self, definition: WorkflowDefinition) -> str:
        entries = definition_diff.drain(definition.name, _runs_of(definition))
        rows = format_html_join("", "<tr>{}</tr>", ((self._drain_cells(entry, definition.pk),)
                                                    for entry in entries))
        return format_html(
            '<table><thead><tr><th>definition</th><th>version</th><th>hash</th>'
            "<th>created</th><th>live runs</th><th>all runs</th><th></th></tr></thead>"
            "<tbody>{}</tbody></table>", rows)

    def _drain_cells(self, entry: definition_diff.Drain, current_pk: int) -> str:
        page = (format_html("<strong>{} (this page)</strong>", entry.id)
                if entry.id == current_pk
                else format_html('<a href="{}">{}</a>', self._page_url(entry.id), entry.id))
        state = (format_html('<span title="{}">drained: its code can go</span>', _DRAINED)
                 if entry.drained else "newest" if entry.newest else "")
        return format_html(
            '<td>{}</td><td>{}</td><td><code title="{}">{}</code></td><td>{}</td><td>{}</td>'
            '<td><a href="{}">{}</a></td><td>{}</td>', page, entry.version or "-",
            entry.definition_hash, entry.definition_hash[:12],
            date_format(localtime(entry.created_at), "DATETIME_FORMAT"),
            number_format(entry.live_runs, force_grouping=True), self._runs_url(entry.id),
            number_format(entry.total_runs, force_grouping=True), state)

    @admin.display(description="graph")
    def graph(self, definition: WorkflowDefinition) -> str:
        try:
            spec = WorkflowSpec.from_dict(definition.definition)
        except exceptions.WorkflowDefinitionError as error:
            return f"The graph cannot be drawn: {error}"
        return definition_graph(spec)

    @admin.display(description="definition")
    def document(self, definition: WorkflowDefinition) -> str:
        return format_html('<pre style="white-space:pre-wrap;margin:0">{}</pre>',
                           pretty_json(definition.definition, masked=False)[0])


def _runs_of(definition: WorkflowDefinition) -> QuerySet[WorkflowRun]:
    """The runs the page's user may reach (set by ``get_object``), for its counts."""
    runs: QuerySet[WorkflowRun] = getattr(definition, "reachable_runs", WorkflowRun.objects.all())
    return runs


#: What "drained" means, in the title of each mark.
_DRAINED = ("No live run (running, waiting or paused) uses this definition and a newer one "
            "replaced it: code that only it names can be removed.")


def _diff_table(diff: DefinitionDiff) -> str:
    """The diff's rows as a table: change, step, field, before, after."""
    rows = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td>"
            "<td><code>{}</code></td></tr>",
        ((row.change, row.step, row.field, row.before, row.after) for row in diff.rows()))
    return format_html(
        '<table class="queuety-diff"><thead><tr><th>change</th><th>step</th><th>field</th>'
        "<th>before</th><th>after</th></tr></thead><tbody>{}</tbody></table>", rows)
