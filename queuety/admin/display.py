"""What the admin's pages share: status colours, page sizes, the acting user and JSON views."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
)
from django.utils.html import format_html

from queuety import scope
from queuety.core.progress import DONE_KEYS
from queuety.masking import mask
from queuety.models import (
    RunStatus,
    WorkflowRun,
)

# -- settings and shared helpers ---------------------------------------------------------------
# (What steps do, what runs wait for and how long things took: ``queuety.core.describe``, the
# vocabulary the CLI and the API use too.)

#: Status colours: the same on the changelist, the run page and the approvals page. White
#: text on these backgrounds stays readable in the admin's light and dark themes.
STATUS_COLOURS: dict[str, str] = {
    RunStatus.RUNNING: "#1d6fb8",
    RunStatus.WAITING_FOR_SIGNAL: "#a85d00",
    RunStatus.WAITING_FOR_WORKFLOWS: "#7a5a00",
    RunStatus.PAUSED: "#5f6b7a",
    RunStatus.COMPLETED: "#1f7a3a",
    RunStatus.FAILED: "#b3261e",
    RunStatus.CANCELLED: "#444444",
}

#: Human wait kinds (``WaitSpec.human``) and how a page names them.
HUMAN_WAITS = {"approval": "an approval", "decision": "a decision", "input": "input"}

#: Most runs one bulk action (export, pause, ...) handles; more is refused with a message.
BULK_LIMIT = 1000


def reachable(request: HttpRequest, runs: QuerySet[WorkflowRun] | None = None
              ) -> QuerySet[WorkflowRun]:
    """``runs`` (default: every run) narrowed to the user's ``QUEUETY["RUN_SCOPE"]``, in SQL:
    every page that lists, counts or reaches runs goes through it."""
    return scope.scoped_runs(request.user, WorkflowRun.objects.all() if runs is None else runs)


def reachable_or_404(request: HttpRequest, run_id: int) -> None:
    """Raise Http404 for a run outside the user's scope, as for one that does not exist (a
    403 would confirm that the id is someone's run)."""
    if not reachable(request, WorkflowRun.objects.filter(pk=run_id)).exists():
        raise Http404(f"Workflow run {run_id} does not exist.")


#: Characters of the pretty-printed state shown before "Show the whole state".
STATE_PREVIEW_CHARS = 8000

#: Characters of one timeline event's data shown on the run page.
EVENT_DATA_CHARS = 2000

TIMELINE_PAGE_SIZE = 50


def actor(request: HttpRequest) -> str:
    """Return how the timeline names the user acting through the admin."""
    return f"admin:{request.user.get_username()}"


def status_badge(status: str) -> str:
    """Return the status as a coloured pill."""
    return format_html(
        '<span class="queuety-status" style="background:{};color:#fff;padding:1px 7px;'
        'border-radius:9px;white-space:nowrap;font-size:0.92em">{}</span>',
        STATUS_COLOURS.get(status, "#444444"), status)


def pretty_json(value: Any, limit: int | None = None, *,
                masked: bool = True) -> tuple[str, bool]:
    """Return ``value`` as indented JSON, cut at ``limit`` characters, and whether it was cut.

    Run data is shown ``masked`` (``QUEUETY["SECRET_KEYS"]``); schemas and definitions are not
    run data and are shown as they are.
    """
    text = json.dumps(mask(value) if masked else value, indent=2, ensure_ascii=False,
                      default=str)
    if limit is not None and len(text) > limit:
        return text[:limit] + "\n…", True
    return text, False


def progress_percent(progress: dict[str, Any] | None) -> int | None:
    """The bar of a step's reported progress: 0-100, or None when it gives no fraction."""
    data = (progress or {}).get("data") or {}
    total = data.get("total")
    done: float | None = next(
        (data[k] for k in DONE_KEYS if isinstance(data.get(k), int | float)), None)
    if isinstance(total, int | float) and total > 0 and done is not None:
        return max(0, min(100, round(100 * done / total)))
    percent = data.get("percent")
    if isinstance(percent, int | float):
        return max(0, min(100, round(percent)))
    return None


class ReadOnly:
    """A model admin mixin for pages that show records and never let the admin's forms add,
    change or delete one (what they offer is their own actions, over the service layer)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
