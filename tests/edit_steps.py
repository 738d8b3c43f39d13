"""Steps of the edit-and-rerun tests (tests/integration/test_edit_and_rerun.py); the worker
imports them by dotted path. Each marks a ledger line per execution (tests.workflows.mark)."""

import time

import queuety
from tests.workflows import mark


def fetch(state):
    mark(f"{state['token']}-ledger", "fetch")
    return {"fetched": state.get("fetched", 0) + 1, "log": [*state.get("log", []), "fetch"]}


def price(state):
    mark(f"{state['token']}-ledger", "price")
    return {"price": 10 * state["fetched"], "price_runs": state.get("price_runs", 0) + 1,
            "log": [*state.get("log", []), "price"]}


def charge(state):
    """Fail until the state holds a ``card`` (what an operator's edit gives it)."""
    mark(f"{state['token']}-ledger", "charge")
    if "card" not in state:
        raise queuety.PermanentError(f"no card on file for token {state['token']}")
    return {"charged": f"{state['price']} on {state['card']}",
            "log": [*state.get("log", []), "charge"]}


def nap(state):
    mark(f"{state['token']}-ledger", "nap")
    time.sleep(state.get("sleep", 0))
    return {"napped": True}
