"""Operating runs: cancel, pause, resume, retry, rewind and fork.

Each operation is one transaction with the run row locked, refuses a transition its status does
not allow with :class:`~queuety.exceptions.InvalidTransition`, and never creates a second live
row for a step (the original's resume could). Compensations and hooks are ``queuety.cleanup``'s;
deadlines and purges are the sweeper's (``queuety.runtime.sweeper``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from django.db import OperationalError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from queuety import exceptions, publish, signals, timeline
from queuety.cleanup import start_cleanup
from queuety.core import flow, landing
from queuety.core.definition import WorkflowSpec
from queuety.core.status import FINISHED, LIVE_OR_HELD
from queuety.models import Event, RunStatus, StepRun, StepStatus, WorkflowRun
from queuety.runtime.finish import notify_finished
from queuety.runtime.landing import land, release_held
from queuety.store import rows
from queuety.store.definitions import effective_policy, load_spec

logger = logging.getLogger("queuety")

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _refuse(run: WorkflowRun, action: str, why: str) -> exceptions.InvalidTransition:
    return exceptions.InvalidTransition(run.pk, f"Cannot {action} workflow run {run.pk}: {why}.")


def _event(run: WorkflowRun, kind: str, actor: str, **data: Any) -> Event:
    return Event.objects.create(run_id=run.pk, kind=kind, data={"by": actor, **data})


def _retry_deadlocks(operation: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``operation`` again (up to 3 times) when PostgreSQL aborts it to break a deadlock.

    A cancel locks a tree of runs parent first, while a woken waiter locks itself and then
    reads the runs it waits for: when they cross, PostgreSQL aborts one. Only the outermost
    call retries: inside a transaction the error must reach whoever owns it.
    """
    @functools.wraps(operation)
    def retrying(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        for attempt in range(3):
            try:
                return operation(*args, **kwargs)
            except OperationalError as error:
                deadlock = rows.sqlstate_of(error) == "40P01"
                if not deadlock or attempt == 2 or connection.in_atomic_block:
                    raise
                logger.warning("%s(%r) hit a deadlock; running it again.",
                               operation.__name__, args)
        raise AssertionError("unreachable")  # pragma: no cover
    return retrying


@_retry_deadlocks
def cancel(run_id: int, *, actor: str = "") -> None:
    """Cancel a run: stop its steps, then run compensations and ``on_cancel`` (durably).

    Raises:
        InvalidTransition: the run is already completed or cancelled.
    """
    now = timezone.now()
    with transaction.atomic():
        run = rows.lock_run(run_id, steps_first=True)
        if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
            raise _refuse(run, "cancel", f"it is already {run.status}")
        spec = load_spec(run.definition_id)
        previous = run.status
        rows.stop_live_steps(run.pk, now)
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.CANCELLED, finished_at=now, updated_at=now,
            revision=F("revision") + 1, migration=None, remind_at=None)
        _event(run, "workflow_cancelled", actor, previous_status=previous)
        signals.emit("run_cancelled", run_id=run.pk, workflow=run.name, actor=actor,
                     previous_status=previous)
        if not (run.cleanup and run.cleanup.get("cause") == "failure"):
            start_cleanup(run, spec, "cancel", now)
        # Children, and runs it started, go with their parent (parent row locked before the
        # child's, as always).
        for child in WorkflowRun.objects.filter(Q(parent_id=run.pk) | Q(started_by_id=run.pk)
                                                ).exclude(status__in=FINISHED
                                                          ).values_list("pk", flat=True):
            cancel(child, actor=f"parent run {run.pk}")
        notify_finished(run.pk)
    logger.info("Run id=%s cancelled by %s", run_id, actor or "-")


#: The statuses a run can be paused from: a run waiting for other workflows holds nothing to
#: pause (they are paused, or cancelled, on their own).
PAUSABLE = (RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL)


