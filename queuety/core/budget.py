"""Workflow budgets: limits set on the builder, usage counted by the engine, and the check.

Pure Python. A breach raises :class:`~queuety.BudgetExceeded`, which fails the run at once
(never retried) and leaves its state as it was before the breaching step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from queuety import exceptions

#: The budgets, in the order they are checked and reported.
BUDGETS = ("max_transitions", "max_for_each_items", "max_state_bytes", "max_cost_units",
           "max_started_workflows", "max_step_attempts")

#: Which usage counter each budget limits.
COUNTER_OF = {
    "max_transitions": "transitions",
    "max_state_bytes": "public_state_bytes",
    "max_cost_units": "cost_units",
    "max_started_workflows": "started_workflows",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The limits of a workflow; ``None`` means unlimited."""

    max_transitions: int | None = None
    """Completed step boundaries (a ``_next_step`` jump is one)."""
    max_for_each_items: int | None = None
    """Items one ``for_each`` step may fan out to."""
    max_state_bytes: int | None = None
    """Length of the compact UTF-8 JSON of the public state."""
    max_cost_units: int | None = None
    """Sum of the ``cost_units`` of completed steps."""
    max_started_workflows: int | None = None
    """Child workflows started by ``start_workflows``."""
    max_step_attempts: int | None = None
    """Step attempts in all (retries included) of this run and of the child runs that
    ``run_workflow`` steps start, restarts included. Checked before each further attempt."""

    def __post_init__(self) -> None:
        for name in BUDGETS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise exceptions.WorkflowDefinitionError(
                    f"Workflow {name} must be a whole number of at least 1 (got {value!r})."
                )

    def configured(self) -> dict[str, int]:
        """Return the limits that are set, in check order."""
        return {name: getattr(self, name) for name in BUDGETS if getattr(self, name) is not None}

    def to_dict(self) -> dict[str, int | None]:
        """Return the JSON form (every budget, ``None`` when unset; ``max_step_attempts``
        only when set, so definitions from before it keep their hash)."""
        return {name: getattr(self, name) for name in BUDGETS
                if name != "max_step_attempts" or self.max_step_attempts is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Budget:
        """Rebuild from :meth:`to_dict` output."""
        return cls(**{key: value for key, value in (data or {}).items() if key in BUDGETS})


@dataclass(frozen=True, slots=True)
class Usage:
    """How much of its budget a run has used."""

    transitions: int = 0
    cost_units: int = 0
    started_workflows: int = 0
    public_state_bytes: int = 0


def state_bytes(state: dict[str, Any]) -> int:
    """Return the size that ``max_state_bytes`` limits: compact UTF-8 JSON of the public state."""
    return len(json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def check(budget: Budget, usage: Usage, run_id: int | None, workflow: str) -> None:
    """Raise :class:`BudgetExceeded` for the first budget that ``usage`` exceeds."""
    for name, counter in COUNTER_OF.items():
        limit = getattr(budget, name)
        used = getattr(usage, counter)
        if limit is not None and used > limit:
            raise exceptions.BudgetExceeded(name, limit, used, run_id, workflow)


def summary(budget: Budget, usage: Usage) -> dict[str, int] | None:
    """Return the ``budget`` field of a status: set limits, then usage; ``None`` if none set."""
    limits = budget.configured()
    if not limits:
        return None
    return {**limits, **{f.name: getattr(usage, f.name) for f in fields(Usage)}}


class BudgetView:
    """What step code sees of its run's budget (``self.context.budget``)."""

    def __init__(self, budget: Budget, usage: Usage) -> None:
        self.limits = budget.configured()
        self.usage = usage

    def remaining(self, name: str) -> int | None:
        """Return how much of budget ``name`` is left before this step, ``None`` if unlimited.

        Raises:
            KeyError: ``name`` is not a budget that counts usage.
        """
        if name not in COUNTER_OF:
            raise KeyError(f"{name!r} is not a budget with a counter; use one of "
                           f"{', '.join(COUNTER_OF)}.")
        limit = self.limits.get(name)
        return None if limit is None else limit - getattr(self.usage, COUNTER_OF[name])

    def __repr__(self) -> str:
        return f"<BudgetView limits={self.limits} usage={self.usage}>"
