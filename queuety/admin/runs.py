"""The runs admin: a fast changelist, the run page with its actions, approvals and exports."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import capfirst
from django.utils.translation import gettext

from queuety import exceptions, export, machines, operations, queries, replyforms, state_edits
from queuety.admin import artifacts, bulk, display
from queuety.admin.actions import (
    RUN_ACTIONS,
    LockedRun,
    StaleForm,
    bulk_outcome,
    valid_actions,
)
from queuety.admin.display import (
    EVENT_DATA_CHARS,
    HUMAN_WAITS,
    STATE_PREVIEW_CHARS,
    TIMELINE_PAGE_SIZE,
    pretty_json,
    status_badge,
)
from queuety.admin.filters import (
    DefinitionFilter,
    EstimatedCountPaginator,
    NameFilter,
    VersionFilter,
    WaitingFilter,
)
from queuety.admin.graph import run_graph
from queuety.admin.migrate import MigrationPages
from queuety.admin.start import StartRunPages
from queuety.admin.state_edit import StateEditPages
from queuety.admin.tags import TagColumn, TagFilter, tag_search
from queuety.core import budget as budgets
from queuety.core import imports
from queuety.core.definition import WorkflowSpec
from queuety.core.describe import describe_step, format_status, human_duration, waiting_label
from queuety.core.status import WorkflowStatus
from queuety.masking import mask
from queuety.models import (
    Event,
    RunStatus,
    Signal,
    StepRun,
    WorkflowDependency,
    WorkflowRun,
)
from queuety.queries import waiting_on
from queuety.store import rows
from queuety.store.definitions import definition_hash, effective_policy, load_spec

# -- the runs admin ------------------------------------------------------------------------------

#: Columns the changelist reads: the run row minus its big JSON columns (state, error, cleanup).
LIST_COLUMNS = ("id", "definition_id", "name", "status", "current_step", "total_steps",
                "idempotency_key", "transitions", "cost_units", "started_workflows",
                "created_at", "finished_at", "tags")


if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs only: not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[WorkflowRun]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(WorkflowRun)
class WorkflowRunAdmin(TagColumn, StartRunPages, MigrationPages, StateEditPages, _ModelAdmin):
    """Workflow runs: a fast changelist, a run page with its actions, approvals and exports.

    Viewing needs ``queuety.view_workflowrun``; retry, pause, resume and cancel need
    ``queuety.change_workflowrun``; approve, reject and input need
    ``queuety.signal_workflowrun``. Nothing is editable by hand.
    """

    list_display = ("id", "status_display", "name", "version", "short_hash", "idempotency_key",
                    "step_display", "waiting_for", "budget_use", "tags_display", "started",
                    "duration")
    list_filter = ("status", NameFilter, VersionFilter, WaitingFilter, TagFilter,
                   DefinitionFilter)
    search_fields = ("name", "idempotency_key")  # see get_search_results
    search_help_text = ("A run id, a tag as key:value (customer:42), or the beginning of a "
                        "workflow name or idempotency key (case-sensitive).")
    ordering = ("-id",)
    # Only orderings an index serves: id (and "started", which follows id) stay fast on
    # millions of rows; sorting by any other column would sort the whole table.
    sortable_by = ("id", "started")
    show_full_result_count = False
    # Facet counts run one COUNT per filter choice: never on a table of millions of runs.
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 100
    actions = ["export_selected", "retry_selected", "pause_selected", "resume_selected",
               "cancel_selected", "migrate_selected"]

    # -- permissions: read-only, actions need their own permission

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest,
                              obj: WorkflowRun | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest,
                              obj: WorkflowRun | None = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queuety.change_workflowrun")

    def has_signal_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queuety.signal_workflowrun")

    # -- the changelist

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        # The user's RUN_SCOPE in SQL: the changelist, its counts, its filters and the bulk
        # actions (which act on this queryset) never see another tenant's runs.
        return display.reachable(request, super().get_queryset(request)).only(*LIST_COLUMNS)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[WorkflowRun],
                           search_term: str) -> tuple[QuerySet[WorkflowRun], bool]:
        # Exact id, or a prefix of the name or key: each is served by an index (the CharField
        # indexes come with a varchar_pattern_ops twin on PostgreSQL), unlike icontains.
        term = search_term.strip()
        if not term:
            return queryset, False
        where = Q(name__startswith=term) | Q(idempotency_key__startswith=term)
        if (tag := tag_search(term)) is not None:  # a tag, when the term is one
            where |= tag
        number = term.removeprefix("#")
        if number.isdigit() and len(number) < 19:
            where |= Q(pk=int(number))
        return queryset.filter(where), False

    @staticmethod
    def spec(run: WorkflowRun) -> WorkflowSpec | None:
        """The run's definition (cached per process: no query per row); None when it no
        longer loads here (a class its retry policy names was removed, say): the changelist
        still shows the run, from its row."""
        try:
            return load_spec(run.definition_id)
        except (exceptions.WorkflowDefinitionError, KeyError, TypeError, ValueError):
            return None

    @admin.display(description="status", ordering="status")
    def status_display(self, run: WorkflowRun) -> str:
        return status_badge(run.status)

    @admin.display(description="version")
    def version(self, run: WorkflowRun) -> str:
        spec = self.spec(run)
        return "definition does not load" if spec is None else spec.version or "-"

    @admin.display(description="hash")
    def short_hash(self, run: WorkflowRun) -> str:
        full = definition_hash(run.definition_id)
        return format_html('<code title="{}">{}</code>', full, full[:12])

    @admin.display(description="current step")
    def step_display(self, run: WorkflowRun) -> str:
        spec = self.spec(run)
        steps = () if spec is None else spec.steps
        if run.current_step >= len(steps):
            return "-"
        return f"{steps[run.current_step].name} ({run.current_step + 1}/{run.total_steps})"

    @admin.display(description="waiting for")
    def waiting_for(self, run: WorkflowRun) -> str:
        spec = self.spec(run)
        return "-" if spec is None else waiting_label(run.status, run.current_step, spec) or "-"

    @admin.display(description="budget use")
    def budget_use(self, run: WorkflowRun) -> str:
        """The budget closest to its limit, e.g. ``transitions 12/20``."""
        spec = self.spec(run)
        if spec is None:
            return "-"
        limits = spec.budget.configured()
        usage = {"transitions": run.transitions, "cost_units": run.cost_units,
                 "started_workflows": run.started_workflows}
        # State bytes are left out here: they would need the (possibly large) state column.
        candidates = [(usage[counter] / limits[name], counter, usage[counter], limits[name])
                      for name, counter in budgets.COUNTER_OF.items()
                      if name in limits and counter in usage]
        if not candidates:
            return "-"
        ratio, counter, used, limit = max(candidates)
        colour = "#b3261e" if ratio >= 1 else "#a85d00" if ratio >= 0.8 else "inherit"
        return format_html('<span style="color:{};white-space:nowrap">{} {}/{}</span>',
                           colour, counter.replace("_", " "), used, limit)

    @admin.display(description="started", ordering="id")
    def started(self, run: WorkflowRun) -> str:
        # Compact and sortable by eye; the run page shows the localised form.
        # strftime, not date_format: it is a tenth of the cost, on every row of every page.
        return format_html('<span style="white-space:nowrap">{}</span>',
                           timezone.localtime(run.created_at).strftime("%Y-%m-%d %H:%M:%S"))

    @admin.display(description="duration")
    def duration(self, run: WorkflowRun) -> str:
        if run.finished_at is not None:
            return human_duration((run.finished_at - run.created_at).total_seconds())
        so_far = human_duration((timezone.now() - run.created_at).total_seconds())
        return format_html('<span title="still going" style="white-space:nowrap">{} …</span>',
                           so_far)

    # -- bulk actions of the changelist

    def _selected_ids(self, request: HttpRequest,
                      queryset: QuerySet[WorkflowRun]) -> list[int] | None:
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:display.BULK_LIMIT + 1])
        if len(ids) > display.BULK_LIMIT:
            self.message_user(request, f"At most {display.BULK_LIMIT} runs can be handled at once; "
                                       "select fewer runs (filter the list first).",
                              messages.ERROR)
            return None
        return ids

    @admin.action(description="Download JSON export of selected runs", permissions=["view"])
    def export_selected(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
                        ) -> HttpResponse | StreamingHttpResponse | None:
        ids = self._selected_ids(request, queryset)
        if ids is None:
            return None
        if len(ids) == 1:
            return self._export_response(ids[0])

        def lines() -> Iterator[str]:
            # JSON Lines: one complete export document per line, streamed run by run.
            for pk in ids:
                try:
                    yield json.dumps(mask(export.export(pk)), ensure_ascii=False) + "\n"
                except exceptions.RunNotFound:
                    continue  # purged between the selection and the download

        response = StreamingHttpResponse(lines(), content_type="application/x-ndjson")
        response["Content-Disposition"] = (
            f'attachment; filename="queuety-runs-{ids[0]}-{ids[-1]}.jsonl"')
        return response

    def _bulk(self, request: HttpRequest, queryset: QuerySet[WorkflowRun],
              operation: Callable[..., Any], done_one: str, done_many: str
              ) -> HttpResponse | None:
        # "Select all N": a durable bulk operation over the changelist's filter instead.
        across = bulk.start_across(request, operation.__name__)
        ids = None if across is not None else self._selected_ids(request, queryset)
        if ids is None:
            return across
        for text, level in bulk_outcome(request, ids, operation, done_one, done_many,
                                        ("run", "runs")):
            self.message_user(request, text, level)
        return None

    @admin.action(description="Retry selected failed runs", permissions=["operate"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
                    ) -> HttpResponse | None:
        return self._bulk(request, queryset, operations.retry,
                   "Run %(ids)s was scheduled for retry.", "Runs %(ids)s were scheduled for retry.")

    @admin.action(description="Pause selected runs", permissions=["operate"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
                    ) -> HttpResponse | None:
        return self._bulk(request, queryset, operations.pause,
                   "Run %(ids)s was paused.", "Runs %(ids)s were paused.")

    @admin.action(description="Resume selected paused runs", permissions=["operate"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
                    ) -> HttpResponse | None:
        return self._bulk(request, queryset, operations.resume,
                   "Run %(ids)s was resumed.", "Runs %(ids)s were resumed.")

    @admin.action(description="Cancel selected runs", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]
                    ) -> HttpResponse | None:
        return self._bulk(request, queryset, operations.cancel,
                   "Run %(ids)s was cancelled.", "Runs %(ids)s were cancelled.")

    # -- URLs

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("approvals/", wrap(self.approvals_view), name=f"{prefix}_approvals"),
            *self.start_urls(),
            *self.migrate_urls(),
            *self.state_edit_urls(),
            path("<int:object_id>/export/", wrap(self.export_view), name=f"{prefix}_export"),
            path("<int:object_id>/artifacts/<str:key>/", wrap(self.artifact_view),
                 name=f"{prefix}_artifact"),
            path("<int:object_id>/chunks/<int:step_run_id>/", wrap(self.chunks_view),
                 name=f"{prefix}_chunks"),
            path("<int:object_id>/act/<slug:action>/", wrap(self.action_view),
                 name=f"{prefix}_act"),
            *super().get_urls(),
        ]

    def _url(self, name: str, *args: Any) -> str:
        return reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_"
                       f"{name}", args=args, current_app=self.admin_site.name)

    def _context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]:
        return {**self.admin_site.each_context(request), "opts": self.opts,
                "app_label": self.opts.app_label, **extra}

    def _breadcrumbs(self, current: str) -> dict[str, Any]:
        """Home > the app > the runs > ``current``, for breadcrumbs.html.

        In the markup of the running Django, as its own admin templates do: Django 6.1 styles
        an ``<ol class="breadcrumbs">`` of items, earlier versions a ``<div>`` of links.
        """
        site = self.admin_site.name
        return {"crumbs": [
            (reverse(f"{site}:index", current_app=site), gettext("Home")),
            (reverse(f"{site}:app_list", kwargs={"app_label": self.opts.app_label},
                     current_app=site), self.opts.app_config.verbose_name),
            (self._url("changelist"), capfirst(self.opts.verbose_name_plural)),
        ], "crumb_current": current, "breadcrumbs_as_list": django.VERSION >= (6, 1)}

    # -- the run page

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The run page (replaces the edit form: runs are never edited by hand)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        pk = int(object_id) if str(object_id).isdigit() else None
        # The run row is read before the status and the rest: the revision the forms carry is
        # then never newer than what the page shows, so a stale page is always refused.
        run = display.reachable(request, WorkflowRun.objects.select_related("definition")
                             .filter(pk=pk)).first() if pk is not None else None
        if run is None:
            self.message_user(request, f"Workflow run {object_id} does not exist; it may "
                                       "have been purged.", messages.WARNING)
            return HttpResponseRedirect(self._url("changelist"))
        try:
            status = queries.workflow_status(run.pk)
        except exceptions.RunNotFound:  # purged between the two reads
            return HttpResponseRedirect(self._url("changelist"))
        try:
            spec = load_spec(run.definition_id)
        except exceptions.WorkflowDefinitionError as error:  # e.g. a deploy removed a class
            self.message_user(request, f"Workflow run {run.pk} ({status.status}) cannot be "
                                       f"shown: {error}", messages.ERROR)
            return HttpResponseRedirect(self._url("changelist"))
        step = spec.steps[run.current_step] if run.current_step < len(spec.steps) else None
        wait = step.wait if step is not None and status.wait_type else None

        allowed = {"operate": self.has_operate_permission(request),
                   "signal": self.has_signal_permission(request)}
        actions = [RUN_ACTIONS[name] for name in valid_actions(run, spec)
                   if allowed[RUN_ACTIONS[name].permission]]
        state_text, state_cut = pretty_json(
            run.state, None if request.GET.get("state") == "all" else STATE_PREVIEW_CHARS)

        events = Paginator(Event.objects.filter(run_id=run.pk).order_by("pk"),
                           TIMELINE_PAGE_SIZE)
        # The newest events matter most to an operator: the last page is the default.
        events_page = events.get_page(request.GET.get("events") or events.num_pages)
        signals = list(Signal.objects.filter(run_id=run.pk).order_by("-pk")[:100])
        context = self._context(
            request,
            related=self._related_runs(request, run),
            **self._breadcrumbs(f"#{run.pk}"),
            title=f"{run.name} #{run.pk}",
            subtitle=None,
            run=run, status=status, spec=spec, step=step, wait=wait,
            machine=machines.status_of(run),
            status_badge=status_badge(run.status),
            status_lines="\n".join(format_status(replace(status, state={}))),
            error=run.error,
            budget_bars=self._budget_bars(spec, status),
            progress_percent=display.progress_percent(status.progress),
            wait_details=pretty_json(status.wait_details)[0] if status.wait_details else None,
            schema=pretty_json(wait.schema, masked=False)[0]
            if wait is not None and wait.schema else None,
            input_fields=replyforms.form_fields(wait.schema)
            if wait is not None and wait.human == "input" else None,
            actions=actions, action_urls={a.name: self._url("act", run.pk, a.name)
                                          for a in actions},
            can_operate=allowed["operate"], can_signal=allowed["signal"],
            edit_state_url=self._url("edit_state", run.pk)
            if allowed["operate"] and state_edits.editable(run) else None,
            export_url=self._url("export", run.pk),
            **artifacts.artifact_rows(run.pk, status.artifact_count,
                                      lambda key: self._url("artifact", run.pk, key)),
            approvals_url=self._url("approvals"),
            definition_runs_url=f"{self._url('changelist')}?definition={run.definition_id}",
            definition_url=reverse(f"{self.admin_site.name}:queuety_workflowdefinition_change",
                                   args=[run.definition_id]),
            # A handler path a deploy aliased reads "old → new": the path stored, then the
            # one the workers import.
            steps=[{"index": i, "spec": s, "what": describe_step(s, imports.shown),
                    "compensation": s.compensation and imports.shown(s.compensation),
                    "current": i == run.current_step and
                    run.status != RunStatus.COMPLETED,
                    "retry": effective_policy(spec, i).describe()
                    if s.kind in ("task", "parallel", "for_each") else ""}
                   for i, s in enumerate(spec.steps)],
            graph=run_graph(run, spec),
            state_text=state_text, state_cut=state_cut, state_bytes=budgets.state_bytes(run.state),
            events_page=events_page,
            timeline=[self._event_row(event) for event in events_page.object_list],
            signals=[{"row": s, "payload": pretty_json(s.payload, EVENT_DATA_CHARS)[0]}
                     for s in signals],
            signal_count=len(signals) if len(signals) < 100 else
            Signal.objects.filter(run_id=run.pk).count(),
            step_runs=artifacts.with_chunk_counts(
                list(StepRun.objects.filter(run_id=run.pk).order_by("-pk")[:25]),
                lambda step_run_id: self._url("chunks", run.pk, step_run_id)),
            duration=human_duration(((run.finished_at or timezone.now()) - run.created_at)
                                    .total_seconds()),
        )
        return TemplateResponse(request, "admin/queuety/workflowrun/run.html", context)

    def _related_runs(self, request: HttpRequest, run: WorkflowRun) -> list[dict[str, Any]]:
        """Runs linked to this one: its parent or starter, its children, the runs it
        started, and the runs it waits for (100 of each at most)."""
        awaited = WorkflowDependency.objects.filter(run_id=run.pk).values("depends_on")
        # pk=None is Django's IS NULL (no parent: no row), which the plugin's lookup types
        # refuse.
        links = [("parent (run_workflow)",
                  WorkflowRun.objects.filter(pk=run.parent_id)),  # type: ignore[misc]
                 ("started it",
                  WorkflowRun.objects.filter(pk=run.started_by_id)),  # type: ignore[misc]
                 ("child (run_workflow)", WorkflowRun.objects.filter(parent_id=run.pk)),
                 ("started by this run", WorkflowRun.objects.filter(started_by_id=run.pk)),
                 ("awaited", WorkflowRun.objects.filter(pk__in=awaited))]
        return [{"relation": relation, "run": other, "badge": status_badge(other.status),
                 "url": self._url("change", other.pk)}
                for relation, query in links
                for other in display.reachable(request, query).only(
                    "pk", "name", "status", "group").order_by("pk")[:100]]

    @staticmethod
    def _budget_bars(spec: WorkflowSpec, status: WorkflowStatus) -> list[dict[str, Any]]:
        bars = []
        usage = status.budget or {}
        for name, limit in spec.budget.configured().items():
            counter = budgets.COUNTER_OF.get(name)
            used = usage.get(counter) if counter else None
            percent = None if used is None else min(100, round(used * 100 / limit))
            bars.append({"name": name, "limit": limit, "used": used, "percent": percent,
                         "level": "over" if used is not None and used > limit else
                         "high" if percent is not None and percent >= 80 else "ok"})
        return bars

    @staticmethod
    def _event_row(event: Event) -> dict[str, Any]:
        data = event.data or {}
        text, cut = pretty_json(data, EVENT_DATA_CHARS) if data else ("", False)
        return {"event": event, "by": data.get("by") or data.get("sent_by") or "",
                "error": (data.get("error") or {}).get("message", "")
                if isinstance(data.get("error"), dict) else "",
                "data": text, "cut": cut}

    # -- exports

    def _export_response(self, pk: int) -> HttpResponse:
        try:
            document = export.export(pk)
        except exceptions.RunNotFound:
            raise Http404(f"Workflow run {pk} does not exist.") from None
        # Downloaded by a person: secret values are masked (export_workflow() keeps them).
        response = HttpResponse(json.dumps(mask(document), indent=2, ensure_ascii=False) + "\n",
                                content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="queuety-run-{pk}.json"'
        return response

    def export_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """``GET <id>/export/``: the run's JSON export as a download."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        display.reachable_or_404(request, object_id)
        return self._export_response(object_id)

    def artifact_view(self, request: HttpRequest, object_id: int, key: str) -> HttpResponse:
        """``GET <id>/artifacts/<key>/``: one artifact's content as a download."""
        if self.has_view_permission(request):
            display.reachable_or_404(request, object_id)
        return artifacts.download(request, object_id, key, self.has_view_permission(request))

    def chunks_view(self, request: HttpRequest, object_id: int,
                    step_run_id: int) -> HttpResponse:
        """``GET <id>/chunks/<step run id>/``: the chunks a streaming step row stored, as JSON."""
        if self.has_view_permission(request):
            display.reachable_or_404(request, object_id)
        return artifacts.chunks(request, object_id, step_run_id,
                                self.has_view_permission(request))

    # -- actions

    def _back(self, request: HttpRequest, object_id: int) -> str:
        target = request.POST.get("next", "")
        if target and url_has_allowed_host_and_scheme(
                target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
            return target
        return self._url("change", object_id)

    def action_view(self, request: HttpRequest, object_id: int, action: str) -> HttpResponse:
        """``POST <id>/act/<action>/``: one action on one run, refused on a stale form."""
        chosen = RUN_ACTIONS.get(action)
        if chosen is None:
            raise Http404(f"There is no run action {action!r}.")
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request)
                and getattr(self, f"has_{chosen.permission}_permission")(request)):
            raise PermissionDenied
        back = self._back(request, object_id)
        posted = request.POST.get("revision", "")
        try:
            if not display.reachable(request, WorkflowRun.objects.filter(pk=object_id)
                                     ).exists():
                raise exceptions.RunNotFound(object_id)  # outside the scope: as if purged
            with transaction.atomic():
                # Lock the run and compare revisions before acting: the operation locks the
                # same rows again in this transaction, so nothing can slip in between. The
                # order is the operations' and the step boundary's (live step rows, then the
                # run row), so this cannot deadlock with a worker finishing a step.
                locked = rows.lock_run(object_id, steps_first=True,
                                       fields=("revision", "definition_id", "current_step"))
                if str(locked.revision) != posted:
                    raise StaleForm(locked.revision)
                message = chosen.perform(request, LockedRun(object_id, locked.definition_id,
                                                            locked.current_step))
        except StaleForm:
            self.message_user(request, f"Run {object_id} changed since this page was loaded, "
                                       "so nothing was done. Check its current status and try "
                                       "again.", messages.WARNING)
        except exceptions.RunNotFound:
            self.message_user(request, f"Workflow run {object_id} does not exist; it may have "
                                       "been purged.", messages.ERROR)
            return HttpResponseRedirect(self._url("changelist"))
        except exceptions.QueuetyError as error:
            self.message_user(request, str(error), messages.ERROR)
        else:
            self.message_user(request, message, messages.SUCCESS)
            # Also in the admin's own log ("Recent actions"), besides the run's timeline.
            self.log_change(request, WorkflowRun.objects.only("name", "status").get(pk=object_id),
                            f"{chosen.label}: {message}")
        return HttpResponseRedirect(back)

    # -- approvals

    def approvals_view(self, request: HttpRequest) -> HttpResponse:
        """``GET approvals/``: every run waiting on a person, oldest first."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        runs = (display.reachable(request, WorkflowRun.objects.filter(waiting_on(HUMAN_WAITS)))
                .order_by("updated_at", "pk")
                .only("id", "definition_id", "name", "status", "current_step", "total_steps",
                      "revision", "updated_at", "state"))
        page = Paginator(runs, 50).get_page(request.GET.get("page"))
        now = timezone.now()
        rows = []
        for run in page.object_list:
            spec = load_spec(run.definition_id)
            step = spec.steps[run.current_step]
            rows.append({
                "run": run, "step": step, "kind": step.wait.human, "version": spec.version,
                "since": human_duration((now - run.updated_at).total_seconds()),
                "state": pretty_json(run.state, 300)[0],
                "url": self._url("change", run.pk),
                "approve_url": self._url("act", run.pk, "approve"),
                "reject_url": self._url("act", run.pk, "reject"),
            })
        here = request.get_full_path()
        return TemplateResponse(request, "admin/queuety/workflowrun/approvals.html",
                                self._context(request, title="Runs waiting on a person",
                                              **self._breadcrumbs("Waiting on a person"),
                                              rows=rows, page=page, here=here,
                                              can_signal=self.has_signal_permission(request),
                                              changelist_url=self._url("changelist")))

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {
            **(extra_context or {}), "approvals_url": self._url("approvals"),
            "start_url": self._url("start_index") if self.has_start_permission(request)
            else None})
