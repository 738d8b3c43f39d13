"""Celery tasks: thin wrappers over ``queuety.runtime``. Names are stable message contracts
(``queuety.publish`` sends them by name)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

# celery-types' billiard stub leaves out ExceptionWithTraceback, which billiard.einfo defines.
from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]
from billiard.exceptions import WorkerLostError
from celery import Task, shared_task, signals
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.worker.request import Request
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from queuety import bulk_actions, schedules
from queuety.runtime import attempt, lane, recovery, settle, sweep_tick, wakeups
from queuety.runtime.claim import name_worker, worker_id
from queuety.runtime.workers import MainProcessBeat
from queuety.store import rows
from queuety.webhooks import delivery

logger = logging.getLogger("queuety")

# Like a request cycle: drop connections that broke or outlived CONN_MAX_AGE, keep the rest
# (a site that sets CELERY_DB_REUSE_MAX keeps them across tasks).
signals.task_prerun.connect(lambda **kwargs: close_old_connections(), weak=False)
signals.task_postrun.connect(lambda **kwargs: close_old_connections(), weak=False)

_beat: MainProcessBeat | None = None
_tick: sweep_tick.SweepTick | None = None

#: The periodic task whose routine lines (received, succeeded, sent by beat) are dropped: the
#: sweeper logs a line of its own when it did something, so an idle site logs nothing.
_QUIET_TASK = "queuety.sweep"


class _QuietSweeps(logging.Filter):
    """Drops Celery's INFO lines about ``queuety.sweep`` (every SWEEP_INTERVAL seconds)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        args = record.args
        values = args.values() if isinstance(args, dict) else args or ()
        return _QUIET_TASK not in values


for _logger in ("celery.app.trace", "celery.worker.strategy", "celery.beat"):
    logging.getLogger(_logger).addFilter(_QuietSweeps())


@signals.worker_ready.connect(weak=False)
def _start_beating(sender: Any = None, **kwargs: Any) -> None:
    """The worker's main process joins the registry once its consumer is up."""
    global _beat
    pool = getattr(sender, "pool", None)
    _beat = MainProcessBeat(lambda: list((getattr(pool, "info", None) or {})
                                         .get("processes") or []))
    _beat.start()


@signals.worker_ready.connect(weak=False)
def _start_sweeping(sender: Any = None, **kwargs: Any) -> None:
    """The worker's main process takes its turns at sweeping (``queuety.runtime.sweep_tick``),
    so recovery needs no beat process."""
    global _tick
    _tick = sweep_tick.SweepTick(_beat.name if _beat is not None else worker_id())
    _tick.start()


@signals.worker_init.connect(weak=False)
def _name_worker(**kwargs: Any) -> None:
    """Name the worker before its pool starts: every pool process, replacements forked later
    included, inherits the name, and its claims carry it (``queuety.runtime.claim``)."""
    name_worker(timezone.now())


@signals.worker_init.connect(weak=False)
def _start_lane(sender: Any = None, **kwargs: Any) -> None:
    """A worker on Celery's threads pool is an I/O lane worker (``queuety.runtime.lane``)."""
    pool = getattr(sender, "pool_cls", None)
    if not (isinstance(pool, type) and issubclass(pool, ThreadsPool)) and pool != "threads":
        return
    try:
        lane.start(int(getattr(sender, "concurrency", 0) or 0))
    except Exception as error:  # noqa: BLE001 - Celery logs and ignores a handler's errors
        # SystemExit passes through Celery's signal dispatch: the worker does not start.
        raise SystemExit(f"queuety: {error}") from error


@signals.worker_shutdown.connect(weak=False)
def _stop_beating(**kwargs: Any) -> None:
    if _tick is not None:
        _tick.stop()
    if _beat is not None:
        _beat.stop()


class StepRequest(Request):
    """Runs in the worker's MAIN process: records a pool process's death at once.

    Without it the sweeper would notice only when the step's heartbeat goes stale.
    """

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft:
            # Said first, so that the ERROR lines Celery logs next read as what they are.
            logger.warning("Step run id=%s ignored its timeout; pool process %s is being "
                           "killed at the hard time limit (%.1f s) and replaced. The attempt "
                           "is recorded as StepTimeout; Celery's 'Hard time limit exceeded' "
                           "and WorkerLostError lines that follow are this, not a crash.",
                           self.args[0] if self.args else "?", self.worker_pid, timeout)
        super().on_timeout(soft, timeout)
        if not soft:  # the hard limit: the pool process running the step is being killed
            self._recover(hard_timeout=True)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> None:
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        error = exc_info.exception
        if isinstance(error, ExceptionWithTraceback):  # billiard wraps what the pool reports
            error = error.exc
        if isinstance(error, WorkerLostError):
            self._recover(hard_timeout=False)

    def _recover(self, hard_timeout: bool) -> None:
        if self.worker_pid and self.args:
            # celery-types say worker_pid is a str; the pools report the int pid.
            recovery.record_death(self.args[0], self.worker_pid,  # type: ignore[arg-type]
                                  hard_timeout=hard_timeout)


# celery-types' bind=True overloads of shared_task take only the options they list, though
# Celery sets any keyword (here Request) on the task class: to mypy the task is untyped.
@shared_task(  # type: ignore[call-overload, untyped-decorator]
    name="queuety.execute_step", acks_late=True, reject_on_worker_lost=True,
    ignore_result=True, Request=StepRequest, bind=True)
