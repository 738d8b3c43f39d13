"""A dead worker's attempt: recorded by the worker's main process at once, or by the sweeper.

Every record is guarded by the dead process's ``claimed_by``, so recovery never touches an
attempt another process owns.
"""

from __future__ import annotations

from django.db.models import Q

from queuety import exceptions
from queuety.models import StepRun, StepStatus
from queuety.runtime import wakeups
from queuety.runtime.claim import claim_of
from queuety.runtime.outcome import record_failure
from queuety.store.definitions import load_spec


def recover_attempt(step_run_id: int, claimed_by: str, *, hard_timeout: bool) -> bool:
    """Record that the process ``claimed_by`` died while running step row ``step_run_id``.

    Called by the worker's main process when a pool process was killed at the hard time limit
    (``hard_timeout``: recorded as :class:`StepTimeout`) or died otherwise (:class:`WorkerLost`).
    The task may have been running a later step of the same run inline (see
    ``queuety.runtime.attempt.execute_step``), or a step of a concurrency group it was handed,
    so every such processing row the dead process held is recorded. Returns True when an attempt was recorded.
    """
    # Also a step of a concurrency group or queue budget the process was handed when a slot
    # freed (a direct hand-off, queuety.runtime.attempt.execute_step), whatever its run.
    held_rows = (StepRun.objects.filter(
        Q(run_id__in=StepRun.objects.filter(pk=step_run_id).values("run_id"))
        | ~Q(concurrency_group="") | ~Q(queue=""), status=StepStatus.PROCESSING, claimed_by=claimed_by)
        .select_related("run").order_by("pk"))
    recorded = False
    freed: set[str] = set()
    queues: set[str] = set()
    for row in held_rows:
        # The row still processing is the step that was running when the process was killed
        # (the message's own, or an inline one under a site-wide time limit): the limit hit it.
        record_failure(claim_of(row), load_spec(row.run.definition_id),
                       interruption(row, hard_timeout), None)
        recorded = True
        if row.concurrency_group:
            freed.add(row.concurrency_group)
        if row.queue:
            queues.add(row.queue)
    # Its slot (and its share of its queue's budget) is free again: the next waiting starts.
    wakeups.wake_freed(freed, queues)
    return recorded


def interruption(row: StepRun, timed_out: bool) -> BaseException:
    """The error an attempt whose process is gone is recorded with: a timeout when a time
    limit killed it, else a lost worker."""
    if timed_out and row.timeout is None:
        # A step without a timeout of its own can still meet the worker's task_time_limit.
        return exceptions.StepTimeout(
            f"Step {row.step_name!r} of run {row.run_id} (attempt {row.attempt}) ran past the "
            f"worker's hard time limit and its process ({row.claimed_by}) was killed."
        )
    if timed_out:
        return exceptions.StepTimeout(
            f"Step {row.step_name!r} of run {row.run_id} (attempt {row.attempt}) ignored its "
            f"timeout of {row.timeout:g}s and its process ({row.claimed_by}) was killed at the "
            "hard limit."
        )
    since = f" since {row.heartbeat_at.isoformat()}" if row.heartbeat_at else ""
    return exceptions.WorkerLost(
        f"The process running step {row.step_name!r} of run {row.run_id} (attempt "
        f"{row.attempt}, {row.claimed_by or 'unknown'}) died or stopped sending "
        f"heartbeats{since}."
    )
