"""Reading state machine runs: ``queuety.machine_status(run_id)`` and the machine runs list.

A machine run is a workflow run whose definition carries a machine table
(``queuety.core.machine``); its current state, the transitions so far and the machine's data
are read from the run's state. The CLI, the REST API and the admin show what this returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from queuety import exceptions
from queuety.core.machine_steps import bookkeeping, machine_data
from queuety.models import WorkflowDefinition, WorkflowRun
from queuety.store import rows
from queuety.store.definitions import load_spec


@dataclass(frozen=True, slots=True)
class MachineStatus:
    """A snapshot of one state machine run."""

    run_id: int
    machine: str
    state: str
    """The current state's name."""
    status: str
    """The run's status (``waiting_for_signal`` while a state waits for events)."""
    final: bool
    """Whether the current state is final (the run then completes)."""
    events: tuple[str, ...]
    """The events the current state has transitions for (``timeout`` included when it has
    a timeout)."""
    history: tuple[dict[str, Any], ...]
    """The newest transitions, oldest first: ``{"from", "to", "event", "at"}``; the run's
    state keeps the last ``HISTORY_KEPT`` (50) of them (the run's timeline has every route
    step)."""
    transitions: int
    """How many transitions the machine has taken (``len(history)`` until it passes 50)."""
    data: dict[str, Any]
    """The machine's data: the run's state without the machine's bookkeeping keys."""
    definition_hash: str
    definition_version: str | None
    updated_at: datetime

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape the API, the CLI and the admin show."""
        return {"run_id": self.run_id, "machine": self.machine, "state": self.state,
                "status": self.status, "final": self.final, "events": list(self.events),
                "history": list(self.history), "transitions": self.transitions,
                "data": self.data,
                "definition_hash": self.definition_hash,
                "definition_version": self.definition_version,
                "updated_at": self.updated_at.isoformat()}


def machine_status(run_id: int) -> MachineStatus:
    """Return the :class:`MachineStatus` of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
        NotAMachine: the run is not a state machine's.
    """
    status = status_of(rows.get_run(run_id))
    if status is None:
        raise exceptions.NotAMachine(
            f"Run {run_id} is not a state machine's run (its workflow was not built with "
            "queuety.machine()); use queuety.workflow_status().")
    return status


def machine_or_none(run_id: int) -> MachineStatus | None:
    """The :class:`MachineStatus` of run ``run_id``, or None when it is not a machine's.

    Raises:
        RunNotFound: no run has that id.
    """
    return status_of(rows.get_run(run_id))


def status_of(run: WorkflowRun) -> MachineStatus | None:
    """The :class:`MachineStatus` of a run row, or None when it is not a machine's."""
    try:
        spec = load_spec(run.definition_id)
    except exceptions.WorkflowDefinitionError:
        return None
    table = spec.machine
    if table is None:
        return None
    book = bookkeeping(run.state, table)
    history = book.get("history", [])
    current = table["states"].get(book["state"], {"final": False, "transitions": []})
    events = sorted({t["event"] for t in current["transitions"]})
    return MachineStatus(
        run_id=run.pk, machine=run.name, state=book["state"], status=run.status,
        final=bool(current["final"]), events=tuple(events),
        history=tuple(history), transitions=int(book.get("transitions", len(history))),
        data=machine_data(run.state),
        definition_hash=spec.definition_hash, definition_version=spec.version,
        updated_at=run.updated_at)


def machine_runs(among: QuerySet[WorkflowRun] | None = None, *, name: str | None = None,
                 limit: int = 50) -> list[MachineStatus]:
    """The newest machine runs first (of ``among`` when given: a user's scope), of the
    machine ``name`` when given.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1 (got {limit}).")
    definitions = WorkflowDefinition.objects.filter(definition__has_key="machine")
    runs = (WorkflowRun.objects.all() if among is None else among).filter(
        definition__in=definitions)
    if name is not None:
        runs = runs.filter(name=name)
    found = (status_of(run) for run in runs.order_by("-pk")[:limit])
    return [status for status in found if status is not None]