def pause(run_id: int, *, actor: str = "", reason: Mapping[str, Any] | None = None) -> None:
    """Pause a running or waiting run: a step in flight finishes, nothing new starts.

    ``reason`` is recorded on its ``workflow_paused`` event besides ``by`` and
    ``previous_status`` (``{"definition": hash}`` when its whole definition is paused).

    Raises:
        InvalidTransition: the run is not running or waiting.
    """
    with transaction.atomic():
        run = rows.lock_run(run_id)
        if run.status not in PAUSABLE:
            raise _refuse(run, "pause", f"it is {run.status}, not running or waiting")
        pause_locked([(run.pk, run.status)], actor=actor, reason=reason)


def pause_locked(runs: Sequence[tuple[int, str]], *, actor: str = "",
                 reason: Mapping[str, Any] | None = None) -> None:
    """Pause ``runs``, ``(id, status)`` pairs of runs whose rows this transaction holds locked
    in a :data:`PAUSABLE` status: one UPDATE and one INSERT of their ``workflow_paused`` events
    for them all, what :func:`pause` writes for one."""
    if not runs:
        return
    WorkflowRun.objects.filter(pk__in=[pk for pk, _ in runs]).update(
        status=RunStatus.PAUSED, updated_at=timezone.now(), revision=F("revision") + 1)
    Event.objects.bulk_create([
        Event(run_id=pk, kind="workflow_paused",
              data={"by": actor, "previous_status": status, **(reason or {})})
        for pk, status in runs])


def resume(run_id: int, *, actor: str = "", reason: Mapping[str, Any] | None = None) -> str:
    """Resume a paused run where it stands; return its new status.

    Its current step's existing row is published again (never duplicated); a wait is evaluated
    against the signals stored meanwhile, so it may settle at once. ``reason`` is recorded on
    its ``workflow_resumed`` event besides ``by``.

    Raises:
        InvalidTransition: the run is not paused.
    """
    now = timezone.now()
    with transaction.atomic():
        run = rows.lock_run(run_id)
        if run.status != RunStatus.PAUSED:
            raise _refuse(run, "resume", f"it is {run.status}, not paused")
        spec = load_spec(run.definition_id)
        _event(run, "workflow_resumed", actor, **(reason or {}))
        return _continue(run, spec, now)


def _continue(run: WorkflowRun, spec: WorkflowSpec, now: datetime, paused: bool = False) -> str:
    """Put a (locked) run back to work at its current step; return its status.

    With ``paused`` it only gets ready: its next row is created unpublished, for ``resume()``.
    """
    mode = landing.Mode.HOLD if paused else landing.Mode.MOVE
    if run.current_step >= len(spec.steps):
        # Rewound to its last step, or forked from a completed run: landing past the last step
        # completes it as a step's outcome does (its event, its waiters, ``run_completed``).
        return land(spec, rows.run_view(run, now), None, [], mode)
    step = spec.steps[run.current_step]
    live = list(StepRun.objects.filter(run_id=run.pk, kind="step",
                                       status__in=LIVE_OR_HELD)
                .values_list("pk", "status", "seq", "timeout"))
    if step.kind in ("task", "delay", "parallel", "for_each") and live:
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.RUNNING, updated_at=now, revision=F("revision") + 1)
        pending = [(pk, timeout) for pk, status, _, timeout in live
                   if status == StepStatus.PENDING]
        if pending:
            StepRun.objects.filter(pk__in=[pk for pk, _ in pending]).update(
                available_at=now, published_at=now)
            publish.publish_on_commit([publish.step_message(spec, pk, run.current_step,
                                                            timeout)
                                       for pk, timeout in pending])
        if step.fanout is not None:  # slots freed while paused go to held rows now
            release_held(spec, run.pk, live[0][2], run.current_step, now)
        return RunStatus.RUNNING
    return land(spec, rows.run_view(run, now), run.current_step, [], mode)


