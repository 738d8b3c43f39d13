"""The definitions admin: immutable workflow shapes with their run counts per status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count
from django.http import (
    HttpRequest,
)
from django.urls import reverse
from django.utils.formats import number_format
from django.utils.html import format_html, format_html_join

from queuety.admin.display import pretty_json, status_badge
from queuety.admin.quarantine import QuarantinePages
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
                WorkflowRun.objects.filter(definition_id__in=[d.pk for d in self.result_list])
                .values_list("definition_id", "status").annotate(n=Count("pk"))
                .order_by()):
            counts.setdefault(definition_pk, {})[status] = n
        for definition in self.result_list:
            definition.run_counts = counts.get(definition.pk, {})


if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs only: not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[WorkflowDefinition]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(QuarantinePages, _ModelAdmin):
    """Workflow definitions (immutable shapes) with their run counts per status."""

    list_display = ("id", "name", "version", "short_hash", "runs", "created_at")
    show_facets = admin.ShowFacets.NEVER
    list_display_links = ("id", "name")
    search_fields = ("name", "=definition_hash")
    ordering = ("-id",)
    fields = ("name", "version", "definition_hash", "created_at", "runs", "document")
    readonly_fields = fields

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

    @admin.display(description="version")
    def version(self, definition: WorkflowDefinition) -> str:
        return (definition.definition or {}).get("version") or "-"

    @admin.display(description="hash")
    def short_hash(self, definition: WorkflowDefinition) -> str:
        return format_html('<code title="{}">{}</code>', definition.definition_hash,
                           definition.definition_hash[:12])

    def _runs_url(self, definition: WorkflowDefinition, status: str | None = None) -> str:
        url = reverse(f"{self.admin_site.name}:queuety_workflowrun_changelist")
        return f"{url}?definition={definition.pk}" + (f"&status__exact={status}" if status
                                                      else "")

    @admin.display(description="runs per status")
    def runs(self, definition: WorkflowDefinition) -> str:
        counts = getattr(definition, "run_counts", None)
        if counts is None:  # the detail page: one definition, one grouped query
            counts = dict(WorkflowRun.objects.filter(definition_id=definition.pk)
                          .values_list("status").annotate(n=Count("pk")).order_by()
                          .values_list("status", "n"))
        if not counts:
            return "no runs"
        parts = format_html_join(
            " ", '<a href="{}" style="text-decoration:none">{} {}</a>',
            ((self._runs_url(definition, status), status_badge(status),
              number_format(counts[status], force_grouping=True))
             for status in RunStatus if status in counts))
        return format_html('{} <a href="{}">all</a>', parts, self._runs_url(definition))

    @admin.display(description="definition")
    def document(self, definition: WorkflowDefinition) -> str:
        return format_html('<pre style="white-space:pre-wrap;margin:0">{}</pre>',
                           pretty_json(definition.definition, masked=False)[0])
