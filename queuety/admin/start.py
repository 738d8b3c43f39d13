"""The admin's "Start a run" pages: the registered workflows, and a form per workflow whose
JSON payload is checked before anything is dispatched (thin over ``queuety.registry``).

Mixed into the runs admin, whose helpers (``_url``, ``_context``, ``_breadcrumbs``) they use.
Starting a run needs ``queuety.add_workflowrun``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from queuety import exceptions, registry, scope
from queuety.conf import settings
from queuety.core.keyed import FlowOptions, flow_options

if TYPE_CHECKING:  # for annotations only
    from django.contrib.admin import AdminSite
    from django.db.models.options import Options

    from queuety.models import WorkflowRun

TEMPLATE = "admin/queuety/workflowrun/start.html"


class StartRunForm(forms.Form):
    """A JSON object payload, and an optional idempotency key."""

    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 12, "cols": 80, "class": "vLargeTextField",
                                     "spellcheck": "false"}),
        initial="{}", required=False,
        help_text="The run's initial state: a JSON object.")
    idempotency_key = forms.CharField(
        max_length=255, required=False,
        help_text="Optional. A key already used shows the run it started instead of starting "
                  "another.")

    key = forms.CharField(
        max_length=255, required=False,
        help_text="Optional. The run's flow-control key (see singleton below).")
    singleton = forms.ChoiceField(
        required=False, initial="",
        choices=[("", "No: start a run in any case"),
                 ("reject", "Singleton: refuse while a run of the key is live"),
                 ("queue", "Singleton: queue behind the live run of the key"),
                 ("replace", "Singleton: cancel the live run of the key, then start"),
                 ("signal", "Singleton: send the payload to the live run as signal 'input'")],
        help_text="With a key: what to do while a run of that key is live.")

    def clean_payload(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("payload") or "").strip() or "{}"
        try:
            value = json.loads(text)
        except ValueError as error:
            raise forms.ValidationError(f"The payload is not valid JSON: {error}.") from None
        if not isinstance(value, dict):
            raise forms.ValidationError(
                f"The payload must be a JSON object ({{...}}), not a {type(value).__name__}.")
        return value

    def clean_idempotency_key(self) -> str | None:
        return (self.cleaned_data.get("idempotency_key") or "").strip() or None

    def clean_key(self) -> str | None:
        return (self.cleaned_data.get("key") or "").strip() or None

    def flow(self, name: str) -> FlowOptions | None:
        """The flow-control options the form asks for (InvalidPayload: they do not fit)."""
        conflict = self.cleaned_data.get("singleton") or None
        return flow_options(name, key=self.cleaned_data.get("key"),
                            singleton=conflict is not None, on_conflict=conflict)


class StartRunPages:
    """``start/`` and ``start/<name>/`` under the runs admin."""

    if TYPE_CHECKING:
        # What the runs admin this is mixed into provides (ModelAdmin's attributes and its
        # own helpers); declared for the type checker only, the admin's own definitions win.
        opts: Options[WorkflowRun]
        admin_site: AdminSite

        def _url(self, name: str, *args: Any) -> str: ...
        def _context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]: ...
        def _breadcrumbs(self, current: str) -> dict[str, Any]: ...

    def start_urls(self) -> list[URLPattern]:
        """The pages' URL patterns, for ``get_urls()``."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("start/", wrap(self.start_index_view), name=f"{prefix}_start_index"),
            path("start/<str:name>/", wrap(self.start_view), name=f"{prefix}_start"),
        ]

    def has_start_permission(self, request: HttpRequest) -> bool:
        """Whether the user may start runs (``queuety.add_workflowrun``)."""
        return bool(request.user.has_perm("queuety.add_workflowrun"))

    def start_index_view(self, request: HttpRequest) -> HttpResponse:
        """``GET start/``: the registered workflows, each with a link to its form."""
        if not self.has_start_permission(request):
            raise PermissionDenied
        entries = [{**entry.to_dict(), "url": self._url("start", entry.name)}
                   for entry in registry.registered()]
        return TemplateResponse(request, TEMPLATE, self._context(
            request, title="Start a run", entries=entries,
            **self._breadcrumbs("Start a run")))

    def _started(self, request: HttpRequest, name: str, run_id: int, reused: bool,
                 key: str | None) -> HttpResponse:
        if reused:
            messages.warning(request, f"Idempotency key {key!r} had already started run "
                                      f"#{run_id}; nothing new was started.")
        else:
            messages.success(request, f"Started run #{run_id} of workflow {name!r}.")
        return HttpResponseRedirect(self._url("change", run_id))

    def start_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """``GET``/``POST start/<name>/``: the form; a valid POST dispatches and goes to the
        new run's page, an invalid one shows the form again with the error and writes
        nothing."""
        if not self.has_start_permission(request):
            raise PermissionDenied
        try:
            entry = registry.get(name)
        except exceptions.UnknownWorkflow as error:
            raise Http404(str(error)) from None
        form = StartRunForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            try:
                run_id, reused = registry.start_run(
                    name, form.cleaned_data["payload"],
                    idempotency_key=form.cleaned_data["idempotency_key"], on_conflict="error",
                    flow=form.flow(name))
            except (exceptions.RunConflict, exceptions.RunNotWaiting,
                    exceptions.InvalidSignalData) as error:
                # The key's live run refused it (busy, or not at a wait for the signal).
                form.add_error(None, str(error))
            except (exceptions.InvalidPayload, exceptions.BudgetExceeded) as error:
                form.add_error("payload", str(error))
            except exceptions.IdempotencyConflict as error:
                form.add_error("idempotency_key", scope.hidden_key(
                    request.user, error.key, error.run_id) or str(error))
            except exceptions.RunPurged as error:
                # The purged run cannot be checked against the user's scope: with tenants,
                # the key's message names no run, workflow or date.
                form.add_error("idempotency_key", str(error) if settings.RUN_SCOPE is None
                               else scope.purged_key(error.key))
            else:
                hidden = scope.hidden_key(request.user, form.cleaned_data["idempotency_key"],
                                          run_id) if reused else None
                if hidden is None:
                    return self._started(request, name, run_id, reused,
                                         form.cleaned_data["idempotency_key"])
                form.add_error("idempotency_key", hidden)  # another tenant's run: as above
        return TemplateResponse(
            request, TEMPLATE, self._context(
                request, title=f"Start a run of {name}", entry=entry.to_dict(), form=form,
                index_url=self._url("start_index"),
                **self._breadcrumbs(f"Start {name}")),
            status=400 if request.method == "POST" else 200)
