"""How a run ends badly, and what its end wakes.

:func:`fail_run` is the one way to fail a run: the row, the dependency rows, the timeline, the
runs waiting for it, and its compensations. Every path that fails a run (a step out of
attempts, a wait that can no longer be satisfied, a budget breached while settling, a
definition that no longer loads, a missed deadline) goes through it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from queuety import cleanup, exceptions, publish, signals
from queuety.core import budget as budgets
from queuety.core import engine, flow
from queuety.core.definition import WorkflowSpec
from queuety.core.status import UNFINISHED
from queuety.models import Event, RunStatus, StepRun, StepStatus, WorkflowDependency, WorkflowRun
from queuety.store import keys, rows
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")

#: The runs a step attempt's final failure fails: one whose steps are being worked on.
STEP_FAILS = (RunStatus.RUNNING, RunStatus.PAUSED)


def notify_finished(run_id: int) -> None:
    """Once this transaction commits, wake the runs that wait for finished run ``run_id``:
    its parent (a ``run_workflow`` step) and the runs whose ``wait_for_workflows`` lists it.

    Every path that finishes a run comes here (the one-statement completion does for a run
    marked ``awaited``, which every keyed run is), so this is also where the run queued behind
    a keyed run (``singleton=True, on_conflict="queue"``) is released: its held first step
    becomes due and its message is published on commit.
    """
    waiters, keyed = rows.waiters_of(run_id)
    publish.wake(waiters)
    queued = None if keyed is None else keys.next_queued(*keyed)
    if queued is not None:
        release_queued(*queued)


def release_stranded(now: datetime) -> int:
    """The sweeper's phase for queued keyed runs whose live run finished without releasing
    them (its process died between the two): release each; return how many."""
    released = 0
    for run_id, step_run_id, definition_pk in keys.stranded_queued():
        with transaction.atomic():
            released += release_queued(run_id, step_run_id, definition_pk)
    return released


def release_queued(run_id: int, step_run_id: int, definition_pk: int) -> bool:
    """Start queued run ``run_id``: its held first step row ``step_run_id`` becomes due now
    and is published when this transaction commits (the gate is met at the claim, as for a
    delayed first step); False if another finish or sweep released it first."""
    if keys.release_first_step(step_run_id, timezone.now()):
        publish.publish_on_commit([publish.message_for(load_spec(definition_pk), step_run_id,
                                                       0)])
        Event.objects.create(run_id=run_id, kind="keyed_run_released", data={})
        logger.info("Queued run id=%s released: the live run of its key finished.", run_id)
        return True
    return False


def fail_run(spec: WorkflowSpec | None, run_id: int, error: dict[str, Any], now: datetime, *,
             events: Sequence[Event] = (), announce: Event | None = None,
             changes: dict[str, Any] | None = None, cause: str = "failure",
             statuses: Sequence[str] = UNFINISHED) -> bool:
    """Fail run ``run_id`` with ``error`` (in the caller's transaction); False if it had
    already finished.

    Writes ``events`` and then ``announce`` (by default a ``workflow_failed`` event carrying
    the error), drops the run's workflow-wait dependencies, wakes the runs waiting for it and
    starts its compensations and hooks for ``cause`` (``failure`` or ``deadline``) when the
    definition asks for them. ``changes`` are further columns to write with the status (the
    state and counters a run failed at a wait keeps). Without ``spec`` (a definition that no
    longer loads), nothing can be compensated. Only a run in one of ``statuses`` is failed: a
    step's final failure fails a running or paused run (:data:`STEP_FAILS`), never one parked
    at a wait.
    """
    # A move onto another definition still pending (migrate_runs()) goes with the failure:
    # a retry runs the step again on the definition the run has.
    failed = WorkflowRun.objects.filter(pk=run_id, status__in=statuses).update(
        status=RunStatus.FAILED, error=error, finished_at=now, updated_at=now,
        revision=F("revision") + 1, migration=None, remind_at=None,
        **(changes or {}))
    if not failed:
        Event.objects.bulk_create(events)
        return False
    WorkflowDependency.objects.filter(run_id=run_id).delete()
    if announce is None:
        announce = Event(run_id=run_id, kind="workflow_failed", data={"error": error})
    Event.objects.bulk_create([*events, announce])
    notify_finished(run_id)
    _emit_failed(spec, run_id, error)
    logger.warning("Run id=%s failed at step %r: %s", run_id, error.get("step"),
                   error.get("message"))
    if spec is not None and (cause != "failure" or spec.compensate_on_failure):
        cleanup.start_cleanup(WorkflowRun.objects.get(pk=run_id), spec, cause, now)
    return True


def _emit_failed(spec: WorkflowSpec | None, run_id: int, error: dict[str, Any]) -> None:
    """Send ``run_failed`` (and ``budget_exceeded`` for a budget breach) for run ``run_id``."""
    breach = "budget" in error
    # Without the definition the name is unknown: a job's run may then be wanted for its
    # job_buried, and the row names it.
    named = None if spec is None else spec.name
    if not (signals.wanted("run_failed", named) or
            (breach and signals.wanted("budget_exceeded"))):
        return
    # A definition that no longer loads leaves only the row to name the workflow.
    workflow = spec.name if spec is not None else WorkflowRun.objects.values_list(
        "name", flat=True).get(pk=run_id)
    signals.emit("run_failed", run_id=run_id, workflow=workflow, error=error)
    if breach:
        signals.emit("budget_exceeded", run_id=run_id, workflow=workflow,
                     budget=error.get("budget"), limit=error.get("limit"),
                     used=error.get("used"), step=error.get("step"))


def fail_at_wait(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                 usage: budgets.Usage, now: datetime, events: list[Event],
                 error: dict[str, Any]) -> str:
    """Fail a run (locked by this transaction) at the step ``index`` it waits at, writing
    ``state`` and ``usage`` as the caller decided (the state from before the wait settled);
    return its status."""
    step = spec.steps[index]
    fail_run(spec, run_id, error, now, events=events,
             announce=Event(run_id=run_id, kind="workflow_failed", step_index=index,
                            step_name=step.name, data={"error": error}),
             changes={"state": state, "transitions": usage.transitions,
                      "cost_units": usage.cost_units,
                      "started_workflows": usage.started_workflows, "current_step": index})
    return RunStatus.FAILED


def fail_unloadable(step_run_id: int, run_id: int, error: BaseException) -> None:
    """Fail a step (and, for a workflow step, its run) whose definition or handler this
    process cannot load: nothing else could ever finish it."""
    now = timezone.now()
    record = engine.describe_error(error)
    with transaction.atomic():
        row = rows.lock_live_step(step_run_id)
        if row is None:
            return
        StepRun.objects.filter(pk=row.pk).update(status=StepStatus.FAILED, finished_at=now,
                                                 error=record)
        failed_step = Event(run_id=run_id, step_run_id=row.pk, kind=f"{row.kind}_failed",
                            step_index=row.step_index, step_name=row.step_name,
                            attempt=row.attempt, data={"error": record})
        if row.kind != "step":
            failed_step.save()
        else:
            fail_run(None, run_id, flow.failure_record(
                error, step=row.step_name, step_index=row.step_index, attempt=row.attempt,
                max_attempts=row.max_attempts), now, events=[failed_step], statuses=STEP_FAILS)
    logger.error("Step run id=%s of run id=%s failed: %s", step_run_id, run_id, record["message"])


def check_attempts(run_id: int, step_name: str, last_error: BaseException | None = None
                   ) -> None:
    """Raise BudgetExceeded if one more step attempt in run ``run_id`` would pass the
    ``max_step_attempts`` of that run or of an ancestor (which counts its whole tree).

    Call it in the transaction that schedules the attempt: the count's lock holds until then.
    """
    current: int | None = run_id
    while current is not None:
        parent_id, definition_pk = WorkflowRun.objects.values_list(
            "parent_id", "definition_id").get(pk=current)
        holder = load_spec(definition_pk)
        limit = holder.budget.max_step_attempts
        if limit is not None:
            used = rows.tree_attempts(current)
            if used + 1 > limit:
                raise exceptions.BudgetExceeded(
                    "max_step_attempts", limit, used + 1, current, holder.name,
                    message=f"Step {step_name!r} of run {run_id} would start attempt "
                            f"{used + 1} of run {current}'s tree, over its max_step_attempts "
                            f"budget of {limit}." + (
                                "" if last_error is None else
                                f" Its last attempt failed with {type(last_error).__name__}: "
                                f"{last_error}"))
        current = parent_id
