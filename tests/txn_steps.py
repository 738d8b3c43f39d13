"""Step handlers of the exactly-once ORM steps' tests (transactional=True), importable by the
worker: each writes a ``Counter`` row of the test app with the ORM."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection, transaction
from django.db.models import F

import queuety
from tests.testapp.models import Counter


def _bump(name: str) -> int:
    Counter.objects.filter(name=name).update(value=F("value") + 1)
    return Counter.objects.values_list("value", flat=True).get(name=name)


def bump(state: dict[str, Any]) -> dict[str, Any]:
    """Add one to the run's counter; the output is the value seen."""
    return {"seen": _bump(state["counter"])}


def bump_slowly(state: dict[str, Any]) -> dict[str, Any]:
    """Add one, then linger with the write uncommitted (a SIGKILL lands there)."""
    seen = _bump(state["counter"])
    time.sleep(state.get("linger", 0.02))
    return {"seen": seen}


def bump_plain(state: dict[str, Any]) -> dict[str, Any]:
    """The plain step's way: its own transaction, committed before the transition."""
    with transaction.atomic():
        return {"seen": _bump(state["counter"])}


def bump_then_fail_first(state: dict[str, Any], context: queuety.StepContext) -> dict[str, Any]:
    """Write, then raise on the first attempt (the write must roll back with it)."""
    seen = _bump(state["counter"])
    if context.attempt == 1:
        raise RuntimeError(f"attempt 1 fails after writing (saw {seen})")
    return {"seen": seen}


def bump_then_serialization_failure_first(state: dict[str, Any],
                                          context: queuety.StepContext) -> dict[str, Any]:
    """Write, then have PostgreSQL raise a serialization failure (SQLSTATE 40001) on the
    first attempt, as a conflicting concurrent transaction would."""
    seen = _bump(state["counter"])
    if context.attempt == 1:
        with connection.cursor() as cursor:
            cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' "
                           "USING ERRCODE = '40001'; END $$")
    return {"seen": seen}


def bump_then_sleep_in_db_first(state: dict[str, Any],
                                context: queuety.StepContext) -> dict[str, Any]:
    """Write, then on the first attempt sleep 5 s in one statement (past a 1 s timeout)."""
    seen = _bump(state["counter"])
    if context.attempt == 1:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(5)")
    return {"seen": seen}


class Bump(queuety.Step):
    """The class form: ``transactional = True`` as a class attribute."""

    transactional = True

    def handle(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"seen": _bump(state["counter"])}
