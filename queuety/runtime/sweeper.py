"""The sweeper: the backstops that make lost work impossible to lose for good.

Run every ``SWEEP_INTERVAL`` seconds by one worker at a time (``queuety.runtime.sweep_tick``:
every worker's main process offers, the sweeper's lease picks one; a ``queuety.sweep`` message
from beat goes through the same lease). Each phase is safe to run concurrently with workers
and with itself: every change is guarded by the row's status and attempt, or taken under the
run's row lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import DatabaseError, OperationalError, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from queuety import exceptions, instruments, publish
from queuety.conf import settings
from queuety.core import agent_limits, flow
from queuety.core.status import FINISHED
from queuety.models import Event, RunStatus, StepRun, StepStatus, Worker, WorkflowRun
from queuety.runtime import bulk_recovery, paused, wakeups
from queuety.runtime.claim import claim_of, worker_of
from queuety.runtime.expiry import expire_due
from queuety.runtime.finish import fail_run, fail_unloadable, release_stranded
from queuety.runtime.outcome import record_failure
from queuety.runtime.recovery import interruption
from queuety.runtime.reminders import remind_due
from queuety.runtime.settle import resume_waiting
from queuety.store import groups, rows
from queuety.store.definitions import load_spec
from queuety.webhooks import delivery as webhooks

logger = logging.getLogger("queuety")

#: Seconds past the hard time limit before the sweeper declares a timed-out attempt dead,
#: leaving the pool time to kill the process.
KILL_MARGIN = 0.5
#: Seconds a phase waits for a run's row that another transaction holds before it leaves the
#: run to the next sweep.
LOCK_WAIT = 2.0


def sweep(now: datetime | None = None,
          still_held: Callable[[], bool] | None = None) -> dict[str, int]:
    """Recover lost attempts and re-publish due steps whose message may be lost; also wake
    runs whose wake-up was lost, settle waits whose timeout passed, send the reminders of
    waits that are due, fail runs past their deadline, release steps held by a queue pause
    that is gone, and purge old finished runs.

    ``still_held`` is asked before each phase (it renews the sweeper's lease): False stops
    the sweep there, the phases left to the worker that took the lease over.

    Returns counts of what each phase did (-1 for a phase that failed; the others still run).
    """
    now = now or timezone.now()
    report: dict[str, int] = {}
    phases: tuple[tuple[str, Callable[[datetime], int]], ...] = (
        ("workers", recover_lost_workers), ("recovered", recover_lost),
        ("throttled", wake_throttled), ("republished", republish_due),
        ("parents", wake_parents), ("expired", expire_due), ("reminded", remind_due),
        ("overdue", fail_overdue), ("queued", release_stranded),
        ("unpaused", paused.release_orphans),
        ("purged", purge_finished), ("webhooks", webhooks.recover),
        ("bulk", bulk_recovery.recover))
    for name, phase in phases:
        if still_held is not None and not _held(still_held, name):
            break
        try:
            report[name] = phase(now)
        except Exception:  # noqa: BLE001 - the other phases still run
            logger.exception("Sweeper phase %r failed", name)
            report[name] = -1
    if any(report.values()):
        logger.info("Sweep %s", " ".join(f"{k}={v}" for k, v in report.items()))
    instruments.swept(report)
    return report


def _held(still_held: Callable[[], bool], phase: str) -> bool:
    """Whether the sweep may go on to ``phase`` (its lease renewed); a renewal that fails
    counts as the lease lost."""
    try:
        held = still_held()
    except Exception:  # noqa: BLE001 - the database away: the lease cannot be renewed
        logger.exception("The sweep could not renew the sweeper's lease before its phase %r; "
                         "it stops there.", phase)
        return False
    if not held:
        logger.warning("The sweep stops before its phase %r: its worker is stopping, or it "
                       "lost the sweeper's lease (a phase outlasted QUEUETY['SWEEP_LEASE']?); "
                       "the next sweep runs the rest.", phase)
    return held


def recover_lost_workers(now: datetime) -> int:
    """Take back what workers that stopped beating held; return how many were lost.

    A worker whose main process has not beaten for ``WORKER_LOST_AFTER`` (by the database's
    clock, which every beat is stamped with) is lost, and leaves the registry. Which messages
    it had reserved is not known, so every pending row whose message it may have held (sent
    while it lived, or a back-off's or a delay's, due later) is published again, once for all
    the workers lost in one sweep and at most 1,000 a sweep, with the time it still has to
    wait. A second message for a row is harmless: the claim drops it, and an early one is held
    again for its due time.

    The attempts of workers no longer in the registry are recorded as ``WorkerLost`` (and
    retried while attempts remain) once their own heartbeats are ``WORKER_LOST_AFTER`` old:
    found by the worker's name their ``claimed_by`` carries, whichever pool process claimed
    them, and not before a pool process that outlived its main process stops beating.
    """
    lost_after = timedelta(seconds=settings.WORKER_LOST_AFTER)
    with transaction.atomic():
        workers = rows.lock_lost_workers(lost_after, limit=20)
        published = _publish_held(workers, now) if workers else 0
        # Attempts claimed as host:pid by workers of earlier versions: named by their beat.
        listed = [name for w in workers for name in w.processes if not worker_of(name)]
        held = list(StepRun.objects.filter(
            status=StepStatus.PROCESSING, claimed_by__in=listed,
            heartbeat_at__lt=now - lost_after).select_related("run")) if listed else []
        # Forgotten only once their messages are out: beyond 1,000, the next sweep goes on.
        if workers and published < 1000:
            rows.forget_workers([w.pk for w in workers])
        held += _attempts_of_gone_workers(now - lost_after)
    if workers:
        logger.warning("Workers %s stopped beating; %d message(s) they may have held are "
                       "published again and %d attempt(s) of workers that stopped beating are "
                       "recorded as lost (each once its own heartbeat is %gs old).",
                       ", ".join(w.name for w in workers), published, len(held),
                       settings.WORKER_LOST_AFTER)
    elif held:
        logger.warning("%d attempt(s) of workers that stopped beating (%s) are recorded as "
                       "lost: their heartbeats are %gs old.", len(held),
                       ", ".join(sorted({worker_of(row.claimed_by) for row in held})),
                       settings.WORKER_LOST_AFTER)
    for row in held:
        _recover_row(row, timed_out=False)
    return len(workers)


def _publish_held(workers: list[Worker], now: datetime) -> int:
    """Publish again the messages lost ``workers`` may have reserved; return how many."""
    # A worker may have lived up to one beat past its last one.
    alive_until = max(w.beat_at for w in workers) + timedelta(
        seconds=settings.HEARTBEAT_INTERVAL)
    pending = rows.lock_pending_sent_before(alive_until)
    if pending:
        # As when first sent: a held message counts as out from its due time.
        StepRun.objects.filter(pk__in=[pk for pk, *_ in pending]).update(
            published_at=Greatest(Value(now), F("available_at")))
        publish.publish_on_commit([
            _message(pk, definition_pk, index, kind, timeout, _countdown(due, now))
            for pk, definition_pk, timeout, due, index, kind in pending])
    return len(pending)


def _attempts_of_gone_workers(stale_before: datetime) -> list[StepRun]:
    """The processing rows, with their runs, claimed by a worker no longer in the registry
    (lost, or gone without leaving it) that have not beaten since ``stale_before``."""
    # The partial index on processing rows' heartbeats: rows that beat on are never read.
    stale = list(StepRun.objects.filter(
        status=StepStatus.PROCESSING, heartbeat_at__lt=stale_before, claimed_by__contains="@",
    ).select_related("run").order_by("heartbeat_at")[:500])
    names = {worker_of(row.claimed_by) for row in stale} - {""}
    alive = rows.registered_workers(names) if names else set()
    return [row for row in stale if worker_of(row.claimed_by) not in alive | {""}]


def _countdown(due: datetime, now: datetime) -> float | None:
    """Seconds a re-published message must still wait (None: due now)."""
    wait = (due - now).total_seconds()
    return wait if wait > 0 else None


def recover_lost(now: datetime) -> int:
    """Record attempts whose heartbeat went stale, or which outlived their hard time limit.

    A timed attempt still processing past its hard limit was not recorded by its worker's main
    process, which kills and records it at that limit: either that process could not write,
    or the whole worker is gone. It timed out only if its process was still beating at its
    deadline; if its last heartbeat came before, the process died before the deadline and the
    attempt is a lost worker's, retried like any other.
    """
    stale_before = now - timedelta(seconds=settings.STALE_AFTER)
    margin = KILL_MARGIN
    candidates = (StepRun.objects.filter(status=StepStatus.PROCESSING)
                  .filter(Q(heartbeat_at__lt=stale_before) | Q(timeout__isnull=False))
                  .select_related("run")[:500])
    recovered = 0
    for row in candidates:
        past_limit = row.timeout is not None and row.claimed_at is not None and (
            row.claimed_at + timedelta(seconds=publish.hard_limit(row.timeout) + margin) < now)
        if not past_limit and not (row.heartbeat_at and row.heartbeat_at < stale_before):
            continue
        timed_out = past_limit and row.timeout is not None and row.claimed_at is not None \
            and row.heartbeat_at is not None \
            and row.heartbeat_at >= row.claimed_at + timedelta(seconds=row.timeout)
        _recover_row(row, timed_out=timed_out)
        recovered += 1
    return recovered


def _recover_row(row: StepRun, *, timed_out: bool) -> None:
    """Record the attempt of a processing row whose process is gone (guarded by its claim)."""
    # One bad row must not stop the sweeper for every other run.
    try:
        record_failure(claim_of(row), load_spec(row.run.definition_id),
                       interruption(row, timed_out), None)
    except DatabaseError:  # passing, perhaps: the next sweep tries again
        logger.exception("Could not recover step run id=%s; the next sweep tries again.",
                         row.pk)
    except Exception as error:  # noqa: BLE001 - a definition or policy that cannot load
        logger.exception("Could not recover step run id=%s; failing it.", row.pk)
        fail_unloadable(row.pk, row.run_id, error)


def wake_throttled(now: datetime) -> int:
    """Start throttled steps into their groups' free slots (a wake-up lost with a worker, a
    slot freed by recovery, a limit the site raised); forget the reservations of woken rows
    whose message is overdue (``republish_due`` sends it again) and prune the rate ledger.
    Returns how many steps were woken."""
    groups.release_stale_woken(now - timedelta(seconds=settings.REDELIVER_AFTER))
    horizon = agent_limits.ledger_horizon(
        [float(rate[1]) for rate in settings.RATE_LIMITS.values()], settings.AGENT_LIMITS)
    groups.prune_starts(now - timedelta(seconds=horizon))
    return wakeups.wake_all(now)


def republish_due(now: datetime) -> int:
    """Publish due rows whose message never went out (long delays) or may have been lost."""
    silent_since = now - timedelta(seconds=settings.REDELIVER_AFTER)
    with transaction.atomic():
        due = rows.lock_due_unpublished(now, silent_since)
        if due:
            StepRun.objects.filter(pk__in=[row[0] for row in due]).update(published_at=now)
            publish.publish_on_commit([
                _message(pk, definition_pk, index, kind, timeout)
                for pk, definition_pk, timeout, index, kind in due])
    return len(due)


def _message(pk: int, definition_pk: int, index: int, kind: str, timeout: float | None,
             countdown: float | None = None) -> publish.Message:
    """The message of a row the sweeper publishes again: a step's on its own queue and with its
    priority, a cleanup row's on the workflow's queue."""
    spec = load_spec(definition_pk)
    if kind == "step":
        return publish.step_message(spec, pk, index, timeout, countdown)
    return publish.Message(pk, countdown, timeout, spec.queue)


def wake_parents(now: datetime) -> int:
    """Move on runs whose child or awaited run finished but whose wake-up message was lost."""
    waiting = set(WorkflowRun.objects.filter(
        status=RunStatus.WAITING_FOR_WORKFLOWS, children__status__in=FINISHED,
        children__parent_step=F("current_step"),
    ).values_list("pk", flat=True).distinct()[:200])
    waiting.update(rows.finished_dependencies())
    moved = 0
    for run_id in sorted(waiting):
        try:
            moved += resume_waiting(run_id) not in (None, RunStatus.WAITING_FOR_WORKFLOWS)
        except Exception:  # noqa: BLE001 - one bad run must not stop the sweep
            logger.exception("Could not wake waiting run id=%s", run_id)
    return moved


def fail_overdue(now: datetime | None = None) -> int:
    """Fail runs past their deadline, waiting and paused ones included; return how many."""
    now = now or timezone.now()
    overdue = list(WorkflowRun.objects.filter(
        deadline_at__lte=now, status__in=(RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL,
                                          RunStatus.WAITING_FOR_WORKFLOWS, RunStatus.PAUSED),
    ).values_list("pk", flat=True)[:200])
    for run_id in overdue:
        try:
            _fail_if_overdue(run_id, now)
        except OperationalError:  # its row held elsewhere past LOCK_WAIT: the next sweep
            logger.warning("Run id=%s is past its deadline but its row stayed locked by "
                           "another transaction for %gs; the next sweep fails it.", run_id,
                           LOCK_WAIT)
    return len(overdue)


def _fail_if_overdue(run_id: int, now: datetime) -> None:
    with transaction.atomic():
        rows.bound_lock_waits(LOCK_WAIT)
        run = rows.lock_run(run_id, steps_first=True)
        if run.status in FINISHED or run.deadline_at is None or run.deadline_at > now:
            return
        spec = load_spec(run.definition_id)
        error = flow.failure_record(exceptions.DeadlineExceeded(
            f"Run {run.pk} of workflow {run.name!r} missed its deadline of "
            f"{run.deadline_at.isoformat()} (must complete within "
            f"{spec.deadline_seconds or 0:g}s)."),
            step=spec.steps[run.current_step].name
            if run.current_step < len(spec.steps) else None,
            step_index=run.current_step, attempt=None, max_attempts=None)
        rows.stop_live_steps(run.pk, now)
        fail_run(spec, run.pk, error, now, cause="deadline", announce=Event(
            run_id=run.pk, kind="workflow_deadline_exceeded",
            data={"error": error, "previous_status": run.status}))


#: The purge phase's work (``queuety.retention.sweep_phase``, which archives through the
#: export above this layer), installed by the app's ``ready()``.
_purger: Callable[[datetime], int] | None = None


def use_purger(purger: Callable[[datetime], int]) -> None:
    """Install the purge phase's function (called once, by ``QueuetyConfig.ready``)."""
    global _purger  # noqa: PLW0603 - one function installed at start, as signals' sinks
    _purger = purger


def purge_finished(now: datetime | None = None) -> int:
    """Archive and purge one batch of finished runs past ``QUEUETY["RETENTION"]`` and forget
    one batch of expired dispatch-key tombstones; return how many (queuety.retention)."""
    if _purger is None:
        return 0
    return _purger(now or timezone.now())
