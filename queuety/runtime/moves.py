"""Moving a run onto another definition at a step boundary: the rows a move writes.

``queuety.run_migration`` moves runs at rest at once; a run in the middle of a step gets its
move recorded on its row (``WorkflowRun.migration``), and the landing that ends the step
(:func:`queuety.runtime.landing.land`) makes it here first (:func:`apply_pending`), in the
same transaction: the run then lands on the new definition's step, with the state the state
function returned. A move that cannot be made there (the step it lands on is not in the new
definition, the state function raises) is recorded as ``run_migration_failed`` and the run
goes on, unchanged, on its own definition.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import replace
from typing import Any

from django.db import transaction

from queuety import exceptions
from queuety.core import moves
from queuety.core.definition import WorkflowSpec
from queuety.core.imports import import_path
from queuety.core.landing import RunView
from queuety.models import Event, WorkflowDefinition, WorkflowRun
from queuety.store.definitions import definition_hash, load_spec

logger = logging.getLogger("queuety")


def new_state(state_function: Any, state: dict[str, Any], run: WorkflowRun) -> dict[str, Any]:
    """Run ``state_function(state, run)`` (a callable, or a dotted path to one) on a deep copy
    of the run's state, in a savepoint, and return the state it moves with (``state`` itself
    without one). Whatever the function wrote to the database is rolled back if it raises.

    Raises:
        InvalidMigration: the function raised (a database error too), or returned something
            that is not a state (a dict of JSON without reserved ``_`` keys); the message
            names the run.
    """
    if state_function is None:
        return state
    function = import_path(state_function) if isinstance(state_function, str) \
        else state_function
    try:
        with transaction.atomic():
            returned = function(copy.deepcopy(state), run)
    except Exception as error:
        raise exceptions.InvalidMigration(
            f"The state function {_name(state_function)} raised {type(error).__name__} for run "
            f"{run.pk}: {error}. The run was not moved.") from error
    problem = _not_a_state(returned)
    if problem is not None:
        raise exceptions.InvalidMigration(
            f"The state function {_name(state_function)} returned {problem} for run {run.pk}; "
            "it must return the state as a dict of JSON values whose keys do not start with "
            "'_'. The run was not moved.")
    stored: dict[str, Any] = json.loads(json.dumps(returned))
    return stored


def _not_a_state(value: Any) -> str | None:
    """What is wrong with ``value`` as a run's state (``None``: nothing)."""
    if not isinstance(value, dict):
        return f"a {type(value).__name__}, not a dict"
    reserved = sorted(repr(key) for key in value
                      if not isinstance(key, str) or key.startswith("_"))
    if reserved:
        return f"reserved or non-string keys {', '.join(reserved)}"
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        return f"a dict that is not JSON ({error})"
    return None


def switch(run_id: int, to_pk: int, to: WorkflowSpec, **columns: Any) -> None:
    """Point the run row at definition ``to_pk`` (and write ``columns``), its move made."""
    WorkflowRun.objects.filter(pk=run_id).update(
        definition_id=to_pk, total_steps=len(to.steps), migration=None, **columns)


def migrated_event(run_id: int, run_spec: WorkflowSpec, to: WorkflowSpec, *, step: int | None,
                   target: int | None, before: dict[str, Any], after: dict[str, Any],
                   step_map: dict[str, str], by: str, **extra: Any) -> Event:
    """The ``run_migrated`` event: both hashes, where it stood and moved to, the state diff,
    the new state (the timeline's state resets read it) and how step positions map."""
    return Event(run_id=run_id, kind="run_migrated", step_index=target,
                 step_name="" if target is None else to.steps[target].name, data={
                     "by": by, "from_hash": run_spec.definition_hash,
                     "to_hash": to.definition_hash, "from_version": run_spec.version,
                     "to_version": to.version,
                     "from_step": None if step is None else run_spec.steps[step].name,
                     "to_step": None if target is None else to.steps[target].name,
                     "step_map": step_map, "state_diff": moves.state_diff(before, after),
                     "state": after, "step_indexes": {
                         str(old): new for old, new in moves.index_map(
                             run_spec, to, step_map).items()}, **extra})


def remap_loops(loops: dict[str, int], run_spec: WorkflowSpec, to: WorkflowSpec,
                step_map: dict[str, str]) -> dict[str, int]:
    """A run's repeat counters (keyed by step position) at their steps' new positions."""
    positions = moves.index_map(run_spec, to, step_map)
    return {str(positions[int(key)]): count for key, count in loops.items()
            if int(key) in positions}


def apply_pending(spec: WorkflowSpec, view: RunView, index: int | None, events: list[Event]
                  ) -> tuple[WorkflowSpec, RunView, int | None]:
    """Make the move recorded on the run of ``view`` (locked by this transaction), which is
    about to land on step ``index`` of ``spec``: return the definition, view and step it lands
    with instead, the ``run_migrated`` event added to ``events``; or, when the move cannot be
    made, the same ones, with a ``run_migration_failed`` (or ``_skipped``) event."""
    pending = view.migration or {}
    step_map = dict(pending.get("step_map") or {})
    unchanged = replace(view, migration=None)
    try:
        to = load_spec(pending["to"])
        if index is None:
            return _give_up(spec, unchanged, index, events, pending, "run_migration_skipped",
                            "The run completed before its next boundary; it was not moved.")
        target = moves.map_index(spec, to, index, step_map)
        if target is None:
            raise exceptions.InvalidMigration(
                f"Run {view.run_id} lands on {spec.steps[index].name!r}, which is not a step "
                f"of the new definition {to.definition_hash[:12]}; it was not moved.")
        state = view.state
        if pending.get("state"):
            run = WorkflowRun.objects.get(pk=view.run_id)  # locked by the caller
            state = new_state(pending["state"], view.state, run)
    except (exceptions.InvalidMigration, exceptions.WorkflowDefinitionError, ImportError,
            WorkflowDefinition.DoesNotExist) as error:
        return _give_up(spec, unchanged, index, events, pending, "run_migration_failed",
                        str(error))
    loops = remap_loops(view.loops, spec, to, step_map)
    switch(view.run_id, pending["to"], to, loops=loops)
    events.append(migrated_event(view.run_id, spec, to, step=index, target=target,
                                 before=view.state, after=state, step_map=step_map,
                                 by=pending.get("by", ""), at_boundary=True))
    logger.info("Run id=%s moved at its boundary onto definition %s.", view.run_id,
                to.definition_hash[:12])
    return to, replace(unchanged, state=state, loops=loops), target


def _give_up(spec: WorkflowSpec, view: RunView, index: int | None, events: list[Event],
             pending: dict[str, Any], kind: str, why: str
             ) -> tuple[WorkflowSpec, RunView, int | None]:
    WorkflowRun.objects.filter(pk=view.run_id).update(migration=None)
    to_pk = pending.get("to")
    events.append(Event(run_id=view.run_id, kind=kind, data={
        "by": pending.get("by", ""), "reason": why,
        "to_hash": None if to_pk is None else _hash_or_none(to_pk)}))
    logger.warning("Run id=%s was not moved at its boundary: %s", view.run_id, why)
    return spec, view, index


def _hash_or_none(definition_pk: int) -> str | None:
    try:
        return definition_hash(definition_pk)
    except WorkflowDefinition.DoesNotExist:
        return None


def _name(state_function: Any) -> str:
    if isinstance(state_function, str):
        return repr(state_function)
    return repr(getattr(state_function, "__qualname__", state_function))
