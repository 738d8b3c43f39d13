"""Steps for the tests of progress heartbeats and prune_state_after (importable by workers)."""

from __future__ import annotations

import time

from tests import workflows


def report_progress(state, context):
    """Report ``total`` progress beats in a tight loop, then hold until the test releases it."""
    total = state["total"]
    started = time.perf_counter()
    for done in range(1, total + 1):
        context.heartbeat(progress={"done": done, "total": total, "stage": "embedding"})
    per_call_us = (time.perf_counter() - started) / total * 1e6
    deadline = time.monotonic() + 60
    while not workflows.marks(f"{state['token']}-release") and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"reported": total, "per_call_us": round(per_call_us, 2)}


def bad_progress(state, context):
    """Report progress that is not JSON; say what the step saw."""
    try:
        context.heartbeat(progress={"when": object()})
    except Exception as error:  # noqa: BLE001 - the test checks which error it was
        return {"refused": type(error).__name__, "message": str(error)}
    return {"refused": None}


def p_one(state):
    return {"one": 1}


def p_two(state):
    return {"two": 2}


def p_three(state):
    return {"three": 3, "one": "again"}


def p_four(state):
    return {"four": 4}


def p_five(state):
    return {"five": 5}


def big_chunk(state):
    """Write a 400-byte chunk under a new key each round, eight rounds."""
    n = state.get("n", 0)
    return {"n": n + 1, f"chunk{n}": "x" * 400,
            **({"_next_step": "big_chunk"} if n + 1 < 8 else {})}
