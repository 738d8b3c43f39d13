"""Who may read runs and send them signals through the API."""

from __future__ import annotations

from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from queuety import scope
from queuety.models import WorkflowRun


class RunPermission(permissions.BasePermission):
    """Authenticated users with the model permission, and object access when the site asks.

    Reads need ``queuety.view_workflowrun``; signals, approvals and input need
    ``queuety.signal_workflowrun``; starting a run (``POST runs/``) needs
    ``queuety.add_workflowrun``, and cancel, pause, resume and retry
    ``queuety.change_workflowrun`` (as in the admin). A view names its own in
    ``required_permissions`` (``{method: permission}``). ``QUEUETY["RUN_SCOPE"]`` narrows the
    runs a user reaches at all (``queuety.scope``: outside it, a run is a 404, applied before
    this class is asked); ``QUEUETY["RUN_ACCESS"]`` may name a function ``(user, run) ->
    bool`` that decides each run inside it (a 403).
    """

    message = "You do not have permission to act on workflow runs."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        needed = getattr(view, "required_permissions", {}).get(request.method) or (
            "queuety.view_workflowrun" if request.method in permissions.SAFE_METHODS
            else "queuety.signal_workflowrun")
        return user.has_perm(needed)

    def has_object_permission(self, request: Request, view: APIView, run: WorkflowRun) -> bool:
        return scope.may_access(request.user, run)