def retry(run_id: int, *, actor: str = "", from_step: str | int | None = None) -> None:
    """Run a failed run again from its failed step, keeping what earlier steps merged.

    The failed step gets a fresh attempt budget on its own row (no new row). Budgets are not
    reset: a run failed by a budget fails again unless the budget was the problem's cause. A
    run failed by its deadline gets a fresh deadline window.

    With ``from_step`` (a step's name or index, at or before the failed step), the run goes
    back to that step and runs it and every later step again: its state is the one the step's
    latest visit started from (however the run got there: the next step, a route, a jump or
    a loop; with the edits made while the run stood there), so what it and the later steps
    merged is discarded, and loops that start after it are entered afresh. ``from_step``
    naming the failed step is a plain retry.

    Raises:
        InvalidTransition: the run is not failed, or its compensations already ran.
            With ``from_step``: the step comes after the failed step, or no visit of it
            completed (a route or jump skipped it).
        UnknownStep: ``from_step`` names no step of the run's definition.
    """
    now = timezone.now()
    with transaction.atomic():
        run = rows.lock_run(run_id, steps_first=from_step is not None)
        if run.status != RunStatus.FAILED:
            raise _refuse(run, "retry", f"it is {run.status}, not failed")
        if run.cleanup:
            raise _refuse(run, "retry", "its compensations already ran")
        spec = load_spec(run.definition_id)
        if from_step is not None:
            index = _step_index(spec, from_step)
            if index > run.current_step:
                raise exceptions.InvalidTransition(
                    run.pk, f"Cannot retry workflow run {run.pk} from step "
                    f"{spec.steps[index].name!r}: it comes after the failed step "
                    f"{spec.steps[run.current_step].name!r}, so it never ran.")
            if index < run.current_step:
                _retry_from(run, spec, index, actor, now)
                return
        # The row of this visit of the step: failed, or cancelled when a deadline struck.
        latest = (StepRun.objects.filter(run_id=run.pk, kind="step", seq=run.transitions,
                                         step_index=run.current_step)
                  .exclude(status=StepStatus.COMPLETED).order_by("-pk").first())
        _event(run, "workflow_retried", actor, error=run.error)
        deadline = run.deadline_at
        if deadline is not None and deadline <= now and spec.deadline_seconds:
            deadline = now + timedelta(seconds=spec.deadline_seconds)
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.PAUSED, error=None, finished_at=None, updated_at=now,
            deadline_at=deadline, revision=F("revision") + 1,
            # A timed wait retried waits its whole timeout again, and reminds afresh.
            wait_expires_at=None, remind_at=None, waiting_since=None, reminders=0)
        kind = spec.steps[run.current_step].kind
        if kind in ("parallel", "for_each"):
            # Only the branches or items that did not succeed run again.
            redo = list(StepRun.objects.filter(run_id=run.pk, kind="step", seq=run.transitions,
                                               step_index=run.current_step)
                        .exclude(status=StepStatus.COMPLETED))
        else:
            redo = [latest] if latest is not None and kind in ("task", "delay") else []
        fanout = spec.steps[run.current_step].fanout
        limit = len(redo) if fanout is None or fanout.max_concurrency is None \
            else fanout.max_concurrency
        for position, row in enumerate(sorted(redo, key=lambda r: r.branch)):
            # A fresh budget: attempts count on from the row's current number, so an old,
            # abandoned attempt can never match the new one's guard. Beyond the fan-out's
            # max_concurrency, rows wait held for a free slot.
            StepRun.objects.filter(pk=row.pk).update(
                status=StepStatus.PENDING if position < limit else StepStatus.HELD,
                error=None, finished_at=None, claimed_at=None,
                heartbeat_at=None, available_at=now, published_at=now,
                max_attempts=row.attempt
                + effective_policy(spec, run.current_step, row.branch).max_attempts)
        run.refresh_from_db()
        _continue(run, spec, now)


def _step_index(spec: WorkflowSpec, step: str | int) -> int:
    if isinstance(step, int):
        if not 0 <= step < len(spec.steps):
            raise exceptions.UnknownStep(
                f"Workflow {spec.name!r} has no step at index {step}; its steps are 0 to "
                f"{len(spec.steps) - 1}.", str(step))
        return step
    return spec.index_of(step)


