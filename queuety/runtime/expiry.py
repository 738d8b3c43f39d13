"""Waits that time out: settling a parked wait by its timeout, exactly once.

A wait declared with ``timeout=`` parks its run with ``wait_expires_at`` set (by
:func:`queuety.runtime.landing.land`). The sweeper's ``expired`` phase finds runs past it in
the database (so the timeout survives restarts: nothing is held in a broker or a process) and
calls :func:`expire_wait` for each. Replies and signals (``queuety.inbox``) and this module
both decide under the run's row lock (``store.rows.lock_run``) and re-check the run's status,
step and expiry there, so a reply racing a timeout settles the wait once: whichever takes the
lock first wins, and a reply that finds the wait expired settles it by timeout itself and is
refused with :class:`~queuety.exceptions.WaitExpired`.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from queuety import exceptions
from queuety.core import flow, waits
from queuety.core.definition import (
    StepSpec,
    WaitStep,
    WaitWorkflowsStep,
    WorkflowSpec,
    timing_of,
)
from queuety.core.transition import transition
from queuety.models import Event, RunStatus, WorkflowDependency, WorkflowRun
from queuety.runtime import settle
from queuety.runtime.finish import fail_at_wait
from queuety.runtime.landing import land
from queuety.store import rows
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")

#: The run columns a timeout reads under the lock.
EXPIRY_FIELDS = rows.RUN_VIEW_FIELDS
#: The statuses of a run parked at a wait that may time out: on signals, or on other runs.
TIMED_STATUSES = (RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS)


def is_expired(run: WorkflowRun, now: datetime) -> bool:
    """True if ``run`` (read with :data:`EXPIRY_FIELDS`) is parked at a wait whose timeout
    has passed."""
    return (run.status in TIMED_STATUSES and run.wait_expires_at is not None
            and run.wait_expires_at <= now)


def expire_wait(run_id: int, now: datetime) -> bool:
    """Settle run ``run_id``'s wait by its timeout if it is still parked there and expired;
    return whether it did. Its own transaction, with the run's row locked."""
    with transaction.atomic():
        run = rows.lock_run(run_id, fields=EXPIRY_FIELDS)
        if not is_expired(run, now):
            return False  # answered, cancelled or moved meanwhile: the reply won
        if run.status == RunStatus.WAITING_FOR_WORKFLOWS:
            # The awaited runs may all have finished before the deadline, their wake-up of
            # this run not yet done (it is sent on their commit, or by a sweep): they win.
            if settle.resume_waiting(run_id) != RunStatus.WAITING_FOR_WORKFLOWS:
                return False
            run = rows.lock_run(run_id, fields=EXPIRY_FIELDS)
            if not is_expired(run, now):
                return False
        settle_by_timeout(load_spec(run.definition_id), run, now)
        return True


def settle_by_timeout(spec: WorkflowSpec, run: WorkflowRun, now: datetime) -> str:
    """Apply the ``on_timeout`` of the wait ``run`` is parked at (its row locked by this
    transaction, read with :data:`EXPIRY_FIELDS`); return the run's status afterwards.

    ``fail`` fails the run with :class:`WaitExpired`; ``continue`` and a step name settle the
    wait as a transition that merges :func:`queuety.core.waits.timeout_output` (and consumes
    no signal), then move to the next step or the named one. A ``wait_timed_out`` event
    records it either way. A workflow wait's awaited runs are left alone: they keep running
    (its dependency rows go, so their end no longer wakes this run).
    """
    index = run.current_step
    step = spec.steps[index]
    wait = timing_of(step)
    assert wait is not None and wait.timeout is not None, f"step {step.name!r} has no timeout"
    if isinstance(step, WaitWorkflowsStep):
        WorkflowDependency.objects.filter(run_id=run.pk).delete()
    expired_at = run.wait_expires_at
    details = {"expires_at": None if expired_at is None else expired_at.isoformat(),
               "timeout_seconds": wait.timeout, "on_timeout": wait.on_timeout}
    view = rows.run_view(run, now)
    usage = view.usage
    if wait.on_timeout == waits.ON_TIMEOUT_FAIL:
        missing = "no reply came" if isinstance(step, WaitStep) \
            else "the runs it waits for did not finish"
        error = exceptions.WaitExpired(
            run.pk, f"Wait {step.name!r} of run {run.pk} timed out: {missing} within "
                    f"{wait.timeout:g}s (it expired at {details['expires_at']}), and its "
                    "on_timeout is 'fail'.")
        event = Event(run_id=run.pk, kind="wait_timed_out", step_index=index,
                      step_name=step.name, data={**details, "output": {}})
        logger.info("Wait %r of run id=%s timed out; the run fails", step.name, run.pk)
        return fail_at_wait(spec, run.pk, index, run.state, usage, now, [event],
                            flow.failure_record(error, step=step.name, step_index=index,
                                                attempt=None, max_attempts=None, **details))
    output = _timeout_output(step)
    target = spec.next_index(index) if wait.timeout_target is None \
        else spec.index_of(wait.timeout_target)
    # Only the output's public keys are merged and counted, as when a signal settles the
    # wait: a "_" result key is never stored, so it does not count against max_state_bytes.
    moved = transition(spec, run.pk, view.state, view.writes, usage, output)
    event = Event(run_id=run.pk, kind="wait_timed_out", step_index=index, step_name=step.name,
                  data={**details, "output": output, **moved.event_data})
    if moved.breach is not None:
        return fail_at_wait(spec, run.pk, index, run.state, usage, now, [event],
                            flow.failure_record(moved.breach, step=step.name, step_index=index,
                                                attempt=None, max_attempts=None))
    logger.info("Wait %r of run id=%s timed out; on_timeout=%r", step.name, run.pk,
                wait.on_timeout)
    try:
        with transaction.atomic():  # a savepoint: what land() wrote before refusing goes
            return land(spec, view.after(moved), target, [event])
    except (exceptions.BudgetExceeded, exceptions.WorkflowDefinitionError) as refused:
        # The step after the timeout cannot be entered (a for_each whose items the timeout
        # left missing, a budget a start step would pass): the run fails at the wait, once,
        # instead of the sweeper trying it again every sweep.
        return fail_at_wait(spec, run.pk, index, run.state, usage, now, [event],
                            flow.failure_record(refused, step=step.name, step_index=index,
                                                attempt=None, max_attempts=None))


def _timeout_output(step: StepSpec) -> dict[str, Any]:
    """What a wait settled by its timeout merges: a signal wait's
    :func:`~queuety.core.waits.timeout_output`; for a workflow wait, its ``result_key`` set to
    ``None`` (nothing without one)."""
    if isinstance(step, WaitStep):
        return waits.timeout_output(step.wait)
    result_key = step.workflows.result_key if step.workflows is not None else None
    return {} if result_key is None else {result_key: None}


def expire_due(now: datetime, limit: int = 100) -> int:
    """The sweeper's phase: settle up to ``limit`` expired waits, oldest first; return how
    many. One bad run never stops the others (it is logged and tried again next sweep)."""
    due = list(WorkflowRun.objects.filter(
        status__in=TIMED_STATUSES, wait_expires_at__lte=now,
    ).order_by("wait_expires_at").values_list("pk", flat=True)[:limit])
    settled = 0
    for run_id in due:
        try:
            settled += expire_wait(run_id, now)
        except Exception:  # noqa: BLE001 - the next sweep tries it again
            logger.exception("Settling the expired wait of run id=%s failed", run_id)
    return settled
