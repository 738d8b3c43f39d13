"""Rows of paused queues (``queuety.queues``): holding a step whose queue is paused, and
finding the held rows to release when it resumes (or when its pause is gone: the sweeper).

A held row is THROTTLED with ``throttled_by = {"group": None, "reason": "queue paused",
"queue": <name>, ...}``. It leaves its concurrency group and queue budget (``concurrency_group``
and ``queue`` emptied, not woken), so the resource wake-ups never pick it: only a resume (or
the sweeper, once no pause row names its queue) releases it, and its gate then decides it
afresh.

The hold reads the pause row ``FOR KEY SHARE``: a resume's ``DELETE`` of it waits for the holds
in flight, so a row held by a pause is always committed before the resume looks for held
rows (otherwise a hold that read the pause before the delete and committed after the resume's
search would stay held with no pause).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef
from django.db.models.fields.json import KT

from queuety.models import QueuePause, StepRun, StepStatus

#: The ``reason`` of a row held by a paused queue.
PAUSED = "queue paused"

_HOLD = """
UPDATE queuety_steprun SET status = 'throttled', woken = false, concurrency_group = '',
       queue = '', throttled_by = %s::jsonb
 WHERE id = %s AND status = 'pending' AND kind = 'step' AND available_at <= %s
   AND EXISTS (SELECT 1 FROM queuety_queuepause WHERE queue = %s FOR KEY SHARE)
"""


def record(queue: str, now: datetime) -> dict[str, Any]:
    """The ``throttled_by`` of a row held because ``queue`` is paused."""
    return {"group": None, "reason": PAUSED, "queue": queue,
            "detail": f"Queue {queue!r} is paused; the step starts when it is resumed.",
            "since": now.isoformat()}


def refusal(step_run_id: int, queue: str) -> dict[str, Any] | None:
    """What a refused claim of ``step_run_id`` decides from, in one query: the row if it is
    pending (``available_at``, ``timeout``, ``step_index``, ``kind``, ``run__definition_id``,
    ``run__status``) and ``paused``, whether ``queue`` (its message's) is paused; None when
    the row is not pending (a duplicate message)."""
    rows = StepRun.objects.filter(pk=step_run_id, status=StepStatus.PENDING)
    fields = ["available_at", "timeout", "step_index", "kind", "run__definition_id",
              "run__status"]
    if not queue:
        row = rows.values(*fields).first()
        return None if row is None else {**row, "paused": False}
    return rows.annotate(paused=Exists(QueuePause.objects.filter(queue=queue))).values(
        *fields, "paused").first()


def hold_paused(step_run_id: int, queue: str, now: datetime) -> bool:
    """Hold the due pending task row ``step_run_id`` throttled while ``queue`` is paused (one
    statement; the claim refused the row). False when the queue is not paused (any more) or
    the row is not a due pending task row."""
    if connection.vendor != "postgresql":  # SQLite runs one write at a time
        return bool(StepRun.objects.filter(
            Exists(QueuePause.objects.filter(queue=queue)), pk=step_run_id,
            status=StepStatus.PENDING, kind="step", available_at__lte=now,
        ).update(status=StepStatus.THROTTLED, woken=False, concurrency_group="", queue="",
                 throttled_by=record(queue, now)))
    with connection.cursor() as cursor:
        cursor.execute(_HOLD, [json.dumps(record(queue, now)), step_run_id, now, queue])
        return bool(cursor.rowcount)


def held(queue: str | None, limit: int, after: int = 0
         ) -> list[tuple[int, int, int, float | None, str]]:
    """``(id, definition id, step index, timeout, queue)`` of at most ``limit`` rows held by
    ``queue``'s pause (with None: by a pause no row names any more, the sweeper's), by id,
    after id ``after``."""
    rows = StepRun.objects.filter(status=StepStatus.THROTTLED, concurrency_group="",
                                  throttled_by__reason=PAUSED, pk__gt=after)
    if queue is None:
        rows = rows.alias(held_by=KT("throttled_by__queue")).filter(
            ~Exists(QueuePause.objects.filter(queue=OuterRef("held_by"))))
    else:
        rows = rows.filter(throttled_by__queue=queue)
    return [(pk, definition_pk, index, timeout, (by or {}).get("queue") or "")
            for pk, definition_pk, index, timeout, by in rows.order_by("pk").values_list(
                "pk", "run__definition_id", "step_index", "timeout", "throttled_by")[:limit]]


def release(ids: list[int], now: datetime) -> int:
    """Make held rows ``ids`` pending and due now (their messages are the caller's); returns
    how many it released."""
    return StepRun.objects.filter(pk__in=ids, status=StepStatus.THROTTLED,
                                  throttled_by__reason=PAUSED).update(
        status=StepStatus.PENDING, available_at=now, published_at=now, throttled_by=None)
