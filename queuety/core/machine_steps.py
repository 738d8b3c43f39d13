"""The steps a state machine compiles to (``queuety.core.machine``): its transitions.

``transition`` runs as the route step ``S.route`` (after ``S.wait`` took an event) and as
``S.timeout`` (when the state's timeout fired). It reads the machine's table from the run's
definition, tries the event's transitions in order (a guard is a pure function of the
machine's data and the event's payload), runs the state's exit action and the transition's
action, and returns the new state's bookkeeping with their outputs, routed to the target
state's entry: so the state change and the actions' outputs are merged in one step boundary,
exactly once, however many attempts the actions needed. When no guard allows the event the
machine stays where it was and waits again (the event is consumed).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from queuety import exceptions
from queuety.core.engine import Route, public
from queuety.core.handlers import StepContext, call_handler
from queuety.core.imports import import_path
from queuety.core.machine import (
    EVENT_KEY,
    HISTORY_KEPT,
    MACHINE_KEY,
    TIMEOUT_EVENT,
    entry_step,
)


def bookkeeping(state: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """The machine's bookkeeping in a run's state (the initial state's when absent: a run
    started without ``MachineBuilder.start()``, by name through the registry)."""
    found = state.get(MACHINE_KEY)
    if isinstance(found, dict) and isinstance(found.get("state"), str):
        return found
    return {"state": table["initial"], "history": [], "transitions": 0}


def machine_data(state: dict[str, Any]) -> dict[str, Any]:
    """The machine's own data: the run's state without the machine's keys."""
    return {k: v for k, v in state.items() if k not in (MACHINE_KEY, EVENT_KEY)}


def transition(state: dict[str, Any], context: StepContext) -> Route:
    """Take the transition the event (or the timeout) of the current state calls for."""
    table = _table(context)
    name, _, kind = context.step_name.rpartition(".")
    spec = table["states"][name]
    if kind == "timeout":
        event, payload = TIMEOUT_EVENT, None
    else:
        event, payload = _event(state, spec, context)
    data = machine_data(state)
    chosen = next((t for t in spec["transitions"]
                   if t["event"] == event and _allows(t["guard"], data, payload)), None)
    if chosen is None:
        return Route(f"{name}.wait")
    # An event's payload cannot overwrite the machine's bookkeeping keys; the actions see
    # this event (not the one that led into the state) under queuety_machine.event.
    book = bookkeeping(state, table)
    current = {"name": event, "data": payload}
    merged = {**state, **(machine_data(public(payload)) if isinstance(payload, dict) else {}),
              MACHINE_KEY: {**book, "event": current}}
    outputs: dict[str, Any] = {}
    for path in (spec["on_exit"], chosen["action"]):
        if path is not None:
            outputs.update(_output(path, {**merged, **outputs}, context))
    book = advanced(book, {"from": name, "to": chosen["to"], "event": event,
                           "at": datetime.now(UTC).isoformat()}, current)
    changed = {k: v for k, v in merged.items()
               if k != MACHINE_KEY and (k not in state or state[k] != v)}
    return Route(entry_step(table, chosen["to"]),
                 output={**public(changed), **outputs, MACHINE_KEY: book})


def advanced(book: dict[str, Any], entry: dict[str, Any],
             event: dict[str, Any]) -> dict[str, Any]:
    """The bookkeeping after the transition ``entry``: the new state, the newest
    ``HISTORY_KEPT`` transitions (so a long session's state stays bounded) and their count."""
    history = [*book.get("history", []), entry]
    count = int(book.get("transitions", len(history) - 1)) + 1
    return {"state": entry["to"], "history": history[-HISTORY_KEPT:], "transitions": count,
            "event": event}


def end(state: dict[str, Any]) -> None:
    """The last step: a final state was entered; the run completes."""


def _table(context: StepContext) -> dict[str, Any]:
    definition = context.definition
    table = None if definition is None else getattr(definition, "machine", None)
    if not isinstance(table, dict):
        raise exceptions.WorkflowDefinitionError(
            f"Step {context.step_name!r} of run {context.run_id} is a state machine's "
            "transition, but the run's definition has no machine table; it runs only in "
            "a definition built by queuety.machine().")
    return table


def _event(state: dict[str, Any], spec: dict[str, Any],
           context: StepContext) -> tuple[str, Any]:
    """The event the state's wait took: its name and payload."""
    events = sorted({t["event"] for t in spec["transitions"]} - {TIMEOUT_EVENT})
    taken = state.get(EVENT_KEY)
    if len(events) == 1:
        return events[0], taken  # a wait for one name stores the payload itself
    if isinstance(taken, dict) and len(taken) == 1:
        ((event, payload),) = taken.items()
        return event, payload
    raise exceptions.InvalidStepOutput(
        f"Step {context.step_name!r} of run {context.run_id} found {taken!r:.200} under "
        f"{EVENT_KEY!r}, where the state's wait stores the event it took; expected a dict of "
        "one event name and its payload. Do not write that key from an action.")


def _allows(guard: str | None, data: dict[str, Any], payload: Any) -> bool:
    return guard is None or bool(import_path(guard)(data, payload))


def _output(path: str, state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Run an exit or transition action; its output (a dict or None), public keys only."""
    returned = call_handler(path, state, context)
    if returned is None:
        return {}
    if not isinstance(returned, dict):
        raise exceptions.InvalidStepOutput(
            f"The action {path!r} of run {context.run_id} (step {context.step_name!r}) "
            f"returned {type(returned).__name__}; an action returns a dict or None.")
    return public(returned)
