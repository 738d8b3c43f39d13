"""Step bodies for the timeout tests: ADK's seven shapes, a busy loop, and two that resist.

Each marks ``start`` (with the time) when it begins and ``after`` if its body ever ends, so a
test can prove an interrupted body never finished. Bodies last ``state['body']`` seconds.
"""

import asyncio
import signal
import time

from tests.workflows import mark


def _start(state):
    mark(f"{state['token']}-start", repr(time.time()))


def _after(state):
    mark(f"{state['token']}-after", repr(time.time()))


def sync_block(state):
    _start(state)
    time.sleep(state["body"])
    _after(state)
    return {"finished": True}


def busy_loop(state):
    _start(state)
    end = time.monotonic() + state["body"]
    spins = 0
    while time.monotonic() < end:
        spins += 1
    _after(state)
    return {"spins": spins}


async def async_wait(state):
    _start(state)
    await asyncio.sleep(state["body"])
    _after(state)
    return {"finished": True}


def _sleep_then_mark(state):
    time.sleep(state["body"])
    _after(state)


async def async_thread(state):
    _start(state)
    await asyncio.to_thread(_sleep_then_mark, state)
    return {"finished": True}


async def async_block(state):
    _start(state)
    time.sleep(state["body"])
    _after(state)
    return {"finished": True}


async def block_then_await(state):
    _start(state)
    time.sleep(state["body"])
    await asyncio.sleep(0)
    _after(state)
    return {"finished": True}


async def block_then_noop(state):
    _start(state)
    time.sleep(state["body"])
    _after(state)
    return {"finished": True}


def block_no_output(state):
    _start(state)
    time.sleep(state["body"])
    _after(state)


def swallows_timeout(state):
    """Catches the interruption and carries on: only the hard limit can stop it."""
    _start(state)
    try:
        time.sleep(state["body"])
    except BaseException:  # noqa: BLE001 - the misbehaviour under test
        time.sleep(state["body"])
    _after(state)


def signals_blocked(state):
    """Blocks SIGALRM, as C code that masks signals would: only the hard limit can stop it."""
    _start(state)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(state["body"])
    _after(state)


VARIANTS = ["sync_block", "async_wait", "async_thread", "async_block", "block_then_await",
            "block_then_noop", "block_no_output", "busy_loop"]
