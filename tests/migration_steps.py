"""Steps and state functions of the deploy tests (tests/integration/test_run_migration.py);
the worker imports them by dotted path."""

from __future__ import annotations

from typing import Any

from tests.workflows import mark


def greet(state: dict[str, Any]) -> dict[str, Any]:
    """Version 2's step: it needs ``customer_name``, which version 1's runs call ``customer``."""
    mark(f"{state['token']}-greet")
    return {"greeting": f"Hello {state['customer_name']}"}


def audit(state: dict[str, Any]) -> dict[str, Any]:
    """A step only version 2 has."""
    mark(f"{state['token']}-audit")
    return {"audited": True}


def rename_customer(state: dict[str, Any], run: Any) -> dict[str, Any]:
    """The state function of version 1 -> 2: ``customer`` is now ``customer_name``."""
    state["customer_name"] = state.pop("customer")
    state["migrated_run"] = run.pk
    return state


def refuse_two(state: dict[str, Any], run: Any) -> dict[str, Any]:
    """A state function that cannot migrate one run (``n == 2``)."""
    if state.get("n") == 2:
        raise ValueError(f"run {run.pk} has n=2, which version 2 cannot take")
    return {**state, "n_checked": True}


def returns_junk(state: dict[str, Any], run: Any) -> Any:
    """A state function that returns no state."""
    return ["not", "a", "dict"]
