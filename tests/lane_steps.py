"""Step bodies for the I/O lane's tests (tests/integration/test_lane.py).

Each marks ``start`` and ``end`` with the time, so a test can measure overlap from recorded
times, and ``after`` when a body ends that should have been stopped.
"""

import asyncio
import time

from tests.workflows import mark


async def await_network(state):
    """An I/O-bound step: awaits ``state['body']`` seconds, as an LLM call would."""
    mark(f"{state['token']}-start", repr(time.time()))
    await asyncio.sleep(state["body"])
    mark(f"{state['token']}-end", repr(time.time()))
    return {"waited": state["body"]}


async def await_too_long(state):
    """Awaits far past its timeout; cancelled at the deadline, it never marks ``after``."""
    mark(f"{state['token']}-start", repr(time.time()))
    await asyncio.sleep(state["body"])
    mark(f"{state['token']}-after", repr(time.time()))
    return {"late": True}


def sync_uninterruptible(state):
    """A sync body the lane cannot interrupt: it runs on after its deadline and returns."""
    mark(f"{state['token']}-start", repr(time.time()))
    time.sleep(state["body"])
    mark(f"{state['token']}-after", repr(time.time()))
    return {"late": True}


def writes_after_its_deadline(state, context):
    """Writes an artifact at once and another after its deadline, from the thread the lane
    abandoned: the late write is refused (its error marked), never stored."""
    context.put_artifact("early", {"at": "start"})
    time.sleep(state["body"])
    try:
        context.put_artifact("late", {"at": "after the deadline"})
    except Exception as error:  # noqa: BLE001 - what the late write met is the test's answer
        mark(f"{state['token']}-refused", type(error).__name__)
    return {"late": True}


async def blocks_the_loop(state):
    """Blocks the event loop (time.sleep in async def): the lane reports it by name."""
    mark(f"{state['token']}-start", repr(time.time()))
    time.sleep(state["body"])
    return {"blocked": True}


def next_step(state):
    return {"next": True}


async def swallows_cancellation(state):
    """Catches its cancellation at the deadline and returns: a late result, never merged."""
    try:
        await asyncio.sleep(state["body"])
    except asyncio.CancelledError:
        return {"late": True}
    return {"on_time": True}
