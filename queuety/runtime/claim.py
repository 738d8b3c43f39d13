"""Claiming a step row, and the guard that says the row is still this attempt's.

A claim is one conditional UPDATE (pending -> processing, attempt + 1). A message for a row it
cannot claim is dropped, so duplicate messages are harmless. Every later write of the attempt
is guarded by ``(status = processing, attempt, claimed_by)``: an attempt the sweeper took for
lost, or whose run was cancelled or rewound, writes nothing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from queuety.core import budget as budgets
from queuety.models import StepRun, StepStatus
from queuety.store import rows, sql


@dataclass(frozen=True, slots=True)
class Claim:
    """What a worker holds while it runs one attempt of one step."""

    step_run_id: int
    run_id: int
    step_index: int
    seq: int
    attempt: int
    definition_id: int
    state: dict[str, Any]
    revision: int
    claimed_at: datetime | None = None
    usage: budgets.Usage = budgets.Usage()
    """Budget counters of the run when the step was claimed."""
    kind: str = "step"
    """``step``, or ``compensation`` / ``hook`` for cleanup rows."""
    claimed_by: str = ""
    """``host:pid`` of the process holding the attempt: with ``attempt``, the row's guard."""
    branch: int = 0
    """The row's position in a fan-out (0 for other steps)."""
    timeout: float | None = None
    """The row's timeout: seconds the attempt may run (its step's, or its branch's)."""
    trace_context: str = ""
    """The run's W3C trace context ('' when it was dispatched without tracing)."""


def worker_id(pid: int | None = None) -> str:
    """Return ``host:pid`` naming the process that claims a step (``pid``: another process)."""
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"


def claim(step_run_id: int, now: datetime | None = None) -> Claim | None:
    """Claim a due pending step for this worker; return ``None`` when it is not claimable."""
    now = now or timezone.now()
    stamp = connection.ops.adapt_datetimefield_value(now)
    me = worker_id()
    if connection.vendor == "postgresql":
        row = rows.execute_hot(sql.CLAIM_POSTGRES, [stamp, stamp, me, step_run_id, stamp])
        if row is None:
            return None
        (run_id, step_index, seq, attempt, definition_pk, state, revision,
         *counters, kind, branch, timeout, trace_context) = row
    else:
        with rows.hot_cursor() as cursor:
            cursor.execute(sql.CLAIM_SQLITE, [stamp, stamp, me, step_run_id, stamp])
            row = cursor.fetchone()
            if row is None:
                return None
            run_id, step_index, seq, attempt, kind, branch, timeout = row
            cursor.execute(sql.CLAIMED_RUN_SQLITE, [run_id])
            definition_pk, state, revision, *counters, trace_context = cursor.fetchone()
    return Claim(step_run_id, run_id, step_index, seq, attempt, definition_pk,
                 rows.json_value(state), revision, now, budgets.Usage(*counters), kind, me,
                 branch, timeout, trace_context or "")


def claim_of(row: StepRun) -> Claim:
    """The claim a processing row records (its run selected with it): for recording the
    outcome of an attempt whose process is gone."""
    run = row.run
    return Claim(row.pk, row.run_id, row.step_index, row.seq, row.attempt, run.definition_id,
                 run.state, run.revision, row.claimed_at, rows.usage_of(run), row.kind,
                 row.claimed_by, row.branch, row.timeout, run.trace_context)


def owned(held: Claim) -> QuerySet[StepRun]:
    """The attempt's step row, as long as it is still this attempt's to finish."""
    return StepRun.objects.filter(pk=held.step_run_id, status=StepStatus.PROCESSING,
                                  attempt=held.attempt, claimed_by=held.claimed_by)


def mark_completed(held: Claim, output: dict[str, Any] | None, now: datetime) -> bool:
    """Complete the attempt's row with ``output``; False if the row is no longer its own."""
    return bool(owned(held).update(status=StepStatus.COMPLETED, finished_at=now, output=output))


def applied_by(held: Claim) -> bool:
    """Whether this very attempt already completed its step row: a try whose commit reached
    the server although its answer was lost with the connection."""
    return StepRun.objects.filter(pk=held.step_run_id, status=StepStatus.COMPLETED,
                                  attempt=held.attempt, claimed_by=held.claimed_by).exists()
