"""Moving a run onto its next step, in the transaction that decided it: the applier.

:func:`land` asks the pure planner (:func:`queuety.core.landing.plan`) what the run does, with
the run row the caller locked (a :class:`~queuety.core.landing.RunView`) and this
transaction's :class:`_Database` for what only the database knows, then applies the plan: the
effects before the row (consumed signals, dependency rows, lifecycle signals), one update of
the run row, then what the step it landed on needs (a child run, fan-out rows, a delay or
task row and its message, or the completion's wake-ups), and the timeline in one insert.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F

from queuety import publish, signals, tracing
from queuety.conf import settings
from queuety.core import dependencies, engine, flow, landing
from queuety.core.definition import ChildStep, FanOutStep, ForEachStep, StartStep, WorkflowSpec
from queuety.core.landing import RunView
from queuety.models import (
    Event,
    RunStatus,
    Signal,
    StepRun,
    StepStatus,
    WorkflowDependency,
    WorkflowRun,
)
from queuety.runtime import gates, moves
from queuety.runtime.finish import fail_at_wait, notify_finished
from queuety.store import rows
from queuety.store.definitions import definition_id, effective_policy


def begin(spec: WorkflowSpec, run: WorkflowRun, state: dict[str, Any], now: datetime,
          extra: dict[str, Any], delay: float | None = None) -> None:
    """Start a just-created run on its first step (in the creating transaction).

    With ``delay``, a first task step becomes due that many seconds from ``now``.
    """
    started = Event(run=run, kind="workflow_started", data={
        "definition_hash": spec.definition_hash, "version": spec.version, "state": state,
        **extra})
    signals.emit("run_started", run_id=run.pk, workflow=spec.name, version=spec.version)
    if landing.lands_on_task(spec, 0):
        if delay:
            due = now + timedelta(seconds=delay)
            on_broker = delay <= settings.MAX_ETA
            step_run = rows.new_step_run(run.pk, spec, 0, seq=0, now=due, published=on_broker)
            started.save()
            if on_broker:
                publish.publish_on_commit([publish.message_for(spec, step_run.pk, 0, delay)])
            return
        step_run = rows.new_step_run(run.pk, spec, 0, seq=0, now=now)
        started.save()
        gates.publish_landed(spec, step_run.pk, 0, run.pk, state)
    else:
        land(spec, rows.run_view(run, now), 0, [started])


def create_run(spec: WorkflowSpec, state: dict[str, Any], now: datetime, extra: dict[str, Any],
               delay: float | None = None, **links: Any) -> int:
    """Create and start a run of ``spec`` linked to the run that makes it (same transaction)."""
    run = WorkflowRun.objects.create(
        definition_id=definition_id(spec), name=spec.name, state=state,
        total_steps=len(spec.steps), status=RunStatus.RUNNING,
        trace_context=tracing.current_context(),
        deadline_at=None if spec.deadline_seconds is None
        else now + timedelta(seconds=spec.deadline_seconds), **links)
    begin(spec, run, state, now, extra, delay)
    return run.pk


def start_child(spec: WorkflowSpec, parent_id: int, index: int, state: dict[str, Any],
                now: datetime, attempt: int = 1, delay: float | None = None) -> int:
    """Create and start the child run of step ``index`` (in the parent's transaction)."""
    child = spec.step_of(index, ChildStep).child
    return create_run(WorkflowSpec.from_dict(child), state, now,
                      {"parent_run": parent_id, "parent_attempt": attempt}, delay,
                      parent_id=parent_id, parent_step=index, parent_attempt=attempt)


class _Database:
    """The planner's :class:`~queuety.core.landing.Facts` over this transaction: what only the
    database knows about the run ``view`` names."""

    def __init__(self, spec: WorkflowSpec, view: RunView) -> None:
        self.spec, self.view = spec, view

    def stored_signals(self, names: Sequence[str]) -> list[tuple[int, str, Any]]:
        """The run's unconsumed signals of ``names``, oldest first."""
        return list(Signal.objects.filter(
            run_id=self.view.run_id, consumed_at__isnull=True, name__in=names,
        ).order_by("pk").values_list("pk", "name", "payload"))

    def awaited(self, ids: list[int]) -> dict[int, tuple[str, dict[str, Any]]]:
        """The awaited runs, marked awaited and read FOR SHARE on PostgreSQL, so no finish
        slips between the check and the parking (see ``queuety.store.sql.AWAITED_FOR_SHARE``)."""
        return _found(ids, lock=True)

    def start_runs(self, index: int, payloads: list[dict[str, Any]], group: str) -> list[int]:
        """Create and start the runs of the ``start_workflows`` step ``index``."""
        started = WorkflowSpec.from_dict(self.spec.step_of(index, StartStep).child)
        run_id = self.view.run_id
        return [create_run(started, payload, self.view.now, {"started_by": run_id},
                           started_by_id=run_id, started_by_step=index, group=group)
                for payload in payloads]


def _found(ids: list[int], *, lock: bool) -> dict[int, tuple[str, dict[str, Any]]]:
    return {pk: (status, engine.public(data or {}))
            for pk, status, data in rows.awaited_runs(ids, lock=lock)}


def workflow_wait(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                  groups: dict[str, list[int]], lock: bool = True
                  ) -> tuple[list[int], dependencies.WaitResult]:
    """Evaluate the workflow wait at ``index`` against the awaited runs as they are now (with
    ``lock`` on PostgreSQL, marked awaited and read FOR SHARE, as a landing reads them).

    Raises:
        InvalidStepOutput: the state key that should name the runs does not.
    """
    return landing.workflow_wait(spec, run_id, index, state, groups,
                                 lambda ids: _found(ids, lock=lock))


def land(spec: WorkflowSpec, view: RunView, index: int | None, events: list[Event],
         mode: landing.Mode = landing.Mode.MOVE) -> str:
    """Move the run of ``view`` (whose row this transaction locked or created, read once as
    ``view``) onto step ``index`` (``None``: past the last step, so the run completes).
    Writes the run row and ``events`` and what the plan needs; returns the run's status.

    The decisions are :func:`queuety.core.landing.plan`'s: a workflow wait that can no longer
    be satisfied fails the run; a wait whose settling would breach the budget fails it there,
    keeping the state from before the wait, or raises under ``Mode.ASK``; under ``Mode.HOLD``
    (a paused run) the run moves but stays paused, its next task row created unpublished.

    Raises:
        BudgetExceeded: under ``Mode.ASK`` (a caller of ``signal()``), whose transaction then
            rolls back, so nothing is consumed or recorded; or from a step the plan cannot
            enter (see :func:`queuety.core.landing.plan`).
    """
    if view.migration is not None:  # a move asked for mid-step: made at this boundary
        events = list(events)
        spec, view, index = moves.apply_pending(spec, view, index, events)
    planned = landing.plan(spec, view, index, _Database(spec, view), view.now, mode=mode)
    for effect in planned.effects:
        _EFFECTS[type(effect)](view, effect)
    written = [*events, *(Event(run_id=view.run_id, kind=note.kind, step_index=note.step_index,
                                step_name=note.step_name, data=note.data)
                          for note in planned.notes)]
    failure = planned.failure
    if failure is not None:
        return fail_at_wait(spec, view.run_id, failure.index, failure.state, failure.usage,
                            view.now, written, failure.error)
    WorkflowRun.objects.filter(pk=view.run_id).update(**_columns(spec, planned, view.now))
    if planned.entry is not None:
        written += _ENTRIES[type(planned.entry)](spec, view, planned, planned.entry)
    Event.objects.bulk_create(written)
    return planned.status


def _columns(spec: WorkflowSpec, planned: landing.Landing, now: datetime) -> dict[str, Any]:
    """The run row's new columns."""
    usage = planned.usage
    return {
        "state": planned.state, "transitions": usage.transitions,
        "cost_units": usage.cost_units, "started_workflows": usage.started_workflows,
        "revision": F("revision") + 1, "updated_at": now, "status": planned.status,
        "wait_expires_at": planned.wait_expires_at,
        **_reminder_columns(planned.reminder),
        **({} if planned.loops is None else {"loops": planned.loops}),
        **({} if planned.groups is None else {"groups": planned.groups}),
        **({} if planned.writes is None else {"state_writes": planned.writes}),
        **({"current_step": planned.index} if planned.index is not None
           else {"current_step": len(spec.steps), "finished_at": now}),
    }


def _reminder_columns(reminder: landing.Reminder | None) -> dict[str, Any]:
    """The run row's reminder columns: cleared in the write that ends (or leaves) a wait."""
    if reminder is None:
        return {"remind_at": None, "waiting_since": None, "reminders": 0}
    return {"remind_at": reminder.due, "waiting_since": reminder.since,
            "reminders": reminder.sent}


# -- the effects before the run row is written ------------------------------------------------

def _undepend(view: RunView, effect: landing.Undepend) -> None:
    WorkflowDependency.objects.filter(run_id=view.run_id).delete()


def _consume(view: RunView, effect: landing.ConsumeSignals) -> None:
    Signal.objects.filter(pk__in=effect.ids).update(consumed_at=view.now,
                                                    consumed_by_step=effect.step)


def _depend(view: RunView, effect: landing.Depend) -> None:
    _undepend(view, landing.Undepend())
    WorkflowDependency.objects.bulk_create([
        WorkflowDependency(run_id=view.run_id, step_index=effect.index, depends_on=i)
        for i in effect.on])


def _emit(view: RunView, effect: landing.Emit) -> None:
    signals.emit(effect.signal, **effect.data)


_EFFECTS: dict[type, Callable[[RunView, Any], None]] = {
    landing.ConsumeSignals: _consume, landing.Depend: _depend, landing.Undepend: _undepend,
    landing.Emit: _emit,
}


# -- what the landed step needs, after the run row --------------------------------------------

def _start_child(spec: WorkflowSpec, view: RunView, planned: landing.Landing,
                 entry: landing.StartChild) -> list[Event]:
    step = spec.steps[entry.index]
    child_id = start_child(spec, view.run_id, entry.index, planned.state, view.now)
    signals.emit("run_waiting", run_id=view.run_id, workflow=spec.name, step=step.name,
                 waiting_for=[child_id], kind="child")
    return [Event(run_id=view.run_id, kind="child_started", step_index=entry.index,
                  step_name=step.name, data={"child_run": child_id})]


def _fan_out(spec: WorkflowSpec, view: RunView, planned: landing.Landing,
             entry: landing.FanOut) -> list[Event]:
    fan_out(spec, view.run_id, entry.index, planned.state, planned.usage.transitions, view.now,
            None if entry.items is None else list(entry.items))
    return []


def _delay_row(spec: WorkflowSpec, view: RunView, planned: landing.Landing,
               entry: landing.DelayRow) -> list[Event]:
    # The due time lives in the row; long delays are published by the sweeper when due.
    due = view.now + timedelta(seconds=entry.seconds)
    on_broker = entry.seconds <= settings.MAX_ETA
    following = rows.new_step_run(view.run_id, spec, entry.index, seq=planned.usage.transitions,
                                  now=due, published=on_broker)
    if on_broker:
        publish.publish_on_commit([publish.message_for(spec, following.pk, entry.index,
                                                       entry.seconds or None)])
    return []


def _task_row(spec: WorkflowSpec, view: RunView, planned: landing.Landing,
              entry: landing.TaskRow) -> list[Event]:
    following = rows.new_step_run(view.run_id, spec, entry.index,
                                  seq=planned.usage.transitions, now=view.now,
                                  published=entry.published)
    if entry.published:
        gates.publish_landed(spec, following.pk, entry.index, view.run_id, planned.state)
    # Unpublished, it is ready for resume(), which publishes it; until then claims skip it.
    return []


def _complete(spec: WorkflowSpec, view: RunView, planned: landing.Landing,
              entry: landing.Complete) -> list[Event]:
    notify_finished(view.run_id)
    signals.emit("run_completed", run_id=view.run_id, workflow=spec.name, version=spec.version)
    return []


_ENTRIES: dict[type, Callable[[WorkflowSpec, RunView, landing.Landing, Any], list[Event]]] = {
    landing.StartChild: _start_child, landing.FanOut: _fan_out, landing.DelayRow: _delay_row,
    landing.TaskRow: _task_row, landing.Complete: _complete,
}


def fan_out(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any], seq: int,
            now: datetime, items: list[Any] | None) -> None:
    """Create one row per branch or item of the step at ``index`` and publish them all."""
    step = spec.step_of(index, FanOutStep)
    spread = step.fanout
    common: dict[str, Any] = {
        "run_id": run_id, "seq": seq, "step_index": index, "step_name": step.name,
        "available_at": now, "published_at": now}
    if isinstance(step, ForEachStep):
        items = items if items is not None else flow.for_each_items(spec, run_id, step, state)
        attempts = effective_policy(spec, index).max_attempts
        new = [StepRun(branch=i, handler=step.handler, input={"item": item, "index": i},
                       timeout=step.timeout, max_attempts=attempts, **common)
               for i, item in enumerate(items)]
    else:  # parallel
        new = [StepRun(branch=i, handler=path, timeout=spec.timeout_of(index, i),
                       max_attempts=effective_policy(spec, index, i).max_attempts, **common)
               for i, path in enumerate(spread.branches)]
    if spread.max_concurrency is not None:
        for row in new[spread.max_concurrency:]:  # they start as running ones finish
            row.status, row.published_at = StepStatus.HELD, None
    created = StepRun.objects.bulk_create(new)
    publish.publish_on_commit([publish.step_message(spec, row.pk, index, row.timeout)
                               for row in created if row.status == StepStatus.PENDING])


def release_held(spec: WorkflowSpec, run_id: int, seq: int, index: int, now: datetime) -> int:
    """Start held branches or items of a fan-out pass, in order, into the slots its
    ``max_concurrency`` leaves free. Call with the run's row locked (it serialises releases).
    """
    spread = spec.steps[index].fanout
    limit = None if spread is None else spread.max_concurrency
    if limit is None:
        return 0
    same_pass = StepRun.objects.filter(run_id=run_id, kind="step", seq=seq, step_index=index)
    # A throttled branch (waiting for its group, its queue's budget, or a paused queue) is
    # released and will run: it keeps its slot, or a resume would start more than the limit.
    free = limit - same_pass.filter(
        status__in=(StepStatus.PENDING, StepStatus.PROCESSING, StepStatus.THROTTLED)).count()
    if free <= 0:
        return 0
    released = list(same_pass.filter(status=StepStatus.HELD).order_by("branch")
                    .values_list("pk", "timeout")[:free])
    if released:
        StepRun.objects.filter(pk__in=[pk for pk, _ in released]).update(
            status=StepStatus.PENDING, available_at=now, published_at=now)
        publish.publish_on_commit([publish.step_message(spec, pk, index, timeout)
                                   for pk, timeout in released])
    return len(released)
