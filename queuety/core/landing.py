"""What a run does after each step, decided without the database: the landing planner.

After a step's outcome, a signal, a timeout, a child run's end or a resume, a run *lands* on
its next step. Steps that need no worker are done on the spot, in the same transaction: signal
waits settle from stored signals, workflow waits from the awaited runs, ``start`` steps start
their runs, ``repeat`` steps loop, empty ``for_each`` steps settle. The run then parks at the
first unsatisfied wait, starts a child run, or gets the row(s) its next step needs.

This module decides all of that as a frozen :class:`Landing` from three inputs:

- a :class:`RunView`, the run row the caller locked, read once with the lock (and, after the
  caller's own transition, the state and counters it moves on with);
- :class:`Facts`, the little only the database knows, asked for as the plan needs it: the
  stored signals, the awaited runs, and the ids of the runs a ``start`` step creates (the one
  write the plan needs back);
- the definition and the time.

``queuety.runtime.landing`` applies a plan: one update of the run row, then the effects in
order. Each transition the plan counts is :func:`queuety.core.transition.transition`'s, the
one copy every path that moves a run uses. Pure Python: no Django, no Celery (an import-linter contract keeps it so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Protocol

from queuety import exceptions
from queuety.core import budget as budgets
from queuety.core import dependencies, fanout, flow, waits
from queuety.core.definition import (
    ChildStep,
    DelayStep,
    ForEachStep,
    ParallelStep,
    RepeatStep,
    StartStep,
    StepSpec,
    TaskStep,
    WaitStep,
    WaitWorkflowsStep,
    WorkflowSpec,
    timing_of,
)
from queuety.core.status import RunStatus
from queuety.core.transition import Transition, transition


def lands_on_task(spec: WorkflowSpec, index: int | None) -> bool:
    """Whether a run moving to ``index`` (``None``: past the last step) needs nothing of a
    landing but its next task row or its completion: the question the one-statement
    transition asks before it may skip the locked path."""
    return index is None or isinstance(spec.steps[index], TaskStep)


# -- what the plan reads ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RunView:
    """A run row as the caller's lock read it, once (``queuety.store.rows.run_view``), and the
    state and counters the run lands with (:meth:`after` the caller's own transition)."""

    run_id: int
    status: str
    """The status as locked."""
    current_step: int
    """The step as locked."""
    transitions: int
    """The row's count of transitions as locked: behind :attr:`usage` once the caller
    counted a transition, which tells a first visit of a wait from a stay at it."""
    wait_expires_at: datetime | None
    """The expiry of the timed wait the run is parked (or paused) at, as locked."""
    state: dict[str, Any]
    usage: budgets.Usage
    writes: dict[str, int]
    """``state_writes`` (what ``prune_state_after`` keeps)."""
    loops: dict[str, int]
    groups: dict[str, list[int]]
    now: datetime
    """When the caller's transaction took the lock and decided: every time the landing writes."""
    migration: dict[str, Any] | None = None
    """A move onto another definition asked for while the run was mid-step (the row's
    ``migration``): the applier makes it before planning (``queuety.runtime.moves``)."""
    reminder: Reminder | None = None
    """The reminders of the wait the run is parked (or paused) at, as locked."""

    def after(self, moved: Transition) -> RunView:
        """This view with the state and counters of the caller's transition."""
        return replace(self, state=moved.state, usage=moved.usage,
                       writes=self.writes if moved.writes is None else moved.writes)


class Facts(Protocol):
    """What only the database knows, asked for by the plan as it needs it."""

    def stored_signals(self, names: Sequence[str]) -> list[tuple[int, str, Any]]:
        """The run's unconsumed signals of ``names``: ``(id, name, payload)``, oldest first."""

    def awaited(self, ids: list[int]) -> dict[int, tuple[str, dict[str, Any]]]:
        """``{id: (status, public state)}`` of the runs ``ids`` that exist, read so that none
        can finish between the read and the parking."""

    def start_runs(self, index: int, payloads: list[dict[str, Any]], group: str) -> list[int]:
        """Create and start one run of the ``start`` step ``index``'s workflow per payload
        (in this transaction); their ids, in order."""


class Mode(Enum):
    """How a landing moves a run."""

    MOVE = "move"
    """Move on; a wait whose settling would breach the budget fails the run there."""
    HOLD = "hold"
    """The run is paused: it moves to ``index`` but evaluates no wait and stays paused (its
    next task row is created unpublished, for ``resume()``)."""
    ASK = "ask"
    """As :attr:`MOVE`, but a breach raises (a ``signal()``, whose transaction then rolls
    back, so nothing is consumed or recorded)."""


def mode_of(status: str) -> Mode:
    """How a run with ``status`` (as locked) lands after its step: held if it is paused."""
    return Mode.HOLD if status == RunStatus.PAUSED else Mode.MOVE


# -- what the plan decides --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reminder:
    """The reminders of the wait a run is parked at: the run row's ``remind_at``,
    ``waiting_since`` and ``reminders`` (how many were sent)."""

    due: datetime | None
    """When the next one is due (``None``: none is left to send)."""
    since: datetime
    """When the run parked at the wait."""
    sent: int = 0


@dataclass(frozen=True, slots=True)
class Note:
    """A timeline event the landing records."""

    kind: str
    step_index: int | None = None
    step_name: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConsumeSignals:
    """Mark the signals ``ids`` consumed by step ``step``."""

    ids: tuple[int, ...]
    step: str


@dataclass(frozen=True, slots=True)
class Depend:
    """Replace the run's dependency rows: it waits at step ``index`` for runs ``on``."""

    index: int
    on: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Undepend:
    """Drop the run's dependency rows (its workflow wait settled)."""


@dataclass(frozen=True, slots=True)
class Emit:
    """Send the lifecycle signal ``signal`` (``queuety.signals``) with ``data``."""

    signal: str
    data: dict[str, Any]


#: What a plan does before the run row is written, in order.
Effect = ConsumeSignals | Depend | Undepend | Emit


@dataclass(frozen=True, slots=True)
class StartChild:
    """Start the child run of the ``run_workflow`` step ``index``."""

    index: int


@dataclass(frozen=True, slots=True)
class FanOut:
    """Create the rows of the ``parallel`` or ``for_each`` step ``index`` (its ``items``)."""

    index: int
    items: tuple[Any, ...] | None


@dataclass(frozen=True, slots=True)
class DelayRow:
    """Create the row of the ``delay`` step ``index``, due ``seconds`` from now."""

    index: int
    seconds: float


@dataclass(frozen=True, slots=True)
class TaskRow:
    """Create the row of the task step ``index``: published, or held for ``resume()``."""

    index: int
    published: bool


@dataclass(frozen=True, slots=True)
class Complete:
    """The run completed: wake its waiters and send ``run_completed``."""


#: What the step the run landed on needs, after the run row is written.
Entry = StartChild | FanOut | DelayRow | TaskRow | Complete


@dataclass(frozen=True, slots=True)
class FailAtWait:
    """Fail the run at the wait ``index``, keeping ``state`` and ``usage`` (those before the
    wait settled)."""

    index: int
    state: dict[str, Any]
    usage: budgets.Usage
    error: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Landing:
    """The plan of one landing: the run row's new columns, and what to do around them."""

    status: str
    index: int | None
    """The step the run is at; ``None``: it completed."""
    state: dict[str, Any]
    usage: budgets.Usage
    writes: dict[str, int] | None
    """``state_writes`` to write (``None``: the workflow does not prune)."""
    loops: dict[str, int] | None
    """The loop counters to write (``None``: no ``repeat`` step was evaluated)."""
    groups: dict[str, list[int]] | None
    """The run groups to write (``None``: no ``start`` or workflow wait was visited)."""
    wait_expires_at: datetime | None
    notes: tuple[Note, ...]
    effects: tuple[Effect, ...]
    entry: Entry | None
    failure: FailAtWait | None = None
    """When set, the run fails at a wait instead (the effects before it still apply)."""
    reminder: Reminder | None = None
    """The reminders of the wait the run parks (or stays paused) at; ``None`` clears them,
    in the write that ends the wait."""


# -- the plan ---------------------------------------------------------------------------------

@dataclass(slots=True)
class _Cursor:
    """The run as the plan moves it, step by step (private to one :func:`plan`)."""

    view: RunView
    mode: Mode
    now: datetime
    index: int | None
    state: dict[str, Any]
    usage: budgets.Usage
    writes: dict[str, int] | None
    loops: dict[str, int] | None = None
    groups: dict[str, list[int]] | None = None
    status: str = RunStatus.RUNNING
    expires_at: datetime | None = None
    reminder: Reminder | None = None
    items: list[Any] | None = None
    notes: list[Note] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    consumed: set[int] = field(default_factory=set)

    @property
    def at(self) -> int:
        assert self.index is not None, "the run is past its last step"
        return self.index

    def moved(self, moved: Transition, target: int | None) -> None:
        self.state, self.usage = moved.state, moved.usage
        self.writes = moved.writes
        self.index = target

    def note(self, kind: str, step: StepSpec, data: dict[str, Any]) -> None:
        self.notes.append(Note(kind, self.index, step.name, data))

    def run_groups(self) -> dict[str, list[int]]:
        if self.groups is None:
            self.groups = dict(self.view.groups)
        return self.groups


#: What a visit of a no-worker step tells the loop: go on, stop here, or fail the run.
_GO, _STOP = True, False


def plan(spec: WorkflowSpec, view: RunView, index: int | None, facts: Facts, now: datetime,
         *, mode: Mode = Mode.MOVE) -> Landing:
    """Decide how the run of ``view`` lands on step ``index`` (``None``: past the last step,
    so it completes) at ``now``.

    Raises:
        BudgetExceeded: a ``start`` or ``repeat`` step, or an empty ``for_each``, breaches the
            budget; or settling a wait does under :attr:`Mode.ASK`.
        InvalidStepOutput: a ``for_each`` step's items are not a list, a reducer's output is
            not a dict, or a ``start`` step's items are not a list.
    """
    cursor = _Cursor(view, mode, now, index, view.state, view.usage,
                     None if spec.prune_state_after is None else dict(view.writes))
    while mode is not Mode.HOLD and cursor.index is not None:
        verdict = _visit(spec, cursor, facts, spec.steps[cursor.index])
        if isinstance(verdict, FailAtWait):
            return _landing(spec, cursor, verdict)
        if verdict is None or verdict is _STOP:
            break
    return _landing(spec, cursor)


def _visit(spec: WorkflowSpec, cursor: _Cursor, facts: Facts, step: StepSpec
           ) -> bool | FailAtWait | None:
    """Do the step at the cursor if a landing does it in the transaction, with no worker (the
    one dispatch on a step's kind); ``None``: it needs a worker or a child run, so the loop
    stops there and :func:`_entry` says what it needs."""
    match step:
        case WaitStep():
            return _visit_signal_wait(spec, cursor, facts, step)
        case WaitWorkflowsStep():
            return _visit_workflow_wait(spec, cursor, facts, step)
        case StartStep():
            return _visit_start(spec, cursor, facts, step)
        case RepeatStep():
            return _visit_repeat(spec, cursor, step)
        case ForEachStep():
            return _visit_for_each(spec, cursor, step)
    return None


def _landing(spec: WorkflowSpec, cursor: _Cursor, failure: FailAtWait | None = None
             ) -> Landing:
    """The plan, from where the loop left the cursor."""
    if failure is None and cursor.index is None:
        cursor.status = RunStatus.COMPLETED
        cursor.notes.append(Note("workflow_completed"))
    elif cursor.mode is Mode.HOLD:
        cursor.status = RunStatus.PAUSED
    elif cursor.status == RunStatus.RUNNING and isinstance(spec.steps[cursor.at], ChildStep):
        cursor.status = RunStatus.WAITING_FOR_WORKFLOWS
    entry = None if failure is not None else _entry(spec, cursor)
    return Landing(cursor.status, cursor.index, cursor.state, cursor.usage, cursor.writes,
                   cursor.loops, cursor.groups, _expiry(spec, cursor), tuple(cursor.notes),
                   tuple(cursor.effects), entry, failure, _reminder(spec, cursor))


def _entry(spec: WorkflowSpec, cursor: _Cursor) -> Entry | None:
    """What the step the run landed on needs from workers."""
    if cursor.index is None:
        return Complete()
    step, status = spec.steps[cursor.index], cursor.status
    if status == RunStatus.WAITING_FOR_WORKFLOWS and isinstance(step, ChildStep):
        return StartChild(cursor.index)
    if status == RunStatus.PAUSED:
        return TaskRow(cursor.index, published=False) if isinstance(step, TaskStep) else None
    if status != RunStatus.RUNNING:
        return None
    match step:
        case ParallelStep() | ForEachStep():
            return FanOut(cursor.index, None if cursor.items is None else tuple(cursor.items))
        case DelayStep():
            return DelayRow(cursor.index, flow.delay_seconds(step, cursor.state, cursor.now,
                                                             cursor.view.run_id))
    return TaskRow(cursor.index, published=True)


def _timing(spec: WorkflowSpec, index: int | None
            ) -> waits.WaitSpec | dependencies.WaitWorkflowsSpec | None:
    """The timeout and reminder options of the wait at ``index`` (``None``: no wait)."""
    if index is None or index >= len(spec.steps):
        return None
    return timing_of(spec.steps[index])


def timed_wait(spec: WorkflowSpec, index: int | None) -> float | None:
    """The timeout of the wait at ``index``, if it is a wait (on signals or on runs) with a
    timeout."""
    timing = _timing(spec, index)
    return None if timing is None else timing.timeout


#: The statuses of a run parked at a wait.
_PARKED = (RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS)


def _expiry(spec: WorkflowSpec, cursor: _Cursor) -> datetime | None:
    """The run's ``wait_expires_at``: its timed wait's, when parked at one; a paused run keeps
    the expiry of the timed wait it is paused at (resume parks it there again, and a timeout
    that passed meanwhile then fires); any other run has none."""
    if cursor.status in _PARKED:
        return cursor.expires_at
    if cursor.status != RunStatus.PAUSED or timed_wait(spec, cursor.index) is None:
        return None
    return cursor.view.wait_expires_at


def _reminder(spec: WorkflowSpec, cursor: _Cursor) -> Reminder | None:
    """The run's reminders, as :func:`_expiry` its expiry: those of the wait it parks at; a
    paused run keeps those of the wait it is paused at (no reminder is sent while it is
    paused: the sweeper reminds parked runs only); any other run has none."""
    if cursor.status in _PARKED:
        return cursor.reminder
    timing = _timing(spec, cursor.index)
    if cursor.status != RunStatus.PAUSED or timing is None \
            or waits.first_reminder(timing.remind_after, timing.remind_every) is None:
        return None
    return cursor.view.reminder


def _park_timing(spec: WorkflowSpec, cursor: _Cursor, staying: bool) -> None:
    """Set the expiry and the reminders of the wait the cursor parks at: a run that stays
    at its wait keeps them (a signal that did not settle it, a resume, one of several runs
    finishing); one that arrives there starts them afresh."""
    timing = _timing(spec, cursor.at)
    if timing is None:
        return
    if timing.timeout is not None:
        kept = cursor.view.wait_expires_at if staying else None
        cursor.expires_at = kept or cursor.now + timedelta(seconds=timing.timeout)
    first = waits.first_reminder(timing.remind_after, timing.remind_every)
    if first is not None:
        kept_reminder = cursor.view.reminder if staying else None
        cursor.reminder = kept_reminder or Reminder(cursor.now + timedelta(seconds=first),
                                                    cursor.now)


# -- the visits, one per no-worker kind ------------------------------------------------------

def _visit_start(spec: WorkflowSpec, cursor: _Cursor, facts: Facts, step: StartStep) -> bool:
    """Start the runs of a ``start_workflows`` step, as one transition."""
    start = step.start
    payloads = dependencies.child_payloads(start, step.name, cursor.state)
    _check_started(spec, cursor, step, len(payloads))
    ids = facts.start_runs(cursor.at, payloads, start.group or "")
    moved = transition(spec, cursor.view.run_id, cursor.state, cursor.writes, cursor.usage,
                       {start.result_key: ids}, started=len(ids),
                       merged={**cursor.state, start.result_key: ids}).checked()
    groups = cursor.run_groups()  # read, and so written back, whenever a start step runs
    if start.group:  # a start step entered again replaces its group
        groups[start.group] = ids
    cursor.note("workflows_started", step, {"runs": ids, "group": start.group,
                                            **moved.event_data})
    cursor.moved(moved, spec.next_index(cursor.at))
    return _GO


def _check_started(spec: WorkflowSpec, cursor: _Cursor, step: StepSpec, count: int) -> None:
    """Raise BudgetExceeded if starting ``count`` more runs passes ``max_started_workflows``
    (checked before any is created)."""
    limit, used = spec.budget.max_started_workflows, cursor.usage.started_workflows
    if limit is None or used + count <= limit:
        return
    run_id = cursor.view.run_id
    raise exceptions.BudgetExceeded(
        "max_started_workflows", limit, used + count, run_id, spec.name,
        message=f"Start step {step.name!r} of run {run_id} would start {count} runs after "
                f"{used}, over its max_started_workflows budget of {limit}; none was started.")


def _visit_repeat(spec: WorkflowSpec, cursor: _Cursor, step: RepeatStep) -> bool:
    """Evaluate a ``repeat`` step, as one transition: back to its target, or on."""
    index = cursor.at
    loops = dict(cursor.view.loops) if cursor.loops is None else cursor.loops
    again, cursor.loops = flow.repeat_decision(spec, cursor.view.run_id, index, cursor.state,
                                               loops)
    moved = transition(spec, cursor.view.run_id, cursor.state, cursor.writes, cursor.usage,
                       {}).checked()
    cursor.note("repeat_evaluated", step, {"again": again,
                                           "iterations": cursor.loops.get(str(index), 0),
                                           **moved.event_data})
    target = spec.index_of(step.repeat["target"]) if again else spec.next_index(index)
    cursor.moved(moved, target)
    return _GO


def _visit_for_each(spec: WorkflowSpec, cursor: _Cursor, step: ForEachStep) -> bool:
    """Find a ``for_each`` step's items: stop to fan out to them, or, with none, settle the
    join at once, as a transition."""
    items = flow.for_each_items(spec, cursor.view.run_id, step, cursor.state)
    if items:
        cursor.items = items
        return _STOP
    output = flow.join_output(step, cursor.state, [], run_id=cursor.view.run_id)
    moved = transition(spec, cursor.view.run_id, cursor.state, cursor.writes, cursor.usage,
                       output).checked()
    cursor.note("for_each_settled", step, {"output": output, **moved.event_data})
    cursor.moved(moved, spec.next_index(cursor.at))
    return _GO


def workflow_wait(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                  groups: dict[str, list[int]],
                  awaited: Callable[[list[int]], dict[int, tuple[str, dict[str, Any]]]]
                  ) -> tuple[list[int], dependencies.WaitResult]:
    """Evaluate the workflow wait at ``index`` against the runs ``awaited`` finds.

    Raises:
        InvalidStepOutput: the state key that should name the runs does not.
    """
    step = spec.step_of(index, WaitWorkflowsStep)
    wait = step.workflows
    ids = dependencies.awaited_ids(wait, step.name, state, groups)
    return ids, dependencies.evaluate(wait, ids, awaited(ids))


def _visit_workflow_wait(spec: WorkflowSpec, cursor: _Cursor, facts: Facts,
                         step: WaitWorkflowsStep) -> bool | FailAtWait:
    """Settle a ``wait_for_workflows`` step, park the run at it, or fail the run there."""
    index = cursor.at
    try:
        ids, found = workflow_wait(spec, cursor.view.run_id, index, cursor.state,
                                   cursor.run_groups(), facts.awaited)
    except exceptions.InvalidStepOutput as error:
        return _fail_at(cursor, step, error)
    if found.verdict == fanout.PENDING:
        _park_timing(spec, cursor, _staying(cursor))
        cursor.status = RunStatus.WAITING_FOR_WORKFLOWS
        cursor.effects.append(Depend(index, tuple(found.remaining)))
        expires = {} if cursor.expires_at is None else {
            "expires_at": cursor.expires_at.isoformat()}
        cursor.note("workflow_waiting", step, {"waiting_for": [str(i) for i in ids],
                                               **found.details, **expires})
        cursor.effects.append(_waiting(spec, cursor, step, list(ids), "workflows"))
        return _STOP
    if found.verdict == fanout.IMPOSSIBLE:
        return _fail_at(cursor, step, _impossible(cursor.view.run_id, step, found),
                        **found.details)
    return _settle_wait(spec, cursor, step, found.output or {}, Undepend(),
                        {"workflows": found.matched})


def _impossible(run_id: int, step: WaitWorkflowsStep, found: dependencies.WaitResult
                ) -> exceptions.WorkflowWaitFailed:
    """The error of a workflow wait that can no longer be satisfied."""
    wait = step.workflows
    return exceptions.WorkflowWaitFailed(
        f"Workflow wait {step.name!r} of run {run_id} can no longer be satisfied "
        f"(mode {wait.mode!r}" + (f", quorum {wait.quorum}" if wait.quorum else "")
        + f"): runs {found.failed} failed, were cancelled or do not exist; "
        f"completed {found.matched}, still running {found.remaining}.")


def _visit_signal_wait(spec: WorkflowSpec, cursor: _Cursor, facts: Facts, step: WaitStep
                       ) -> bool | FailAtWait:
    """Settle a signal wait from the stored signals (those this landing has not consumed
    already), or park the run at it."""
    wait = step.wait
    stored = [signal for signal in facts.stored_signals(wait.signals)
              if signal[0] not in cursor.consumed]
    result = waits.evaluate(wait, stored, cursor.state)
    if not result.settled:
        _park_at_signal(spec, cursor, step, result)
        return _STOP
    cursor.consumed.update(result.consumed)
    return _settle_wait(spec, cursor, step, result.output,
                        ConsumeSignals(tuple(result.consumed), step.name),
                        {"signals": [name for name, _ in result.chosen],
                         "signal_ids": result.consumed})


def _park_at_signal(spec: WorkflowSpec, cursor: _Cursor, step: WaitStep,
                    result: waits.Evaluation) -> None:
    """Park the run at a signal wait, with its expiry when the wait is timed."""
    wait = step.wait
    cursor.status = RunStatus.WAITING_FOR_SIGNAL
    staying = _staying(cursor)
    _park_timing(spec, cursor, staying)
    expires = {} if cursor.expires_at is None else {"expires_at": cursor.expires_at.isoformat()}
    cursor.note("workflow_waiting", step, {"waiting_for": list(wait.signals),
                                           "matched": result.matched, **expires})
    if not (staying and cursor.view.status == RunStatus.WAITING_FOR_SIGNAL):
        # Not for a signal that left the wait open: the run was waiting already.
        cursor.effects.append(_waiting(spec, cursor, step, list(wait.signals),
                                       wait.human or "signal"))


def _staying(cursor: _Cursor) -> bool:
    """Whether this is the visit of the wait the run is already parked (or paused) at: a
    signal that did not settle it, or a resume. False when the run arrives at the wait by a
    transition (the row's count of transitions is behind the landing's): a loop back to it,
    a timeout jumping to it, its first visit."""
    view = cursor.view
    return (view.current_step == cursor.index and view.transitions == cursor.usage.transitions
            and view.status in (*_PARKED, RunStatus.PAUSED))


def _settle_wait(spec: WorkflowSpec, cursor: _Cursor, step: StepSpec, output: dict[str, Any],
                 done: Effect, used: dict[str, Any]) -> bool | FailAtWait:
    """Settle the wait at the cursor as one transition merging ``output``; a breach fails
    the run at the wait (or raises, under :attr:`Mode.ASK`)."""
    moved = transition(spec, cursor.view.run_id, cursor.state, cursor.writes, cursor.usage,
                       output)
    if moved.breach is not None:
        if cursor.mode is Mode.ASK:
            raise moved.breach
        return _fail_at(cursor, step, moved.breach)
    cursor.effects.append(done)
    cursor.note("wait_settled", step, {**used, "output": output, **moved.event_data})
    cursor.moved(moved, spec.next_index(cursor.at))
    return _GO


def _waiting(spec: WorkflowSpec, cursor: _Cursor, step: StepSpec, waiting_for: list[Any],
             kind: str) -> Emit:
    """The ``run_waiting`` lifecycle signal of a run parking at ``step``."""
    return Emit("run_waiting", {"run_id": cursor.view.run_id, "workflow": spec.name,
                                "step": step.name, "waiting_for": waiting_for, "kind": kind})


def _fail_at(cursor: _Cursor, step: StepSpec, error: BaseException, **extra: Any) -> FailAtWait:
    """Fail the run at the wait at the cursor, with the state it had before the wait."""
    return FailAtWait(cursor.at, cursor.state, cursor.usage, flow.failure_record(
        error, step=step.name, step_index=cursor.at, attempt=None, max_attempts=None, **extra))

