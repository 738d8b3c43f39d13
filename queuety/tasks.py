"""Celery tasks: thin wrappers over ``queuety.runtime``. Names are stable message contracts
(``queuety.publish`` sends them by name)."""

from __future__ import annotations

import logging
import os

from billiard.exceptions import WorkerLostError
from celery import shared_task, signals
from celery.worker.request import Request
from django.db import close_old_connections

from queuety.runtime import attempt, recovery, settle, sweeper
from queuety.runtime.claim import worker_id

logger = logging.getLogger("queuety")

# Like a request cycle: drop connections that broke or outlived CONN_MAX_AGE, keep the rest
# (a site that sets CELERY_DB_REUSE_MAX keeps them across tasks).
signals.task_prerun.connect(lambda **kwargs: close_old_connections(), weak=False)
signals.task_postrun.connect(lambda **kwargs: close_old_connections(), weak=False)


class StepRequest(Request):
    """Runs in the worker's MAIN process: records a pool process's death at once.

    Without it the sweeper would notice only when the step's heartbeat goes stale.
    """

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:  # the hard limit: the pool process running the step is being killed
            self._recover(hard_timeout=True)

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False) -> None:
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        if isinstance(exc_info.exception, WorkerLostError):
            self._recover(hard_timeout=False)

    def _recover(self, hard_timeout: bool) -> None:
        if not self.worker_pid or not self.args:
            return
        try:
            recovery.recover_attempt(self.args[0], worker_id(self.worker_pid),
                                     hard_timeout=hard_timeout)
        except Exception:  # noqa: BLE001 - the sweeper recovers the step later anyway
            logger.exception("Could not record the loss of step run id=%s", self.args[0])


@shared_task(name="queuety.execute_step", acks_late=True, reject_on_worker_lost=True,
             ignore_result=True, Request=StepRequest, bind=True)
def execute_step(self, step_run_id: int) -> None:
    """Run one attempt of step row ``step_run_id``; duplicates are dropped by the claim."""
    report = attempt.execute_step(step_run_id, inline=not _time_limited(self))
    if report.leftover_threads:
        # Threads cannot be killed; the process can. The pool replaces it, and the attempt,
        # already recorded as timed out, can leave nothing running behind it.
        logger.warning("Step run id=%s timed out leaving threads %s running; exiting pool "
                       "process %s so they stop.", step_run_id,
                       ", ".join(report.leftover_threads), os.getpid())
        os._exit(70)


def _time_limited(task) -> bool:
    # Celery's time limits cover the whole task: the tight limit a timed step's message
    # carries would also cut short the untimed steps run inline after it, so such a task runs
    # its own step only, as does one under a soft limit (it would interrupt whichever step
    # runs). The site-wide hard limit (CELERY_TASK_TIME_LIMIT, which Celery copies into every
    # message) is a safety net for untimed steps: inline steps start within INLINE_SECONDS of
    # the task, so each still gets that limit less at most INLINE_SECONDS.
    hard, soft = task.request.timelimit or (None, None)
    return bool(soft) or bool(hard and hard != task.app.conf.task_time_limit)


@shared_task(name="queuety.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    """Recover lost attempts and re-publish due steps (scheduled by django-celery-beat)."""
    return sweeper.sweep()


@shared_task(name="queuety.resume_parent", ignore_result=True)
def resume_parent(run_id: int) -> None:
    """Move a run on once a run it waits for (its child, or one it awaits) finished; the
    sweeper is the backstop."""
    settle.resume_waiting(run_id)
