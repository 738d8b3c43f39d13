"""Unique jobs: one job per key, every enqueue of the key answered with that job.

A task with ``unique_for`` (seconds) or ``unique_key`` (a string, or a callable of the task's
arguments returning one) has at most one job per key: for ``unique_for`` seconds after the
first enqueue, or, without ``unique_for``, for as long as its job exists. The key defaults to
the arguments themselves. Races are decided by the dispatch key's unique index (the original's
idempotent dispatch, ``queuety.dispatch``): of 32 concurrent enqueues of one key, one writes a
job and the others wait for its commit and get its id. A key older than ``unique_for`` is
deleted by the next enqueue of it, in a statement of its own, before that enqueue's dispatch;
so is a key whose job was purged.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q

from queuety.core.definition import canonical_json
from queuety.jobs import framework
from queuety.models import UNIQUE_KEY_PREFIX, DispatchKey, WorkflowRun

#: What every job's dispatch key starts with; then the task's module path and the key.
PREFIX = UNIQUE_KEY_PREFIX
#: The longest dispatch key (the column's length); a longer one is stored as its hash.
KEY_LENGTH = 255


def key_of(task: Any, options: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """The dispatch key of a unique job of ``task`` with ``arguments`` (None: not unique)."""
    if options.get("unique_for") is None and options.get("unique_key") is None:
        return None
    given = options.get("unique_key")
    if callable(given):
        try:
            given = given(*arguments["args"], **arguments["kwargs"])
        except Exception as error:
            raise framework.InvalidTask(
                f"The unique_key of task {task.module_path} raised {type(error).__name__}: "
                f"{error}; nothing was enqueued.") from error
        if not isinstance(given, str) or not given.strip():
            raise framework.InvalidTask(
                f"The unique_key of task {task.module_path} returned {given!r}, not a "
                "non-blank string; nothing was enqueued.")
    if given is None:
        given = hashlib.sha256(canonical_json(arguments).encode()).hexdigest()
    key = f"{PREFIX}{task.module_path}:{given}"
    if len(key) > KEY_LENGTH:
        key = f"{PREFIX}sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def expire(key: str, options: dict[str, Any], now: datetime) -> None:
    """Forget ``key`` if it is older than the task's ``unique_for``, or if its job is gone
    (purged, by ``job purge`` or retention): the next enqueue then starts a new job."""
    gone = ~Exists(WorkflowRun.objects.filter(pk=OuterRef("run_id")))
    period = options.get("unique_for")
    stale = gone if period is None else gone | Q(created_at__lt=now - timedelta(seconds=period))
    DispatchKey.objects.filter(stale, key=key).delete()
