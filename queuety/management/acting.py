"""``--as-user USERNAME``: the command acts for one user, inside their ``RUN_SCOPE``.

Without it the command is an operator's tool with full access (as ``manage.py shell`` is).
With it, each subcommand that reads or operates runs sees only the runs
``QUEUETY["RUN_SCOPE"]`` gives that user, and ``QUEUETY["RUN_ACCESS"]`` decides each run, as
the API does: a run outside the scope is reported exactly as one that does not exist.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from queuety import scope
from queuety.management.starting import Error
from queuety.models import WorkflowRun

#: The ``workflow`` subcommands that take ``--as-user``: those that list, read or operate
#: existing runs. The others (dispatch, definitions, diff, replay, migrate) refuse it.
SCOPED_ACTIONS = ("status", "list", "approve", "reject", "input", "signal", "retry", "pause",
                  "resume", "cancel", "fork", "timeline", "state-at", "rewind", "export",
                  "artifacts", "artifact", "delete-artifact", "chunks", "edit-state")


def add_as_user(actions: Any) -> None:
    """Add ``--as-user`` to each of :data:`SCOPED_ACTIONS` (``actions``: the ``workflow``
    group's sub-parsers)."""
    parsers: dict[str, argparse.ArgumentParser] = actions.choices
    for name in SCOPED_ACTIONS:
        parsers[name].add_argument(
            "--as-user", default=None, metavar="USERNAME",
            help="Act for this user: only the runs QUEUETY['RUN_SCOPE'] gives them, each "
                 "decided by QUEUETY['RUN_ACCESS'] (default: full access).")


def acting_user(options: dict[str, Any]) -> Any:
    """The user ``--as-user`` names, or None (full access).

    Raises:
        Error: no user has that username.
    """
    username = options.get("as_user")
    if username is None:
        return None
    model = get_user_model()
    user = model._default_manager.filter(**{model.USERNAME_FIELD: username}).first()
    if user is None:
        raise Error(f"No user is named {username!r}; give --as-user the username of an "
                    "existing user.")
    return user


def check_run(user: Any, run_id: int | None) -> None:
    """Refuse run ``run_id`` unless ``user`` may reach and act on it.

    Raises:
        Error: the run is outside the user's scope (reported as not found, the same words as
            for a run that does not exist), or ``RUN_ACCESS`` refuses it.
    """
    if user is None or run_id is None:
        return
    run = scope.find_run(user, run_id)
    if run is None:
        raise Error(f"Workflow #{run_id} not found.")
    if not scope.may_access(user, run):
        raise Error(f"User {user.get_username()!r} may not act on workflow #{run_id}: "
                    "QUEUETY['RUN_ACCESS'] refuses it. Run the command as a user it allows, "
                    "or without --as-user for full access.")


def actor(user: Any) -> str:
    """Who the timeline names for a command: ``manage.py``, or ``manage.py:as-user:<name>``."""
    return "manage.py" if user is None else f"manage.py:as-user:{user.get_username()}"


def check_change(user: Any, run_id: int) -> None:
    """Refuse a change of run ``run_id`` (an edit) for a ``--as-user`` user without
    ``queuety.change_workflowrun`` (no ``--as-user``: full access).

    Raises:
        Error: the user lacks the permission.
    """
    if user is not None and not user.has_perm("queuety.change_workflowrun"):
        raise Error(f"User {user.get_username()!r} may not change workflow #{run_id}: it needs "
                    "the queuety.change_workflowrun permission. Nothing was changed.")


def reachable(user: Any) -> QuerySet[WorkflowRun] | None:
    """The runs ``user`` may reach, as a queryset to narrow further (None: every run)."""
    return None if user is None else scope.scoped_runs(user, WorkflowRun.objects.all())
