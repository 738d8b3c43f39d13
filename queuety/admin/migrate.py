"""The admin's "Move runs to another version" page: the dry run first, then the move (thin
over ``queuety.run_migration``).

Mixed into the runs admin, whose helpers (``_url``, ``_context``, ``_breadcrumbs``) it uses.
``migrate/?workflow=NAME`` moves that workflow's live runs, ``&from=ID`` only those of one
definition (the definition page's link), ``&runs=1,2,3`` only the selected runs (the
changelist's action). Moving needs ``queuety.change_workflowrun``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from queuety import exceptions, run_migration
from queuety.admin.display import actor, reachable
from queuety.conf import settings
from queuety.core.moves import MOVABLE
from queuety.models import WorkflowDefinition, WorkflowRun
from queuety.scope import is_scoped

if TYPE_CHECKING:  # for annotations only
    from django.contrib.admin import AdminSite
    from django.db.models.options import Options

TEMPLATE = "admin/queuety/workflowrun/migrate.html"


class MigrateForm(forms.Form):
    """Where to, and how steps and state map."""

    to = forms.CharField(initial="latest", max_length=80, help_text=(
        "'latest' (the definition registered now), or a definition's hash, hash prefix or id."))
    step_map = forms.CharField(required=False, widget=forms.Textarea(attrs={
        "rows": 3, "cols": 60, "spellcheck": "false"}), help_text=(
        "Renamed steps, one OLD=NEW per line; other steps map by name."))
    state = forms.CharField(required=False, max_length=255, help_text=(
        "Optional: the dotted path of a function state(state, run) -> state."))

    def clean_state(self) -> str:
        """Only a function of the site's own code: a form must not make the admin import
        and call any dotted path there is."""
        path = (self.cleaned_data.get("state") or "").strip()
        if path and not _trusted(path):
            raise forms.ValidationError(
                f"{path!r} is not in one of this site's own apps (its INSTALLED_APPS "
                "that are not installed packages) nor in QUEUETY['REPLAY_MODULES']; give a "
                "function of the site's own code.")
        return path

    def clean_step_map(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for number, line in enumerate((self.cleaned_data.get("step_map") or "").splitlines(), 1):
            if not line.strip():
                continue
            old, sep, new = line.partition("=")
            if not sep or not old.strip() or not new.strip():
                raise forms.ValidationError(
                    f"Line {number} ({line.strip()!r}) is not OLD=NEW, an old step name and "
                    "the new one.")
            found[old.strip()] = new.strip()
        return found


class MigrationPages:
    """``migrate/`` under the runs admin, and the changelist's action that leads there."""

    if TYPE_CHECKING:
        opts: Options[WorkflowRun]
        admin_site: AdminSite

        def _url(self, name: str, *args: Any) -> str: ...
        def _context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]: ...
        def _breadcrumbs(self, current: str) -> dict[str, Any]: ...
        def has_operate_permission(self, request: HttpRequest) -> bool: ...

    def migrate_urls(self) -> list[URLPattern]:
        """The page's URL pattern, for ``get_urls()``."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("migrate/", self.admin_site.admin_view(self.migrate_view),
                     name=f"{prefix}_migrate")]

    @admin.action(description="Move selected runs to the latest version…",
                  permissions=["operate"])
    def migrate_selected(self, request: HttpRequest,
                         queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Go to the page for the selected runs (of one workflow), which shows the dry run."""
        names = sorted(set(queryset.values_list("name", flat=True)))
        if len(names) != 1:
            messages.error(request, "Select runs of one workflow to move them (these are "
                                       f"of {', '.join(map(repr, names))}).")
            return None
        query = QueryDict(mutable=True)
        query["workflow"] = names[0]
        query["runs"] = ",".join(str(pk) for pk in queryset.order_by("pk")
                                 .values_list("pk", flat=True))
        return HttpResponseRedirect(f"{self._url('migrate')}?{query.urlencode()}")

    def migrate_view(self, request: HttpRequest) -> HttpResponse:
        """``GET`` (and ``POST preview``): the dry run of the move; ``POST move``: the move,
        then what it did. Bad input shows the form again with the error; nothing moves."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        workflow, source, runs = _scope(request)
        if is_scoped():
            runs = _reachable_ids(request, workflow, runs)
        form = MigrateForm(request.POST if request.method == "POST" else {"to": "latest"})
        moving = request.method == "POST" and "move" in request.POST
        report = None
        if form.is_valid():
            try:
                report = run_migration.migrate_runs(
                    workflow, form.cleaned_data["to"], from_definition=source,
                    step_map=form.cleaned_data["step_map"],
                    state=form.cleaned_data["state"] or None, runs=runs,
                    dry_run=not moving, actor=actor(request))
            except exceptions.QueuetyError as error:
                form.add_error(None, str(error))
        if moving and report is not None:
            counts = report.counts
            messages.add_message(request, messages.WARNING if counts["failed"]
                                 else messages.SUCCESS, (
                f"{counts['moved'] + counts['moved_in_place']} run(s) moved now, "
                f"{counts['at_boundary']} at their next boundary, {counts['skipped']} "
                f"skipped, {counts['failed']} failed."))
        scope = f"run(s) {', '.join(map(str, runs))}" if runs else (
            f"the live runs of definition {source}" if source else "its live runs")
        return TemplateResponse(request, TEMPLATE, self._context(
            request, title=f"Move {workflow} to another version", form=form, report=report,
            workflow=workflow, scope=scope, moved=moving and report is not None,
            definitions=_definitions(workflow),
            run_url=self._url("changelist"), **self._breadcrumbs("Move runs")),
            status=400 if form.errors else 200)


def _trusted(path: str) -> bool:
    """Whether ``path`` is in a module of the site's own apps (or a replayable module)."""
    own = [config.name for config in apps.get_app_configs()
           if not any(part in ("site-packages", "dist-packages")
                      for part in Path(config.path).parts)
           and config.name.split(".")[0] not in ("django", "queuety")]
    return any(path == prefix or path.startswith(prefix + ".")
               for prefix in [*own, *settings.REPLAY_MODULES])


