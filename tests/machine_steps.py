"""Guards and actions of the state machine tests (module level, so workers import them)."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

import queuety
from tests.testapp.models import Counter

#: How many messages one active session answers before the guard refuses more.
LIMIT = 3


def under_limit(state: dict[str, Any], payload: Any) -> bool:
    """Guard: the session has answered fewer than LIMIT messages."""
    return int(state.get("replies", 0)) < LIMIT


def greet(state: dict[str, Any]) -> dict[str, Any]:
    """Entry action of ``active``: count the entries."""
    return {"entered_active": int(state.get("entered_active", 0)) + 1}


def reply(state: dict[str, Any]) -> dict[str, Any]:
    """Transition action: answer the message (the payload's ``text`` is merged already)."""
    return {"replies": int(state.get("replies", 0)) + 1,
            "last_reply": f"re: {state.get('text')}"}


def reply_flaky(state: dict[str, Any], context: queuety.StepContext) -> dict[str, Any]:
    """Transition action that fails its first attempt (after a counted side effect)."""
    _bump(state)
    if context.attempt == 1:
        raise ConnectionError("The model provider dropped the connection.")
    return reply(state)


def reply_killed(state: dict[str, Any], context: queuety.StepContext) -> dict[str, Any]:
    """Transition action whose first attempt SIGKILLs its own pool process mid-action."""
    _bump(state)
    if context.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return reply(state)


def leave(state: dict[str, Any]) -> dict[str, Any]:
    """Exit action of ``active``."""
    return {"exits": int(state.get("exits", 0)) + 1}


def slow_enter(state: dict[str, Any]) -> dict[str, Any]:
    """An entry action that takes a while, so an event can arrive while it runs."""
    time.sleep(1.0)
    return {"entered": int(state.get("entered", 0)) + 1}


def seen_event(state: dict[str, Any]) -> dict[str, Any]:
    """Transition action: record the event the machine's bookkeeping shows it."""
    return {"seen": state["queuety_machine"]["event"]}


def streaming_exit(state: dict[str, Any]) -> Any:
    """A generator: refused as an exit action (it cannot stream inside the route step)."""
    yield "chunk"


class RetriedAction(queuety.Step):
    """A Step class with its own retry: refused as a transition action."""

    retry = queuety.RetryPolicy(max_attempts=5)

    def handle(self, state: dict[str, Any]) -> dict[str, Any]:
        return {}


def _bump(state: dict[str, Any]) -> None:
    counter = Counter.objects.get(name=state["counter"])
    counter.value += 1
    counter.save(update_fields=["value"])


def session(name: str = "session", *, action: Any = reply,
            timeout: timedelta = timedelta(minutes=5)) -> queuety.MachineBuilder:
    """The session machine the tests run."""
    return (queuety.machine(name)
            .version("session.v1")
            .retry(queuety.RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1))
            .state("idle")
            .on("message", to="active", action=action)
            .on("close", to="closed")
            .state("active", on_enter=greet, on_exit=leave, timeout=timeout,
                   retry=queuety.RetryPolicy(max_attempts=2, initial_delay=0.05, max_delay=0.1))
            .on("message", to="active", guard=under_limit, action=action)
            .on("close", to="closed")
            .on("timeout", to="idle")
            .final("closed"))
