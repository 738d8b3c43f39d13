"""A run's timeline, and the state after any step rebuilt from it.

The timeline is the ``Event`` table. Every transition records what it merged (``output``), and
every event that resets the state (rewind, fork, replay, a move onto another definition)
records the whole public state, so the state after any step can be rebuilt from the events
alone.
"""

from __future__ import annotations

from typing import Any

from queuety.core import pruning
from queuety.models import Event
from queuety.store import rows
from queuety.store.definitions import load_spec

#: Event kinds that carry the run's whole public state in ``data["state"]``.
STATE_RESETS = ("workflow_started", "workflow_rewound", "workflow_forked", "workflow_replayed",
                "run_migrated", "state_edited", "workflow_retried")
#: Event kinds whose ``data["output"]`` was merged into the state.
MERGES = ("step_completed", "wait_settled", "wait_timed_out")


def event_dict(event: Event) -> dict[str, Any]:
    """An event as the timeline and the export show it."""
    return {"id": event.pk, "kind": event.kind, "step_index": event.step_index,
            "step_name": event.step_name, "attempt": event.attempt,
            "duration_ms": event.duration_ms, "data": event.data,
            "created_at": event.created_at.isoformat()}


def timeline(run_id: int, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
    """Return run ``run_id``'s events, oldest first (``queuety.workflow_timeline()``).

    Raises:
        RunNotFound: no such run.
    """
    rows.get_run(run_id)
    events = Event.objects.filter(run_id=run_id).order_by("pk")[offset:offset + limit]
    return [event_dict(event) for event in events]


def states_after_steps(run_id: int) -> dict[int, dict[str, Any]]:
    """Rebuild, from the timeline, the public state after each step's latest completion."""
    return {index: state for index, state in _states(run_id).items() if index >= 0}


def state_before(run_id: int, index: int) -> dict[str, Any]:
    """Return the public state step ``index``'s latest visit started from: the state just
    before the event that merged that visit's output (so a visit reached by a route, a
    ``_next_step`` jump or a loop counts, and the ``state_edited`` edits made while the run
    stood at the step are in it).

    Raises:
        LookupError: no visit of step ``index`` completed since the run's last retry from an
            earlier step (a route or jump skipped it, or it never ran).
    """
    started = _replay(run_id)[1]
    if index not in started:
        raise LookupError(f"No visit of step {index} of workflow run {run_id} completed, so "
                          "nothing records the state it started from")
    return started[index]


def _states(run_id: int) -> dict[int, dict[str, Any]]:
    """The states after each step's latest completion (:func:`states_after_steps`)."""
    return _replay(run_id)[0]


def _replay(run_id: int) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
    """Replay the timeline: the state after each step's latest completion, and the state
    each step's latest completed visit started from (the state just before its merge)."""
    state: dict[str, Any] = {}
    after: dict[int, dict[str, Any]] = {}
    started: dict[int, dict[str, Any]] = {}
    for kind, step_index, data in (Event.objects.filter(run_id=run_id).order_by("pk")
                                   .values_list("kind", "step_index", "data")):
        if _resets(kind, data):
            state = dict(data["state"])
            if kind == "run_migrated":  # the steps before the move, at their new positions
                after = _moved(after, data.get("step_indexes") or {})
                started = _moved(started, data.get("step_indexes") or {})
            elif kind == "workflow_retried" and step_index is not None:
                # Retried from a step: what it and the later steps did is gone.
                after, started = ({i: s for i, s in states.items() if i < step_index}
                                  for states in (after, started))
            elif kind == "state_edited" and isinstance(data.get("at_step"), int):
                # An edit amends what the step it stood at starts from (a rewind to the one
                # before it keeps it).
                after[data["at_step"] - 1] = dict(state)
        elif kind in MERGES:
            if step_index is not None:  # a merge always names its step
                started[step_index] = dict(state)
            output = data.get("output") or {}
            state = {**state, **{k: v for k, v in output.items() if not k.startswith("_")}}
            state = pruning.replay(state, data)  # what prune_state_after dropped
            if step_index is not None:
                after[step_index] = dict(state)
        elif data and data.get("pruned"):  # a transition that merged nothing still prunes
            state = pruning.replay(state, data)
    return after, started


def _resets(kind: str, data: dict[str, Any] | None) -> bool:
    """Whether the event puts the whole state back (a retry does so only from a step)."""
    return kind in STATE_RESETS and "state" in (data or {})


def _moved(after: dict[int, dict[str, Any]], positions: dict[str, int]
           ) -> dict[int, dict[str, Any]]:
    """The states after steps recorded before a ``run_migrated``, keyed by the positions
    those steps have in the definition the run moved to (steps it lacks are dropped)."""
    return {positions[str(old)]: state for old, state in after.items()
            if str(old) in positions}


def moved_position(run_id: int, transitions: int, index: int) -> int:
    """Where the wait at position ``index`` of the run's visit ``transitions`` stands now: the
    same position, unless moves onto other definitions kept it in place elsewhere (an
    approval link names the position it was mailed for)."""
    for data in (Event.objects.filter(run_id=run_id, kind="run_migrated",
                                      data__in_place=True, data__transitions=transitions)
                 .order_by("pk").values_list("data", flat=True)):
        index = (data.get("step_indexes") or {}).get(str(index), -1)
    return index


def state_at(run_id: int, step: int | str) -> dict[str, Any]:
    """Return the public state right after step ``step`` (index or name) last completed.

    Raises:
        RunNotFound: no such run.
        LookupError: the step never completed in this run.
    """
    run = rows.get_run(run_id)
    spec = load_spec(run.definition_id)
    index = step if isinstance(step, int) else spec.index_of(step)
    after = states_after_steps(run_id)
    if index not in after:
        raise LookupError(f"No recorded state found for workflow run {run_id} at step {step}.")
    return after[index]