def _scope(request: HttpRequest) -> tuple[str, str | None, list[int] | None]:
    """The page's ``workflow``, ``from`` and ``runs`` (query string, kept on POST)."""
    workflow = (request.GET.get("workflow") or "").strip()
    if not workflow:
        raise Http404("Say which workflow's runs to move: ?workflow=NAME.")
    source = (request.GET.get("from") or "").strip() or None
    listed = (request.GET.get("runs") or "").strip()
    try:
        runs = [int(part) for part in listed.split(",") if part.strip()] if listed else None
    except ValueError:
        raise Http404(f"runs={listed!r} is not a list of run ids.") from None
    return workflow, source, runs


def _reachable_ids(request: HttpRequest, workflow: str, runs: list[int] | None) -> list[int]:
    """The runs a user with a ``RUN_SCOPE`` may move: the listed ones it reaches, else the
    movable runs of ``workflow`` it reaches (never another tenant's, not even in the dry
    run's report)."""
    picked = reachable(request, WorkflowRun.objects.filter(name=workflow))
    picked = picked.filter(pk__in=runs) if runs is not None else picked.filter(
        status__in=MOVABLE)
    return list(picked.order_by("pk").values_list("pk", flat=True))


def _definitions(workflow: str) -> list[dict[str, Any]]:
    """The workflow's stored definitions, newest first, for the "to" choices."""
    return [{"id": pk, "hash": digest, "version": (document or {}).get("version")}
            for pk, digest, document in WorkflowDefinition.objects.filter(name=workflow)
            .order_by("-pk").values_list("pk", "definition_hash", "definition")[:20]]