def _retry_from(run: WorkflowRun, spec: WorkflowSpec, index: int, actor: str,
                now: datetime) -> None:
    """Put locked failed ``run`` back on step ``index`` (before its failed step) with the
    state that step's latest visit started from; its row is a new visit (``transitions + 1``).
    """
    name = spec.steps[index].name
    try:
        state = timeline.state_before(run.pk, index)
    except LookupError as error:
        raise exceptions.InvalidTransition(
            run.pk, f"Cannot retry workflow run {run.pk} from step {name!r}: {error}. Retry "
            "from a step that ran, or without from_step.") from None
    rows.stop_live_steps(run.pk, now)
    Event.objects.create(run_id=run.pk, kind="workflow_retried", step_index=index,
                         step_name=name, data={
                             "by": actor, "error": run.error, "from_step": name,
                             "failed_step": spec.steps[run.current_step].name, "state": state})
    deadline = run.deadline_at
    if deadline is not None and deadline <= now and spec.deadline_seconds:
        deadline = now + timedelta(seconds=spec.deadline_seconds)
    WorkflowRun.objects.filter(pk=run.pk).update(
        state=state, current_step=index, status=RunStatus.PAUSED, error=None,
        finished_at=None, transitions=F("transitions") + 1, updated_at=now,
        deadline_at=deadline, wait_expires_at=None, remind_at=None, waiting_since=None,
        reminders=0, revision=F("revision") + 1,
        loops=flow.loops_from(spec, index, run.loops or {}),
        state_writes={key: at for key, at in (run.state_writes or {}).items() if key in state})
    run.refresh_from_db()
    _continue(run, spec, now)  # lands on step ``index``: a new row for it, as a rewind's


def rewind(run_id: int, step: int | str, *, actor: str = "") -> None:
    """Go back to just after step ``step`` completed: its recorded state, the next step next.

    Raises:
        InvalidTransition: the run is cancelled.
        LookupError: the step never completed in this run.
    """
    now = timezone.now()
    with transaction.atomic():
        run = rows.lock_run(run_id, steps_first=True)
        if run.status == RunStatus.CANCELLED:
            raise _refuse(run, "rewind", "it is cancelled")
        if run.cleanup:
            raise _refuse(run, "rewind", "its compensations already ran")
        spec = load_spec(run.definition_id)
        index = step if isinstance(step, int) else spec.index_of(step)
        state = timeline.state_at(run.pk, index)
        was_paused = run.status == RunStatus.PAUSED
        rows.stop_live_steps(run.pk, now)
        target = index + 1
        Event.objects.create(run_id=run.pk, kind="workflow_rewound", step_index=index,
                             step_name=spec.steps[index].name,
                             data={"by": actor, "state": state, "to_step": target})
        WorkflowRun.objects.filter(pk=run.pk).update(
            state=state, current_step=target, status=RunStatus.PAUSED, error=None,
            finished_at=None, transitions=F("transitions") + 1, updated_at=now,
            wait_expires_at=None, remind_at=None, waiting_since=None, reminders=0,
            revision=F("revision") + 1)
        run.refresh_from_db()
        _continue(run, spec, now, paused=was_paused)


def fork(run_id: int, *, actor: str = "") -> int:
    """Start a new run of the same definition from this run's current state and step (and
    with its tags)."""
    now = timezone.now()
    with transaction.atomic():
        source = rows.lock_run(run_id)
        spec = load_spec(source.definition_id)
        run = WorkflowRun.objects.create(
            definition_id=source.definition_id, name=source.name, state=source.state,
            total_steps=source.total_steps, current_step=source.current_step,
            status=RunStatus.PAUSED, transitions=source.transitions,
            cost_units=source.cost_units, started_workflows=source.started_workflows,
            groups=source.groups, state_writes=source.state_writes,
            deadline_at=source.deadline_at, tags=source.tags)
        Event.objects.create(run_id=run.pk, kind="workflow_forked",
                             data={"by": actor, "from_run": source.pk, "state": source.state})
        _event(source, "workflow_forked_to", actor, to_run=run.pk)
        _continue(run, spec, now)
    return run.pk
