"""Steps of the cross-run event log's tests (tests/integration/test_event_log.py): the worker
imports them by dotted path."""

from __future__ import annotations


class LogBoom(Exception):
    """An error type no other test raises, so ``--error-type`` finds only these runs."""


def fine(state):
    return {"fine": True}


def fails(state):
    raise LogBoom(f"log boom for {state.get('token', '?')}")
