"""The admin's queues page: each Celery queue, paused or not, with its waiting and running
steps, the oldest wait and the last 5 minutes' throughput (``queuety.queues``), and a pause
or resume button (POST, needing ``queuety.change_workflowrun``). Reading it needs
``queuety.view_workflowrun``, as the runs do. The rules are the API's (``queuety.queues.may_see``
and ``may_act``): with ``QUEUETY["RUN_SCOPE"]``, the numbers count the user's runs only; with
``RUN_ACCESS`` alone, only superusers see them; on a site with either, only superusers pause or
resume; who paused a queue is shown only to those who may pause."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from queuety import exceptions, queues
from queuety.admin.display import ReadOnly
from queuety.models import QueuePause

if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs only: not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[QueuePause]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(QueuePause)
class QueueAdmin(ReadOnly, _ModelAdmin):
    """One page, not a model's changelist: queues are counted from step rows; this model's
    rows are only the pauses."""

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return queues.may_see(request.user)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)


    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Every known queue; a POST with ``action`` (pause or resume) and ``queue`` acts."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        may_act = queues.may_act(request.user)
        if request.method == "POST":
            if not may_act:
                raise PermissionDenied
            self._act(request)
            return HttpResponseRedirect(request.path)
        return TemplateResponse(request, "admin/queuety/queuepause/queues.html", {
            **self.admin_site.each_context(request), **(extra_context or {}),
            "title": "Queues", "opts": self.model._meta,
            "rows": queues.queue_stats(runs=queues.visible_runs(request.user)),
            "may_act": may_act,
            "runs_url": reverse(f"{self.admin_site.name}:queuety_workflowrun_changelist")})

    def _act(self, request: HttpRequest) -> None:
        name, action = request.POST.get("queue", ""), request.POST.get("action")
        actor = f"admin:user:{request.user.pk}:{request.user.get_username()}"
        try:
            if action == "pause":
                warning = queues.unknown_warning(name)
                name = queues.pause_queue(name, actor=actor,
                                          reason=request.POST.get("reason", "")).name
                self.message_user(request, f"Queue '{name}' is paused: its steps wait.")
                if warning:
                    self.message_user(request, warning, messages.WARNING)
            elif action == "resume":
                released = queues.resume_queue(name, actor=actor)
                self.message_user(request, f"Queue '{name}' is resumed; {released} held "
                                           "step(s) released.")
            else:
                self.message_user(request, f"The action {action!r} is not known; use pause or "
                                           "resume.", messages.ERROR)
        except exceptions.QueuetyError as error:
            self.message_user(request, str(error), messages.ERROR)
