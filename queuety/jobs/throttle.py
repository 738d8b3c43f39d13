"""Throttling after exceptions (the original's ``ThrottlesExceptions`` middleware): after
``max_failures`` failed attempts of a key's jobs within ``window_seconds``, the key's jobs are
held, not failed, until the window has room again.

``@queuety.job_options(throttle_exceptions=(10, 600), throttle_key="smtp")``: the key defaults
to the task's module path. Each failed attempt of a throttled job is written to the start
ledger rate limits count (``GroupStart``, group ``throttle-exceptions:<key>``, indexed by group
and time, shared by every worker); an attempt that finds ``max_failures`` there within the
window raises ``StepHeld``: the step boundary hands it back unstarted (its attempt not
counted, no worker held, its ``TaskResult`` ``READY``) and due again when the oldest of those
failures leaves the window.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from queuety import exceptions
from queuety.core.handlers import StepContext
from queuety.jobs import execute, results
from queuety.jobs import options as job_options
from queuety.models import GroupStart
from queuety.store import groups

#: The ledger's group name of a key's failures.
LEDGER_PREFIX = "throttle-exceptions:"
#: How long the sweeper keeps ledger rows at least (``queuety.runtime.sweeper``): the longest
#: window a throttle may have.
MAX_WINDOW_SECONDS = 3600.0
SYNC_HANDLER = "queuety.jobs.throttle.call_throttled"
ASYNC_HANDLER = "queuety.jobs.throttle.acall_throttled"


def ledger_group(key: str) -> str:
    """The ledger's group name of throttle key ``key``."""
    return f"{LEDGER_PREFIX}{key}"


def hold_for(failures: int, oldest: datetime | None, max_failures: int, window: float,
             now: datetime) -> float | None:
    """Seconds a job of a key must wait, given its ``failures`` in the window and the
    ``oldest`` of them (None: it may run now). It runs again when the oldest leaves the
    window; at least a little later, so that the count has changed when it comes back."""
    if failures < max_failures or oldest is None:
        return None
    return max((oldest + timedelta(seconds=window) - now).total_seconds(), 0.0) + 0.05


def _settings(task: Any) -> tuple[int, float, str] | None:
    """``(max_failures, window_seconds, key)`` of ``task``'s jobs, or None: not throttled."""
    options = job_options.for_task(task.module_path, task.get_backend().job_options)
    given = options.get("throttle_exceptions")
    if given is None:
        return None
    max_failures, window = given
    return int(max_failures), float(window), str(options.get("throttle_key") or task.module_path)


def _check(task: Any, run_id: int) -> tuple[int, float, str] | None:
    """The task's throttle, after raising ``StepHeld`` if its key is throttled now."""
    found = _settings(task)
    if found is None:
        return None
    max_failures, window, key = found
    now = timezone.now()
    group = ledger_group(key)
    failures = groups.recent_starts(group, window, now)
    oldest = groups.oldest_start(group, now - timedelta(seconds=window)) if failures else None
    wait = hold_for(failures, oldest, max_failures, window, now)
    if wait is not None:
        raise exceptions.StepHeld(wait, f"job {run_id} of task {task.module_path}: throttle "
                                        f"key {key!r} had {failures} failed attempts in the "
                                        f"last {window:g} s (at most {max_failures})")
    return found


def _record(found: tuple[int, float, str] | None) -> None:
    if found is not None:
        GroupStart.objects.create(group=ledger_group(found[2]), started_at=timezone.now())


def call_throttled(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Run one attempt of a sync throttled job: held while its key is throttled; a failure
    is counted against its key."""
    found = _check(results.task_of(state, context.run_id), context.run_id)
    try:
        return execute.call_task(state, context)
    except Exception:
        _record(found)
        raise


async def acall_throttled(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """:func:`call_throttled` for an ``async def`` task."""
    task = results.task_of(state, context.run_id)
    found = await sync_to_async(_check)(task, context.run_id)
    try:
        return await execute.acall_task(state, context)
    except Exception:
        await sync_to_async(_record)(found)
        raise
