"""Steps of the reliability suite; worker subprocesses import them by dotted path.

Each execution appends one line to a per-run ledger file (``O_APPEND``: safe across processes,
and independent of the database and broker the faults hit): ``<step> <execution id> <pid>``.
Each step also returns its execution id, so a test can check that the output merged into the
run is that of exactly one real execution, however many executions the faults caused.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path

import queuety


def ledger_path(token: str) -> Path:
    folder = Path(os.environ["QUEUETY_TEST_DIR"]) / "ledger"
    folder.mkdir(exist_ok=True)
    return folder / token


def write_ledger(token: str, step: str) -> str:
    execution = uuid.uuid4().hex[:12]
    with open(ledger_path(token), "a") as handle:
        handle.write(f"{step} {execution} {os.getpid()}\n")
    return execution


def read_ledger(token: str) -> list[tuple[str, str, int]]:
    path = ledger_path(token)
    if not path.exists():
        return []
    return [(step, execution, int(pid)) for step, execution, pid in
            (line.split() for line in path.read_text().splitlines())]


def _work(state: dict, step: str) -> str:
    """Record the execution, then take a little time, so faults catch steps in flight."""
    execution = write_ledger(state["token"], step)
    time.sleep(random.uniform(*state.get("work", (0.02, 0.1))))
    return execution


def plan(state):
    return {"items": [0, 1, 2], "log": ["plan"], "exec_plan": _work(state, "plan")}


def work_item(state, item, index):
    return {"item": item, "exec": _work(state, f"item{index}")}


def charge(state):
    """Fails its first execution in each run with a retryable error (the retry policy's)."""
    first = not any(step == "charge" for step, _, _ in read_ledger(state["token"]))
    execution = _work(state, "charge")
    if first:
        raise ConnectionError(f"payment gateway unavailable for {state['token']}")
    return {"log": state["log"] + ["charge"], "exec_charge": execution}


def finish(state):
    return {"log": state["log"] + ["finish"], "exec_finish": _work(state, "finish")}


#: Generous: a step may lose a few attempts to killed workers on top of its one planned retry.
CHAOS_RETRY = queuety.RetryPolicy(max_attempts=10, initial_delay=0.2, backoff_factor=1.5,
                                  max_delay=2.0, jitter=0, retry_on=[ConnectionError])


def chaos_workflow():
    """Five steps: a plan, a fan-out of three items, a retried charge, a signal wait, a finish."""
    return (queuety.workflow("reliability_chaos")
            .retry(CHAOS_RETRY)
            .then(plan)
            .for_each("items", work_item, "worked", name="work_items")
            .then(charge)
            .wait_for_signal("go", result_key="go")
            .then(finish))


#: Memory a leaking step keeps for good (module level: it outlives the task).
_LEAKED: list[bytearray] = []


def leak(state):
    """Keep ``state['leak_mib']`` MiB for the rest of the process's life."""
    _LEAKED.append(bytearray(state["leak_mib"] * 2**20))
    write_ledger(state["token"], "leak")
    return {"leaked_by": os.getpid()}


def after_leak(state):
    write_ledger(state["token"], "after_leak")
    return {"after_leak_by": os.getpid()}


def hang(state):
    """Block for a minute; no timeout is set, so only the worker's hard limit stops it."""
    write_ledger(state["token"], "hang")
    time.sleep(60)
    return {"hung": True}


async def lane_fetch(state):
    """An async step of the I/O lane: records its execution, then awaits the "network"."""
    execution = write_ledger(state["token"], "fetch")
    await asyncio.sleep(random.uniform(*state.get("await", (0.2, 0.6))))
    return {"exec_fetch": execution}


def lane_parse(state):
    """A sync step of the I/O lane (run in a thread of the lane, under its timeout)."""
    return {"exec_parse": _work(state, "parse")}


def refuse(state):
    """Fails its run for good (the webhook test's runs: each sends ``run.failed``)."""
    write_ledger(state["token"], "refuse")
    raise queuety.PermanentError(f"refused for {state['token']}")
