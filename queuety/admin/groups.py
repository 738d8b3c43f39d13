"""The admin's concurrency groups page: each group's steps in flight against its limit, its
waiting (throttled) steps, its running cost against its budget, and its recent starts against
its rate limit (``queries.resource_groups()``), and each queue's running cost against its
cost budget (``queries.queue_budgets()``): the same figures as ``manage.py queuety status``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from queuety import queries
from queuety.admin.display import ReadOnly
from queuety.models import ResourceGroup

if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs only: not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[ResourceGroup]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(ResourceGroup)
class ResourceGroupAdmin(ReadOnly, _ModelAdmin):
    """Read-only: the page lists live groups, counted from step rows, not this model's rows
    (which only remember when a rate-limited group's next wake-up is due)."""


    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Every group with a step in flight, woken or waiting, by name."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        runs_url = reverse(f"{self.admin_site.name}:queuety_workflowrun_changelist")
        rows = [{**group, "held": group["in_flight"] + group["woken"],
                 "full": group["limit"] is not None
                 and group["in_flight"] + group["woken"] >= group["limit"]}
                for group in queries.resource_groups()]
        return TemplateResponse(request, "admin/queuety/resourcegroup/groups.html", {
            **self.admin_site.each_context(request), **(extra_context or {}),
            "title": "Concurrency groups", "opts": self.model._meta, "rows": rows,
            "queues": queries.queue_budgets(), "runs_url": runs_url})
