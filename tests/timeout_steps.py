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


# -- bodies that handle the interruption themselves (issue: a timeout cannot be swallowed) ---

def returns_after_catching_exception(state):
    """The usual "log it and carry on": catches everything, returns an output."""
    _start(state)
    try:
        time.sleep(state["body"])
    except Exception:  # noqa: BLE001 - the behaviour under test
        return {"late": "caught Exception"}
    return {"late": "never interrupted"}


def returns_after_catching_timeout_error(state):
    """The usual socket-timeout handler (``socket.timeout`` is ``TimeoutError``)."""
    _start(state)
    try:
        time.sleep(state["body"])
    except TimeoutError:
        return {"late": "caught TimeoutError"}
    return {"late": "never interrupted"}


def raises_another_error_after_catching(state):
    """Turns the interruption into an error of its own."""
    _start(state)
    try:
        time.sleep(state["body"])
    except Exception as error:  # noqa: BLE001 - the behaviour under test
        raise ValueError("the body's own error after the deadline") from error


def catches_its_own_timeout_error_early(state):
    """Catches a TimeoutError of its own well before the deadline: not the engine's business."""
    _start(state)
    try:
        raise TimeoutError("a socket read of the body's own gave up")
    except TimeoutError:
        pass
    return {"own_timeout_handled": True}


def item_returns_after_catching(state, item, index):
    """A for_each item handler that swallows its interruption."""
    try:
        time.sleep(state["body"])
    except Exception:  # noqa: BLE001 - the behaviour under test
        return {"late": item}
    return {"late": "never interrupted"}


SWALLOWING = {"returns_after_catching_exception": {"output": {"late": "caught Exception"}},
              "returns_after_catching_timeout_error": {
                  "output": {"late": "caught TimeoutError"}},
              "raises_another_error_after_catching": {"error": {
                  "type": "ValueError", "message": "the body's own error after the deadline"}}}


# -- Step classes whose own timeout must hold wherever they run -----------------------------

import queuety  # noqa: E402 - kept beside the classes that need it


class SlowWithOwnTimeout(queuety.Step):
    """Declares timeout = 0.3 and takes a second: a timeout wherever it runs."""

    timeout = 0.3

    def handle(self, state):
        _start(state)
        time.sleep(1)
        _after(state)
        return {"slow": "finished"}

    def handle_item(self, state, item, index):
        _start(state)
        time.sleep(1)
        _after(state)
        return {"item": item}


def quick_branch(state):
    return {"quick": True}


def half_second(state):
    """Takes half a second: within no timeout below it."""
    _start(state)
    time.sleep(0.5)
    _after(state)
    return {"half_second": True}
