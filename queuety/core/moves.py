"""Moving a live run onto another definition of its workflow, decided without the database.

A run is pinned to the definition it started with. ``queuety.migrate_runs()`` moves live runs
onto another one (the version registered now, after a deploy): each run's current step is
mapped by name, or by the caller's ``step_map``, onto a step of the new definition, and its
state may go through a function. What a run can do depends on where it stands, and this
module decides it (:func:`decide`):

- at rest (its step not started, or paused before it): it moves now, onto the mapped step;
- parked at a signal wait: it keeps its wait, moved in place, if the mapped step is the same
  kind of wait (the same person's kind and the same signals); otherwise it cannot move;
- in the middle of a step (an attempt processing, a delay sleeping, a fan-out joining): it
  moves at its next boundary, onto the step the one it then lands on maps to, so nothing is
  moved half-way and no output is lost or merged twice;
- parked at a wait for other runs (a child run, ``wait_for_workflows``): it moves when the
  wait is next landed on (an awaited run finishing), onto the same kind of wait.

Pure Python: ``queuety.run_migration`` and ``queuety.runtime.moves`` apply the decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from queuety import exceptions
from queuety.core.definition import (
    ChildStep,
    DelayStep,
    FanOutStep,
    TaskStep,
    WaitStep,
    WaitWorkflowsStep,
    WorkflowSpec,
)
from queuety.core.status import RunStatus

#: The statuses a run can be moved from (throttled is a step's status: its run is running).
MOVABLE = (RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS,
           RunStatus.PAUSED)

NOW = "now"
"""The run moves now, onto :attr:`Verdict.target` (its live rows, not started, go)."""
IN_PLACE = "in_place"
"""The run keeps its wait, now at :attr:`Verdict.target` of the new definition."""
AT_BOUNDARY = "at_boundary"
"""The run moves when its current step ends, onto the step it then lands on, mapped."""
CANNOT = "cannot"
"""The run cannot move; :attr:`Verdict.reason` says why."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What migrating one run does."""

    action: str
    """:data:`NOW`, :data:`IN_PLACE`, :data:`AT_BOUNDARY` or :data:`CANNOT`."""
    reason: str
    """A full sentence: what happens to the run, or why it cannot move."""
    target: int | None = None
    """The step of the new definition it moves to (``NOW`` and ``IN_PLACE``), or, at its
    boundary, the one its next step in order maps to."""

    @property
    def moves(self) -> bool:
        """Whether the run moves (now, in place or at its boundary)."""
        return self.action != CANNOT


def check_step_map(sources: Sequence[WorkflowSpec], to: WorkflowSpec,
                   step_map: Mapping[str, str]) -> None:
    """Check ``step_map``: every key a step of one of ``sources`` (the definitions of the runs
    to move; none: any key), every value a step of ``to``.

    Raises:
        InvalidMigration: a name is unknown; the message lists the steps of that side.
    """
    unknown = [repr(old) for old in step_map if sources and not any(
        isinstance(old, str) and spec.position(old) is not None for spec in sources)]
    if unknown:
        names = sorted({step.name for spec in sources for step in spec.steps})
        raise exceptions.InvalidMigration(
            f"step_map names {', '.join(unknown)}, which no definition of the runs to move "
            f"has; their steps are {', '.join(names)}.")
    unknown = [repr(new) for new in step_map.values()
               if not isinstance(new, str) or to.position(new) is None]
    if unknown:
        raise exceptions.InvalidMigration(
            f"step_map maps onto {', '.join(unknown)}, which definition "
            f"{to.definition_hash[:12]} of {to.name!r} does not have; its steps are "
            f"{', '.join(step.name for step in to.steps)}.")


def map_index(run_spec: WorkflowSpec, to: WorkflowSpec, index: int,
              step_map: Mapping[str, str]) -> int | None:
    """The step of ``to`` that step ``index`` of ``run_spec`` maps to (by ``step_map``, else
    by name); ``None`` when it maps to none."""
    name = run_spec.steps[index].name
    target = step_map.get(name, name)
    return to.position(target)


def index_map(run_spec: WorkflowSpec, to: WorkflowSpec,
              step_map: Mapping[str, str]) -> dict[int, int]:
    """``{old index: new index}`` for every step of ``run_spec`` that maps onto ``to``: how
    the timeline's step positions read after a move."""
    found = {index: map_index(run_spec, to, index, step_map)
             for index in range(len(run_spec.steps))}
    return {old: new for old, new in found.items() if new is not None}


def same_wait(old: WaitStep, new: Any) -> bool:
    """Whether a run parked at ``old`` can keep its wait at ``new``: a signal wait on the same
    signals, in the same mode, for the same kind of person (approval, decision, input) or
    none, with the same outcomes of a decision."""
    return isinstance(new, WaitStep) and new.wait.human == old.wait.human and \
        set(new.wait.signals) == set(old.wait.signals) and new.wait.mode == old.wait.mode \
        and new.wait.decision == old.wait.decision


