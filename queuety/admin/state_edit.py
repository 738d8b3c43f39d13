"""The run page's "Edit state" page: the state as JSON in a textarea, a "Preview" that shows
the diff, and a "Save" that applies it (thin over ``queuety.state_edits``).

Mixed into the runs admin, whose helpers (``_url``, ``_context``, ``_breadcrumbs``) it uses.
The textarea shows the state masked (``QUEUETY["SECRET_KEYS"]``): a value the text still holds
masked where it was masked (in objects and lists) keeps its real value, and what is saved is
the merge patch from the real state to that. Editing
needs ``queuety.change_workflowrun``; a run outside the user's ``RUN_SCOPE`` is a 404.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from queuety import exceptions, replyforms, state_edits
from queuety.admin.display import actor, reachable_or_404
from queuety.core import state_patch
from queuety.masking import mask, mask_changes, unmask
from queuety.models import WorkflowRun
from queuety.store import rows

if TYPE_CHECKING:  # for annotations only
    from django.contrib.admin import AdminSite
    from django.db.models.options import Options

TEMPLATE = "admin/queuety/workflowrun/edit_state.html"


class StateEditPages:
    """``<id>/edit-state/`` under the runs admin."""

    if TYPE_CHECKING:
        opts: Options[WorkflowRun]
        admin_site: AdminSite

        def _url(self, name: str, *args: Any) -> str: ...
        def _context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]: ...
        def _breadcrumbs(self, current: str) -> dict[str, Any]: ...
        def has_operate_permission(self, request: HttpRequest) -> bool: ...
        def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool: ...
        def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any: ...

    def state_edit_urls(self) -> list[URLPattern]:
        """The page's URL pattern, for ``get_urls()``."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("<int:object_id>/edit-state/",
                     self.admin_site.admin_view(self.edit_state_view),
                     name=f"{prefix}_edit_state")]

    def edit_state_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """``GET``: the state to edit; ``POST preview``: the diff, nothing saved; ``POST
        save``: the edit (refused if the run changed since the page was loaded). Bad JSON or
        a refused edit shows the page again with the error; nothing changes."""
        if not (self.has_view_permission(request) and self.has_operate_permission(request)):
            raise PermissionDenied
        reachable_or_404(request, object_id)
        run = rows.get_run(object_id)
        shown = mask(run.state or {})
        text = json.dumps(shown, indent=2, ensure_ascii=False)
        reason = ""
        error = changes = None
        revision = run.revision
        if request.method == "POST":
            text = request.POST.get("state", "")
            reason = request.POST.get("reason", "").strip()
            try:
                revision = _revision(run.pk, request.POST.get("revision", ""))
                patch = _patch(run.state or {}, shown, text)
                if "save" in request.POST:
                    self._save(request, run.pk, revision, patch, reason)
                    return HttpResponseRedirect(self._url("change", run.pk))
                changes = _shown(state_edits.preview_edit(run.pk, patch).changes)
            except ValueError as problem:  # bad JSON, InvalidStateEdit
                error = str(problem)
            except exceptions.QueuetyError as problem:  # InvalidTransition, a stale form
                error = str(problem)
        editable = state_edits.editable(run)
        return TemplateResponse(request, TEMPLATE, self._context(
            request, title=f"Edit the state of {run.name} #{run.pk}", run=run, text=text,
            reason=reason, error=error, changes=changes, revision=revision,
            editable=editable, run_url=self._url("change", run.pk),
            **self._breadcrumbs(f"#{run.pk}: edit state")),
            status=400 if error else 200)

    def _save(self, request: HttpRequest, pk: int, revision: int, patch: dict[str, Any],
              reason: str) -> None:
        with transaction.atomic():
            locked = rows.lock_run(pk, steps_first=True, fields=("revision",))
            if locked.revision != revision:
                raise exceptions.InvalidTransition(
                    pk, f"Workflow run {pk} changed since this page was loaded, so nothing was "
                    "saved. Preview the edit again against its current state.")
            edit = state_edits.edit_state(pk, patch, reason=reason, actor=actor(request))
        message = f"Run {pk}'s state was edited ({len(edit.changes)} change(s))."
        messages.success(request, message)
        self.log_change(request, WorkflowRun.objects.only("name", "status").get(pk=pk),
                        f"Edit state: {message}")


def _revision(pk: int, posted: str) -> int:
    """The run revision the page was loaded at (a hidden field).

    Raises:
        ValueError: it is missing or not a number (a form not rendered by this page).
    """
    try:
        return int(posted)
    except ValueError:
        raise ValueError(f"The form holds no valid revision of workflow run {pk}, so nothing "
                         "was saved; reload the Edit state page and try again.") from None


def _patch(real: dict[str, Any], shown: dict[str, Any], text: str) -> dict[str, Any]:
    """The merge patch from the real state to the edited ``text`` of its masked form
    ``shown``: where the text still holds the mask at a masked place (in an object or a list)
    the real value is kept.

    Raises:
        ValueError: ``text`` is not a JSON object (InvalidStateEdit for a null it cannot set,
            or a list holding masked values that changed length).
    """
    try:
        edited = json.loads(text, parse_constant=replyforms.refuse_constant)
    except ValueError as error:
        raise ValueError(f"The state is not valid JSON: {error}. Nothing was changed.") from None
    if not isinstance(edited, dict):
        raise ValueError("The state must be a JSON object ({...}); nothing was changed.")
    return state_patch.make_patch(real, unmask(shown, edited, real))


def _shown(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The preview's rows: each change masked, its values as JSON text."""
    return [{key: value if key == "path" else json.dumps(value, ensure_ascii=False)
             for key, value in change.items()} for change in mask_changes(changes)]
