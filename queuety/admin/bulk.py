"""Bulk operations in the admin: the runs changelist's "act on all N matching" starts one
(``queuety.bulk_actions``) over the changelist's current filter, and the bulk operations
admin lists them with their progress, read-only, with a cancel action."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR, TO_FIELD_VAR
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from queuety import bulk_actions, exceptions
from queuety.admin.display import ReadOnly
from queuety.admin.filters import VersionFilter
from queuety.models import BulkOperation

if TYPE_CHECKING:  # generic in django-stubs only: not subscriptable at run time
    _BulkAdmin = admin.ModelAdmin[BulkOperation]
else:
    _BulkAdmin = admin.ModelAdmin

#: The runs changelist's filter parameters, as the runs list's filter keys (the same names
#: but the status field's). A changelist filtered otherwise (a search) is not translated.
CHANGELIST_KEYS = {"status__exact": "status", "workflow": "workflow", "version": "version",
                   "waiting": "waiting", "definition": "definition", "tag": "tags"}
#: The changelist's "waiting for" choices (``filters.WaitingFilter``) as the runs list's
#: ``waiting`` values that match the same runs. Its "a signal" (a plain signal wait) has no
#: equal there (``waiting=signal`` is every run waiting for a signal, approvals included).
WAITING_VALUES = {"person": "person", "approval": "approval", "decision": "decision",
                  "input": "input", "workflows": "workflows"}
#: Changelist parameters that do not filter.
_PRESENTATION = {ORDER_VAR, PAGE_VAR, IS_POPUP_VAR, TO_FIELD_VAR, "_changelist_filters"}


def start_across(request: HttpRequest, action: str) -> HttpResponse | None:
    """For an action with "Select all N" (``select_across``): start a bulk ``action`` over
    the changelist's filter and answer the operation's page; None for a selection of rows
    (the action then acts on them itself)."""
    if request.POST.get("select_across") != "1":
        return None
    params = {key: value for key, value in request.GET.items() if key not in _PRESENTATION}
    untranslated = sorted(set(params) - set(CHANGELIST_KEYS))
    back = request.get_full_path()
    if untranslated:
        messages.error(request, "Acting on all matching runs works with the status, workflow, "
                       "version, waiting, definition and tag filters only; this list is also "
                       f"filtered by {', '.join(untranslated)}. Remove that, or select runs.")
        return HttpResponseRedirect(back)
    try:
        progress = bulk_actions.start(action, translated(params), user=request.user,
                                      actor=f"admin:{request.user.get_username()}")
    except (ValueError, exceptions.QueuetyError) as error:
        messages.error(request, str(error))
        return HttpResponseRedirect(back)
    messages.success(request, f"Bulk {action} {progress.id} started on the {progress.matched} "
                              "matching run(s); its page shows the progress.")
    return HttpResponseRedirect(reverse("admin:queuety_bulkoperation_change",
                                        args=[progress.id]))


def translated(params: Mapping[str, Any]) -> dict[str, Any]:
    """The changelist's filter parameters as the bulk filter that matches exactly the runs the
    changelist lists, value by value.

    Raises:
        ValueError: a value the bulk filter cannot express (nothing is started), saying what
            to do instead.
    """
    found: dict[str, Any] = {CHANGELIST_KEYS[key]: value for key, value in params.items()}
    waiting = found.get("waiting")
    if waiting is not None:
        if waiting not in WAITING_VALUES:
            raise ValueError(
                f"Acting on all matching runs cannot use the \"waiting for\" choice {waiting!r}"
                + (" (a plain signal wait: no bulk filter matches exactly those runs)"
                   if waiting == "signal" else "")
                + "; nothing was started. Choose another \"waiting for\" choice, or filter by "
                  "status waiting_for_signal (every signal wait, approvals included), or "
                  "select the runs on this page.")
        found["waiting"] = WAITING_VALUES[waiting]
    if found.get("version") == VersionFilter.UNLABELLED:
        raise ValueError("Acting on all matching runs cannot use the version choice \"no "
                         "version label\"; nothing was started. Filter by workflow or "
                         "definition instead, or select the runs on this page.")
    if "tags" in found:
        key, sep, value = found["tags"].partition(":")
        if not sep:
            raise ValueError(f"The tag filter {found['tags']!r} is not key:value; nothing was "
                             "started.")
        found["tags"] = {key: value}
    definition = found.get("definition")
    if definition is not None and not definition.isdigit():
        del found["definition"]  # the changelist ignores a definition that is not an id
    return found


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnly, _BulkAdmin):
    """Bulk operations, newest first: action, status, progress, who and the filter."""

    list_display = ("pk", "action", "status", "dry_run", "progress", "actor", "created_at",
                    "finished_at")
    list_filter = ("status", "action")
    ordering = ("-pk",)
    readonly_fields = ("action", "status", "dry_run", "progress", "filter", "arguments",
                       "actor", "skipped_reasons", "error", "created_at", "started_at",
                       "finished_at", "cursor", "max_run_id")
    fields = readonly_fields
    actions = ["cancel_selected"]

    @admin.display(description="progress")
    def progress(self, op: BulkOperation) -> str:
        if op.dry_run:
            return f"{op.matched} matching (dry run)"
        return (f"{op.acted + op.skipped} of {op.matched} processed: {op.acted} acted on, "
                f"{op.skipped} skipped")

    def get_queryset(self, request: HttpRequest) -> QuerySet[BulkOperation]:
        # With a RUN_SCOPE or RUN_ACCESS, a user sees the operations they asked for only:
        # another's filter and counts are of runs they may not see.
        mine = bulk_actions.operations_of(request.user).values("pk")
        return super().get_queryset(request).filter(pk__in=mine)


    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("queuety.view_workflowrun")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queuety.change_workflowrun")

    @admin.action(description="Cancel selected bulk operations", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[BulkOperation]) -> None:
        ids = list(queryset.filter(status__in=(BulkOperation.PENDING, BulkOperation.RUNNING))
                   .values_list("pk", flat=True))
        for op_id in ids:
            bulk_actions.cancel(op_id)
        self.message_user(request, f"{len(ids)} bulk operation(s) cancelled; runs already "
                                   "acted on stay as they are.")