def execute_step(self: Task[[int], None], step_run_id: int) -> None:
    """Run one attempt of step row ``step_run_id``; duplicates are dropped by the claim."""
    started = time.monotonic()
    hard, soft = self.request.timelimit or (None, None)
    # Celery's limits cover the whole task. A soft limit would interrupt whichever step runs:
    # such a task runs its own step only. The hard limit of a timed step's message is where
    # this process is killed: the timed steps after it may run inline while it serves as
    # their hard limit too (queuety.core.inline). The site-wide hard limit
    # (CELERY_TASK_TIME_LIMIT, which Celery copies into every message) is a safety net for
    # untimed steps: inline steps start within INLINE_SECONDS of the task, so each still gets
    # that limit less at most INLINE_SECONDS.
    own_hard = hard if hard and hard != self.app.conf.task_time_limit else None
    # The queue the message came from (its routing key: Celery routes a queue's messages by
    # its name), so that a paused queue's step is held, not started (queuety.queues).
    queue = (self.request.delivery_info or {}).get("routing_key") or ""
    report = attempt.execute_step(step_run_id, inline=not soft, queue=queue,
                                  killed_at=None if own_hard is None else started + own_hard)
    if report.leftover_threads:
        # Threads cannot be killed; the process can. The pool replaces it, and the attempt,
        # already recorded as timed out, can leave nothing running behind it.
        logger.warning("Step run id=%s timed out leaving threads %s running; exiting pool "
                       "process %s so they stop (the timeout is recorded; the WorkerLostError "
                       "Celery logs next is this exit, not a crash).", step_run_id,
                       ", ".join(report.leftover_threads), os.getpid())
        os._exit(70)


@shared_task(name="queuety.sweep", ignore_result=True)
def sweep() -> dict[str, int] | None:
    """Sweep, if it is this interval's turn (every worker sweeps by itself: this message, from
    an optional beat entry, takes the same turns); None when another process swept."""
    return sweep_tick.sweep_once(f"{worker_id()} (queuety.sweep)")


@shared_task(name="queuety.bulk_operation", ignore_result=True)
def bulk_operation(op_id: int) -> str:
    """Process one bulk operation under its lease until it is done (``queuety.bulk_actions``;
    the sweeper sends this again when its worker dies)."""
    return bulk_actions.process(op_id)


@shared_task(name="queuety.resume_parent", ignore_result=True)
def resume_parent(run_id: int) -> None:
    """Move a run on once a run it waits for (its child, or one it awaits) finished; the
    sweeper is the backstop."""
    settle.resume_waiting(run_id)


@shared_task(name="queuety.deliver_webhook", ignore_result=True)
def deliver_webhook(delivery_id: int) -> None:
    """Send one webhook delivery row (retries are scheduled by the row; the sweeper is the
    backstop for a lost message)."""
    delivery.deliver(delivery_id)


#: Pauses (s) before a fire that met a transient database error is tried again (68 s in all:
#: a PostgreSQL restart or failover), each try for the same tick.
FIRE_RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0)


@shared_task(name="queuety.fire_schedule", ignore_result=True, bind=True)
def fire_schedule(self: Task[..., None], /, schedule: str, after: int | None = None,
                  fired_for: float | None = None, **row_kwargs: Any) -> None:
    """Fire schedule ``schedule`` (sent by beat; ``row_kwargs`` are the rest of its row's
    kwargs, which ``fire`` reads from the row itself) for the tick it was sent at. A buffered
    fire comes back every ``SWEEP_INTERVAL`` until the run it waits for has finished.

    A fire that meets a transient database error (PostgreSQL restarting) is sent again after
    the next of ``FIRE_RETRY_DELAYS``, with ``fired_for`` (epoch seconds) keeping the moment
    of the first try: its tick's run is started once the database is back, never lost with
    the message, never started twice (the tick's idempotency key)."""
    moment = schedules.moment_of(fired_for) or schedules.sent_at(self.request) or \
        timezone.now()
    try:
        schedules.fire_and_follow(schedule, after=after, now=moment)
    except DatabaseError as error:
        tries = self.request.retries
        if not rows.is_transient(error) or tries >= len(FIRE_RETRY_DELAYS):
            raise
        logger.warning("Schedule %r could not fire for %s: the database refused it (%s); "
                       "trying again in %gs (try %d of %d).", schedule, moment.isoformat(),
                       type(error.__cause__ or error).__name__, FIRE_RETRY_DELAYS[tries],
                       tries + 1, len(FIRE_RETRY_DELAYS))
        raise self.retry(kwargs={**row_kwargs, "schedule": schedule, "after": after,
                                 "fired_for": moment.timestamp()},
                         countdown=FIRE_RETRY_DELAYS[tries], max_retries=len(FIRE_RETRY_DELAYS),
                         exc=error) from None


@shared_task(name="queuety.wake_group", ignore_result=True)
def wake_group(group: str, wait: bool = True, retry: int = 0) -> int:
    """Start concurrency group ``group``'s throttled steps into its free slots, those in a
    queue's line through that line (sent when a rate limit's window reopens, or, without
    ``wait``, when a queue's waker found the group busy; the sweeper is the backstop)."""
    return wakeups.wake_group(group, busy_retry=not wait, retry=retry)
