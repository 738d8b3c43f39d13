"""A dead worker's attempt: recorded by the worker's main process at once, or by the sweeper.

Every record is guarded by the dead process's ``claimed_by``, so recovery never touches an
attempt another process owns, and a record tried twice writes once.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import InterfaceError, OperationalError, connection
from django.db.models import Q

from queuety import exceptions
from queuety.conf import settings
from queuety.models import StepRun, StepStatus
from queuety.runtime import wakeups
from queuety.runtime.claim import claim_of, worker_id
from queuety.runtime.outcome import record_failure
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")

#: Seconds between two tries of a death's record that could not reach the database.
RETRY_EVERY = 1.0


def record_death(step_run_id: int, pid: int, *, hard_timeout: bool) -> None:
    """Record, in a worker's main process, that its pool process ``pid`` died while running
    step row ``step_run_id`` (``hard_timeout``: killed at the hard time limit).

    A record that cannot reach the database (PostgreSQL restarting) is tried again every
    :data:`RETRY_EVERY` seconds, on a new connection, in a thread of its own, so the consumer
    thread never waits: the loss is recorded within a second or two of the database answering.
    After ``STALE_AFTER`` it stops: by then the sweeper's stale-heartbeat path records the
    attempt at its first sweep once the database answers.
    """
    claimed_by = worker_id(pid)
    if _tried(step_run_id, claimed_by, pid, hard_timeout):
        return
    logger.warning("Could not record yet that pool process %s died while running step run "
                   "id=%s: the database did not answer. Trying again every %gs.", pid,
                   step_run_id, RETRY_EVERY)
    threading.Thread(target=_record_later, name=f"queuety-record-{step_run_id}",
                     args=(step_run_id, claimed_by, pid, hard_timeout,
                           time.monotonic() + settings.STALE_AFTER), daemon=True).start()


def _tried(step_run_id: int, claimed_by: str, pid: int, hard_timeout: bool) -> bool:
    """Try the record once; False when the database did not answer (worth another try)."""
    try:
        _record(step_run_id, claimed_by, pid, hard_timeout)
    except (OperationalError, InterfaceError):
        # This thread's connection is broken: every later record on it would fail too.
        connection.close()
        return False
    except Exception:  # noqa: BLE001 - the sweeper recovers the step later anyway
        logger.exception("Could not record the loss of step run id=%s", step_run_id)
    return True


def _record_later(step_run_id: int, claimed_by: str, pid: int, hard_timeout: bool,
                  give_up_at: float) -> None:
    try:
        while True:
            time.sleep(RETRY_EVERY)
            if _tried(step_run_id, claimed_by, pid, hard_timeout):
                return
            if time.monotonic() >= give_up_at:
                logger.error("Could not record that pool process %s died while running step "
                             "run id=%s: the database did not answer for %gs. The sweeper "
                             "records it once the database answers.", pid, step_run_id,
                             settings.STALE_AFTER)
                return
    finally:
        connection.close()


def _record(step_run_id: int, claimed_by: str, pid: int, hard_timeout: bool) -> None:
    if recover_attempt(step_run_id, claimed_by, hard_timeout=hard_timeout) and not hard_timeout:
        logger.warning("Pool process %s died while running step run id=%s; the attempt is "
                       "recorded as WorkerLost and runs again while attempts remain.", pid,
                       step_run_id)


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
