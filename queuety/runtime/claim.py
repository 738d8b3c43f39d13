"""Claiming a step row, and the guard that says the row is still this attempt's.

A claim is one conditional UPDATE (pending -> processing, attempt + 1). A message for a row it
cannot claim is dropped, so duplicate messages are harmless. Every later write of the attempt
is guarded by ``(status = processing, attempt, claimed_by)``: an attempt the sweeper took for
lost, or whose run was cancelled or rewound, writes nothing.

In a worker, ``claimed_by`` names the worker as well as the process: ``<worker>/<pid>``, where
``<worker>`` is the main process's name in the worker registry (``host:pid@start``). So the
sweeper finds every attempt of a lost worker by what its rows carry, whichever pool process
(forked before or after the worker's last beat) claimed it. Outside a worker (a shell, a test
running steps in-process) it is ``host:pid``.
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
    """The process holding the attempt (:func:`worker_id`): with ``attempt``, the row's guard."""
    branch: int = 0
    """The row's position in a fan-out (0 for other steps)."""
    timeout: float | None = None
    """The row's timeout: seconds the attempt may run (its step's, or its branch's)."""
    trace_context: str = ""
    """The run's W3C trace context ('' when it was dispatched without tracing)."""
    queue: str = ""
    """The queue the attempt's message came from (its routing key; '' when unknown): the
    queue a pause names (``queuety.queues``), also for the steps continued inline."""


#: Longest host name kept in a worker's name, so that ``claimed_by`` (``host:pid@start/pid``)
#: fits its 255 characters whatever the machine is called.
MAX_HOST = 200

#: This process's worker's registry name; set in the worker's main process before its pool
#: starts, so every pool process (replacements forked later too) inherits it. '' elsewhere.
_worker = ""
#: When that worker was named (its start, as its registry row records it).
_worker_started: datetime | None = None


def name_worker(started_at: datetime) -> str:
    """Name this process's worker ``host:pid@start`` (``started_at``, to the microsecond) and
    return the name; from now on :func:`worker_id` names processes as this worker's.

    Call it in the worker's main process before its pool starts (``worker_init``): the pool
    processes inherit the name. The start time is part of it: a worker restarted with the same
    host and pid (a container's PID 1) is a new worker, and the old one is found lost.
    """
    global _worker, _worker_started
    host = socket.gethostname()[:MAX_HOST]
    _worker = f"{host}:{os.getpid()}@{started_at:%Y%m%dT%H%M%S.%f}"
    _worker_started = started_at
    return _worker


def worker_name() -> str:
    """This process's worker's registry name ('' outside a worker)."""
    return _worker


def worker_started() -> datetime | None:
    """When this process's worker was named (None outside a worker)."""
    return _worker_started


def worker_id(pid: int | None = None) -> str:
    """Return the ``claimed_by`` of this process, or of this worker's process ``pid``:
    ``<worker name>/<pid>`` in a worker, ``host:pid`` elsewhere."""
    pid = os.getpid() if pid is None else pid
    if _worker:
        return f"{_worker}/{pid}"
    return f"{socket.gethostname()}:{pid}"


def worker_of(claimed_by: str) -> str:
    """The registry name of the worker whose process ``claimed_by`` names ('' for a
    ``host:pid``, claimed outside a worker or by a worker older than the name)."""
    worker, slash, pid = claimed_by.rpartition("/")
    return worker if slash and "@" in worker and pid.isdigit() else ""


def pid_of(claimed_by: str) -> int | None:
    """The process id a ``claimed_by`` names, in either form (``<worker>/<pid>`` or
    ``host:pid``); None when it names none."""
    worker, slash, pid = claimed_by.rpartition("/")
    if not slash:
        pid = claimed_by.rpartition(":")[2]
    return int(pid) if pid.isdigit() else None


def claim(step_run_id: int, now: datetime | None = None, *, queue: str = "") -> Claim | None:
    """Claim a due pending step for this worker; return ``None`` when it is not claimable
    (also when ``queue``, the queue its message came from, is paused: ``queuety.queues``)."""
    now = now or timezone.now()
    stamp = connection.ops.adapt_datetimefield_value(now)
    me = worker_id()
    if connection.vendor == "postgresql":
        # Inside a transaction the relaxed commit would cover its owner's writes too.
        alone = connection.get_autocommit() and not connection.in_atomic_block
        statement = sql.CLAIM_POSTGRES_ALONE if alone else sql.CLAIM_POSTGRES
        row = rows.execute_hot(statement, [stamp, stamp, me, step_run_id, stamp, queue])
        if row is None:
            return None
        (run_id, step_index, seq, attempt, definition_pk, state, revision,
         *counters, kind, branch, timeout, trace_context) = row
    else:
        with rows.hot_cursor() as cursor:
            cursor.execute(sql.CLAIM_SQLITE, [stamp, stamp, me, step_run_id, stamp, queue])
            row = cursor.fetchone()
            if row is None:
                return None
            run_id, step_index, seq, attempt, kind, branch, timeout = row
            cursor.execute(sql.CLAIMED_RUN_SQLITE, [run_id])
            definition_pk, state, revision, *counters, trace_context = cursor.fetchone()
    return Claim(step_run_id, run_id, step_index, seq, attempt, definition_pk,
                 rows.json_value(state), revision, now, budgets.Usage(*counters), kind, me,
                 branch, timeout, trace_context or "", queue)


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
