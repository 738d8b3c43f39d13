"""Steps and state functions of the deploy tests (tests/integration/test_run_migration.py);
the worker imports them by dotted path."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection

from queuety.models import WorkflowRun
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


def slow_then_fail(state: dict[str, Any]) -> dict[str, Any]:
    """Sleep ``state['sleep']`` seconds, then fail."""
    mark(f"{state['token']}-slow-fail")
    time.sleep(state["sleep"])
    raise ValueError("this attempt fails after its sleep")


def mutate_nested_then_raise(state: dict[str, Any], run: Any) -> dict[str, Any]:
    """Changes a nested value of the state it was given, then refuses the run."""
    state["profile"]["name"] = "CHANGED BY A FAILED STATE FUNCTION"
    raise ValueError("this run cannot be migrated")


def rename_nested(state: dict[str, Any], run: Any) -> dict[str, Any]:
    """Renames a nested key: profile.name -> profile.full_name."""
    state["profile"]["full_name"] = state["profile"].pop("name")
    return state


def write_then_raise(state: dict[str, Any], run: Any) -> dict[str, Any]:
    """Writes to the run's row, then refuses the run."""
    WorkflowRun.objects.filter(pk=run.pk).update(state={"overwritten": True})
    raise ValueError("refused after writing")


def db_error_for_two(state: dict[str, Any], run: Any) -> dict[str, Any]:
    """A database error (division by zero) for the run whose ``n`` is 2."""
    if state.get("n") == 2:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
    return {**state, "checked": True}
