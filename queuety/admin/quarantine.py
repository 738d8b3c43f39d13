"""Quarantine a definition from the admin: "Pause its live runs" and "Resume its paused runs",
as actions of the definitions changelist and as buttons of the definition's page. Both show
a confirmation page first, whose POST does it (thin over ``queuety.quarantine``).

Mixed into the definitions admin. Definitions themselves are never changed, so these need
the permission to operate runs, ``queuety.change_workflowrun``, as pausing one run does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.text import capfirst
from django.utils.translation import gettext

from queuety import exceptions, quarantine
from queuety.admin.display import actor, reachable
from queuety.core.status import UNFINISHED
from queuety.models import WorkflowDefinition, WorkflowRun

if TYPE_CHECKING:
    # The definitions admin this is mixed into, for the type checker (ModelAdmin is generic in
    # django-stubs only); at run time the mixin is a plain class.
    _Admin = admin.ModelAdmin[WorkflowDefinition]
else:
    _Admin = object

TEMPLATE = "admin/queuety/workflowdefinition/quarantine_confirm.html"

#: Each action: the label of its button and action, and the runs it acts on.
LABELS = {"pause": "Pause its live runs", "resume": "Resume its paused runs"}
ACTS_ON = {"pause": "running or waiting for a signal", "resume": "paused"}


class QuarantinePages(_Admin):
    """The actions, the two pages (``<id>/pause-runs/``, ``<id>/resume-runs/``) and the
    buttons of the definition page (``change_form_object_tools.html``)."""

    actions = ["pause_live_runs", "resume_paused_runs"]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Whether the user may pause and resume runs (``queuety.change_workflowrun``)."""
        return bool(request.user.has_perm("queuety.change_workflowrun"))

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("<int:object_id>/pause-runs/", wrap(self.pause_runs_view),
                 name=f"{prefix}_pause_runs"),
            path("<int:object_id>/resume-runs/", wrap(self.resume_runs_view),
                 name=f"{prefix}_resume_runs"),
            *super().get_urls(),
        ]

    def _url(self, name: str, *args: Any) -> str:
        site = self.admin_site.name
        return reverse(f"{site}:{self.opts.app_label}_{self.opts.model_name}_{name}", args=args,
                       current_app=site)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        tools = [] if not (self.has_operate_permission(request)
                           and str(object_id).isdigit()) else [
            {"url": self._url(f"{action}_runs", object_id), "label": label,
             "id": f"{action}-runs"} for action, label in LABELS.items()]
        return super().change_view(request, object_id, form_url,
                                   {**(extra_context or {}), "quarantine_tools": tools})

    # -- the changelist's actions

    @admin.action(description="Pause the live runs of the selected definitions",
                  permissions=["operate"])
    def pause_live_runs(self, request: HttpRequest,
                        queryset: QuerySet[WorkflowDefinition]) -> HttpResponse | None:
        return self._bulk(request, queryset, "pause")

    @admin.action(description="Resume the paused runs of the selected definitions",
                  permissions=["operate"])
    def resume_paused_runs(self, request: HttpRequest,
                           queryset: QuerySet[WorkflowDefinition]) -> HttpResponse | None:
        return self._bulk(request, queryset, "resume")

    def _bulk(self, request: HttpRequest, queryset: QuerySet[WorkflowDefinition],
              action: str) -> HttpResponse | None:
        definitions = list(queryset.order_by("pk"))
        if request.POST.get("post") != "yes":  # the confirmation page, which posts back here
            return self._confirm(request, action, definitions, self._url("changelist"),
                                 changelist_action=f"{action}_"
                                 + ("live_runs" if action == "pause" else "paused_runs"))
        for definition in definitions:
            self._perform(request, action, definition)
        return None

    # -- the definition page's buttons

    def pause_runs_view(self, request: HttpRequest, object_id: int) -> HttpResponseBase:
        """``GET``/``POST <id>/pause-runs/``: confirm, then pause every live run."""
        return self._single(request, object_id, "pause")

    def resume_runs_view(self, request: HttpRequest, object_id: int) -> HttpResponseBase:
        """``GET``/``POST <id>/resume-runs/``: confirm, then resume every paused run."""
        return self._single(request, object_id, "resume")

    def _single(self, request: HttpRequest, object_id: int, action: str) -> HttpResponseBase:
        if not (self.has_view_permission(request) and self.has_operate_permission(request)):
            raise PermissionDenied
        definition = WorkflowDefinition.objects.filter(pk=object_id).first()
        if definition is None:
            raise Http404(f"Workflow definition {object_id} does not exist.")
        here = self._url(f"{action}_runs", definition.pk)
        if request.method != "POST":
            return self._confirm(request, action, [definition], here)
        self._perform(request, action, definition)
        return HttpResponseRedirect(self._url("change", definition.pk))

    def _confirm(self, request: HttpRequest, action: str,
                 definitions: list[WorkflowDefinition], post_to: str,
                 changelist_action: str = "") -> TemplateResponse:
        counts: dict[int, dict[str, int]] = {}
        for pk, status, n in (reachable(request, WorkflowRun.objects.filter(
                                  definition_id__in=[d.pk for d in definitions],
                                  status__in=UNFINISHED))
                              .values_list("definition_id", "status")
                              .annotate(n=Count("pk")).order_by()):
            counts.setdefault(pk, {})[status] = n
        wanted = ("running", "waiting_for_signal") if action == "pause" else ("paused",)
        rows = [{"definition": d, "version": (d.definition or {}).get("version") or "-",
                 "affected": sum(counts.get(d.pk, {}).get(s, 0) for s in wanted),
                 "counts": sorted(counts.get(d.pk, {}).items()),
                 "url": self._url("change", d.pk)} for d in definitions]
        title = LABELS[action] if len(definitions) == 1 else \
            f"{LABELS[action].replace('its', 'their')}: {len(definitions)} definitions"
        context = {
            **self.admin_site.each_context(request), "opts": self.opts,
            "app_label": self.opts.app_label, "title": title, "action": action,
            "acts_on": ACTS_ON[action], "rows": rows, "post_to": post_to,
            "changelist_action": changelist_action,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "back_url": rows[0]["url"] if not changelist_action else self._url("changelist"),
            **self._breadcrumbs(definitions, LABELS[action]),
        }
        return TemplateResponse(request, TEMPLATE, context)

    def _breadcrumbs(self, definitions: list[WorkflowDefinition],
                     current: str) -> dict[str, Any]:
        """Home > the app > the definitions [> the definition] > ``current``, in the markup
        of the running Django (``admin/queuety/workflowrun/breadcrumbs.html``)."""
        site = self.admin_site.name
        crumbs = [(reverse(f"{site}:index", current_app=site), gettext("Home")),
                  (reverse(f"{site}:app_list", kwargs={"app_label": self.opts.app_label},
                           current_app=site), self.opts.app_config.verbose_name),
                  (self._url("changelist"), capfirst(self.opts.verbose_name_plural))]
        if len(definitions) == 1:
            crumbs.append((self._url("change", definitions[0].pk), str(definitions[0])))
        return {"crumbs": crumbs, "crumb_current": current,
                "breadcrumbs_as_list": django.VERSION >= (6, 1)}

    def _perform(self, request: HttpRequest, action: str,
                 definition: WorkflowDefinition) -> None:
        operation = quarantine.pause_definition if action == "pause" else \
            quarantine.resume_definition
        try:
            result = operation(definition.pk, actor=actor(request),
                               scope=lambda runs: reachable(request, runs))
        except exceptions.QueuetyError as error:
            self.message_user(request, str(error), messages.ERROR)
            return
        message = summary(result)
        self.message_user(request, message,
                          messages.WARNING if result.failed else messages.SUCCESS)
        # Also in the admin's own log ("Recent actions"), besides each run's timeline.
        self.log_change(request, definition, f"{LABELS[action]}: {message}")


def summary(result: quarantine.BulkResult) -> str:
    """One message for a definition-wide pause or resume: the counts, and the first few
    failures."""
    done = "paused" if result.action == "pause" else "resumed"
    text = (f"Definition {result.definition_hash[:12]} of {result.workflow!r}: "
            f"{result.done} run{'' if result.done == 1 else 's'} {done}.")
    if result.skipped:
        text += " Skipped: " + ", ".join(
            f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(result.skipped.items())
        ) + "."
    if result.failed:
        shown = " ".join(f"Run {pk}: {error}" for pk, error in
                         sorted(result.failed.items())[:5])
        more = len(result.failed) - 5
        text += (f" {len(result.failed)} could not be {done}: {shown}"
                 + (f" ({more} more not shown.)" if more > 0 else ""))
    return text
