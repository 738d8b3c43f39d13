"""Rows of paused queues (``queuety.queues``): holding a step whose queue is paused, and
releasing the held rows when it resumes.

A held row is THROTTLED with ``throttled_by = {"group": None, "reason": "queue paused",
"queue": <name>, ...}``. It leaves its concurrency group and queue budget (``concurrency_group``
and ``queue`` emptied, not woken), so the resource wake-ups never pick it: only a resume
releases it, and its gate then decides it afresh.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Exists

from queuety.models import QueuePause, StepRun, StepStatus

#: The ``reason`` of a row held by a paused queue.
PAUSED = "queue paused"


def record(queue: str, now: datetime) -> dict[str, Any]:
    """The ``throttled_by`` of a row held because ``queue`` is paused."""
    return {"group": None, "reason": PAUSED, "queue": queue,
            "detail": f"Queue {queue!r} is paused; the step starts when it is resumed.",
            "since": now.isoformat()}


def hold_paused(step_run_id: int, queue: str, now: datetime) -> bool:
    """Hold the due pending task row ``step_run_id`` throttled while ``queue`` is paused (one
    statement; the claim refused the row). False when the queue is not paused or the row is
    not a due pending task row (then the claim refused it for another reason)."""
    return bool(StepRun.objects.filter(
        Exists(QueuePause.objects.filter(queue=queue)),
        pk=step_run_id, status=StepStatus.PENDING, kind="step", available_at__lte=now,
    ).update(status=StepStatus.THROTTLED, woken=False, concurrency_group="", queue="",
             throttled_by=record(queue, now)))


def held(queue: str, limit: int) -> list[tuple[int, int, int, float | None]]:
    """``(id, definition id, step index, timeout)`` of at most ``limit`` rows ``queue``'s
    pause holds, oldest first."""
    return list(StepRun.objects.filter(
        status=StepStatus.THROTTLED, throttled_by__reason=PAUSED, throttled_by__queue=queue,
    ).order_by("pk").values_list("pk", "run__definition_id", "step_index", "timeout")[:limit])


def release(ids: list[int], now: datetime) -> int:
    """Make held rows ``ids`` pending and due now (their messages are the caller's); returns
    how many it released."""
    return StepRun.objects.filter(pk__in=ids, status=StepStatus.THROTTLED,
                                  throttled_by__reason=PAUSED).update(
        status=StepStatus.PENDING, available_at=now, published_at=now, throttled_by=None)