def decide(run_spec: WorkflowSpec, to: WorkflowSpec, *, status: str, current_step: int,
           step_map: Mapping[str, str], processing: bool) -> Verdict:
    """Decide what moving a run (``status`` at ``current_step`` of ``run_spec``) onto ``to``
    does; ``processing``: an attempt of its current step is running now."""
    if status not in MOVABLE:
        return Verdict(CANNOT, f"It is {status}; only live runs move (running, waiting or "
                               "paused).")
    if current_step >= len(run_spec.steps):
        return Verdict(CANNOT, "It stands past its last step.")
    step = run_spec.steps[current_step]
    if isinstance(step, WaitStep | ChildStep | WaitWorkflowsStep):
        return _parked(run_spec, to, step, current_step, step_map)
    boundary = _boundary(step, processing)
    if boundary is not None:
        return _at_boundary(run_spec, to, step, current_step, step_map, boundary)
    target = map_index(run_spec, to, current_step, step_map)
    if target is None:
        return _unmapped("Its current step", step.name)
    return Verdict(NOW, f"It moves now, onto {to.steps[target].name!r} of the new "
                        "definition.", target)


def _parked(run_spec: WorkflowSpec, to: WorkflowSpec, step: Any, index: int,
            step_map: Mapping[str, str]) -> Verdict:
    """A run parked at a wait: a signal wait is kept in place; a wait for other runs is left
    to end, its move made then; either only onto the same kind of wait."""
    target = map_index(run_spec, to, index, step_map)
    if target is None:
        return _unmapped("Its current step", step.name)
    onto = to.steps[target]
    if isinstance(step, WaitStep):
        if same_wait(step, onto):
            return Verdict(IN_PLACE, f"It keeps its wait, at {onto.name!r} of the new "
                                     "definition.", target)
        return Verdict(CANNOT, (
            f"It waits at {step.name!r} for {_wait_words(step)}, and {onto.name!r}, the step "
            f"it maps to, {_is_not_same_wait(onto)}; map it onto the same kind of wait."))
    if type(onto) is not type(step):
        return Verdict(CANNOT, (
            f"It waits at {step.name!r} for other runs, and {onto.name!r}, the step it maps "
            f"to, is a {onto.kind} step, not a {step.kind} step; map it onto the same kind "
            "of wait."))
    return Verdict(AT_BOUNDARY, f"It moves when the runs it waits for at {step.name!r} "
                                f"finish, its wait at {onto.name!r} of the new definition.",
                   target)


def _at_boundary(run_spec: WorkflowSpec, to: WorkflowSpec, step: Any, index: int,
                 step_map: Mapping[str, str], boundary: str) -> Verdict:
    """A run in the middle of a step: it moves when the step ends, onto its next step."""
    following = run_spec.next_index(index)
    if following is None:
        return Verdict(CANNOT, f"Its current step {step.name!r} is its last: the run "
                               "completes on its own definition when it ends.")
    target = map_index(run_spec, to, following, step_map)
    name = run_spec.steps[following].name
    if target is None:
        return _unmapped(f"It moves only when {boundary}, onto its next step, and that "
                         "step", name)
    return Verdict(AT_BOUNDARY, (
        f"It moves when {boundary}, onto {to.steps[target].name!r} (its next step {name!r}, "
        "mapped; a step that jumps elsewhere is mapped when it does)."), target)


def _unmapped(what: str, name: str) -> Verdict:
    return Verdict(CANNOT, (
        f"{what} {name!r} is not a step of the new definition; map it with "
        f"step_map={{{name!r}: 'a step of the new definition'}}."))


def _boundary(step: Any, processing: bool) -> str | None:
    """What a run at ``step`` is in the middle of (``None``: nothing, it can move now)."""
    if isinstance(step, DelayStep):
        return f"its delay at {step.name!r} ends"
    if isinstance(step, FanOutStep):
        return f"its fan-out at {step.name!r} joins"
    if processing:
        return f"its attempt of {step.name!r}, running now, is recorded"
    return None


def _wait_words(step: WaitStep) -> str:
    what = step.wait.human or "a signal"
    article = "an" if what[0] in "aeiou" else "a"
    return f"{what} ({', '.join(step.wait.signals)})" if step.wait.human is None else \
        f"{article} {what} ({', '.join(step.wait.signals)})"


def _is_not_same_wait(onto: Any) -> str:
    if isinstance(onto, WaitStep):
        return f"waits for {_wait_words(onto)} instead"
    kind = "a task" if isinstance(onto, TaskStep) else f"a {onto.kind} step"
    return f"is {kind}, not a wait"


def state_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level keys a state function added, removed and changed:
    ``{"added": {k: v}, "removed": [k], "changed": {k: [old, new]}}``."""
    return {
        "added": {key: after[key] for key in after if key not in before},
        "removed": sorted(key for key in before if key not in after),
        "changed": {key: [before[key], after[key]] for key in after
                    if key in before and before[key] != after[key]},
    }
