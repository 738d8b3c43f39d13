"""Counting one transition of a run: the one copy every path that moves a run uses.

A transition merges what a step, a wait, a join or a timeout produced into the run's state,
counts it (transitions, cost units, started runs), prunes what ``prune_state_after`` drops, and
checks the run's budget. The landing planner (``queuety.core.landing``), the fan-out join and a
child run's end (``queuety.runtime.settle``), a wait's timeout (``queuety.runtime.expiry``) and
a step's outcome under the run's lock (``queuety.runtime.outcome``) all count theirs here.
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from queuety import exceptions
from queuety.core import budget as budgets
from queuety.core import engine, flow, pruning
from queuety.core.definition import WorkflowSpec


@dataclass(frozen=True, slots=True)
class Transition:
    """A run's state and counters after one counted transition."""

    state: dict[str, Any]
    """The public state, merged and pruned."""
    writes: dict[str, int] | None
    """``state_writes`` after it (``None`` for a workflow without ``prune_state_after``)."""
    usage: budgets.Usage
    pruned: list[str]
    """The keys the transition dropped (``prune_state_after``)."""
    breach: exceptions.BudgetExceeded | None = None
    """The budget the transition breaches, if any (see :meth:`checked`)."""

    @property
    def event_data(self) -> dict[str, Any]:
        """What the transition's timeline event adds: the pruned keys, or nothing."""
        return pruning.event_data(self.pruned)

    def checked(self) -> Transition:
        """Return this transition, or raise the budget it breaches."""
        if self.breach is not None:
            raise self.breach
        return self


def transition(spec: WorkflowSpec, run_id: int, state: dict[str, Any],
               writes: dict[str, int] | None, usage: budgets.Usage, output: dict[str, Any], *,
               cost: int = 0, started: int = 0, merged: dict[str, Any] | None = None,
               written: dict[str, Any] | None = None) -> Transition:
    """Count one transition of run ``run_id`` that merges ``output`` into ``state``.

    The counters go up by one transition, ``cost`` units and ``started`` runs; the public keys
    of ``output`` are merged (or ``merged`` is the new state, when the caller merged it
    itself, say with a jump); ``prune_state_after`` records the keys of ``output`` (or of
    ``written``) as written now and drops those due; then the budget is checked. A breach is
    returned in :attr:`Transition.breach`, not raised, since some callers fail the run at a
    wait with the event data already built: :meth:`Transition.checked` raises it.
    """
    usage = replace(usage, transitions=usage.transitions + 1,
                    cost_units=usage.cost_units + cost,
                    started_workflows=usage.started_workflows + started)
    new_state = {**state, **engine.public(output)} if merged is None else merged
    new_state, new_writes, pruned = pruning.apply(
        spec.prune_state_after, new_state, writes, output if written is None else written,
        usage.transitions)
    try:
        flow.check_budget(spec, run_id, new_state, usage)
        breach = None
    except exceptions.BudgetExceeded as error:
        breach = error
    return Transition(new_state, None if spec.prune_state_after is None else new_writes,
                      usage, pruned, breach)
