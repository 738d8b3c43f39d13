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


def hop_a(state):
    """Counts its visits; from the second one it jumps over ``hop_b`` to ``hop_c``."""
    mark(f"{state['token']}-ledger", "hop_a")
    n = state.get("n", 0) + 1
    return {"n": n, **({"_next_step": "hop_c"} if n >= 2 else {})}


def hop_b(state):
    mark(f"{state['token']}-ledger", "hop_b")
    return {"b_seen": state.get("b_seen", 0) + 1}


def hop_c(state):
    """Jumps back to ``hop_a`` while ``loop`` is set and ``n`` is under 2."""
    mark(f"{state['token']}-ledger", "hop_c")
    again = state.get("loop") and state.get("n", 0) < 2
    return {"c_runs": state.get("c_runs", 0) + 1, **({"_next_step": "hop_a"} if again else {})}


def hop_d(state):
    """Fail until the state holds ``ok``."""
    mark(f"{state['token']}-ledger", "hop_d")
    if not state.get("ok"):
        raise queuety.PermanentError(f"not ok yet for token {state['token']}")
    return {"done": True}
