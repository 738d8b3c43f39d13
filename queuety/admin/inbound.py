"""The inbound deliveries admin: each delivery an inbound hook received, and its outcome.

Read-only: a delivery is a record of what a provider sent and what it started or signalled;
nothing here changes one. Its stored headers hold no signature or credential
(``queuety.hooks.receive`` drops them before storing).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from queuety import scope
from queuety.admin.display import ReadOnly, pretty_json
from queuety.models import InboundDelivery

if TYPE_CHECKING:  # generic in django-stubs only: not subscriptable at run time
    _InboundAdmin = admin.ModelAdmin[InboundDelivery]
else:
    _InboundAdmin = admin.ModelAdmin


@admin.register(InboundDelivery)
class InboundDeliveryAdmin(ReadOnly, _InboundAdmin):
    """Deliveries received, newest first: hook, provider's id, outcome and the run."""

    list_display = ("pk", "hook", "event_id", "outcome", "run_id", "received_at")
    list_filter = ("outcome", "hook")
    search_fields = ("=event_id", "=run_id")
    ordering = ("-pk",)
    readonly_fields = ("hook", "event_id", "received_at", "outcome", "run_id", "error",
                       "headers_json", "body_json")
    fields = readonly_fields

    @admin.display(description="headers")
    def headers_json(self, row: InboundDelivery) -> Any:
        return format_html("<pre>{}</pre>", pretty_json(row.headers)[0])

    @admin.display(description="body")
    def body_json(self, row: InboundDelivery) -> Any:
        try:
            shown = pretty_json(json.loads(row.body))[0]
        except ValueError:
            shown = row.body
        return format_html("<pre>{}</pre>", shown)

    def get_queryset(self, request: HttpRequest) -> QuerySet[InboundDelivery]:
        # A delivery carries its run's data: only those of runs in the user's RUN_SCOPE
        # (and those that reached no run).
        return scope.through_runs(request.user, super().get_queryset(request), "run_id",
                                  unowned=True)

