"""Which next step may run inline in a task (queuety.core.inline), and the hard limit a timed
step's message carries so that timed steps after it can."""

from __future__ import annotations

import pytest
from django.test import override_settings

from queuety import publish
from queuety.core.inline import InlineWindow

NOW = 100.0


def prefork(killed_at=None, until=NOW + 1.0):
    return InlineWindow(until, killed_at, grace=1.0, slack=1.0)


@pytest.mark.parametrize("window, timeout, admitted", [
    # A task without a limit of its own: untimed steps only.
    (prefork(), None, True),
    (prefork(), 30.0, False),
    # A task killed at NOW + 32 (a timeout=30 step's message, started at NOW): a next step
    # with timeout=30 has its own hard limit at NOW + 31, within 1 s of the task's.
    (prefork(killed_at=NOW + 32), 30.0, True),
    (prefork(killed_at=NOW + 32), 30.5, True),
    (prefork(killed_at=NOW + 32), 31.5, False),  # the task's limit would cut it short
    (prefork(killed_at=NOW + 32), 29.5, False),  # a stuck step would outlive its limit by 1.5 s
    (prefork(killed_at=NOW + 32), None, False),  # an untimed step would be killed at 32 s
    # The window closes: nothing starts inline after ``until``.
    (prefork(until=NOW), None, False),
    (prefork(killed_at=NOW + 32, until=NOW - 0.1), 30.0, False),
    # The I/O lane enforces its deadlines itself: any step, until the window closes.
    (InlineWindow(NOW + 1, own_deadlines=True), 5.0, True),
    (InlineWindow(NOW + 1, own_deadlines=True), None, True),
    (InlineWindow(NOW, own_deadlines=True), None, False),
])
def test_inline_window__admits(window, timeout, admitted):
    assert window.admits(timeout, NOW) is admitted


def test_inline_window__a_chain_of_equal_timeouts_fits_within_inline_seconds():
    killed_at = NOW + publish_limit(30.0)
    window = prefork(killed_at=killed_at)
    assert [window.admits(30.0, NOW + elapsed) for elapsed in (0.0, 0.5, 0.99)] == [True] * 3
    assert window.admits(30.0, NOW + 1.0) is False  # INLINE_SECONDS passed


def publish_limit(timeout):
    with override_settings(QUEUETY={"INLINE_STEPS": 10, "INLINE_SECONDS": 1.0,
                                    "HARD_TIMEOUT_GRACE": 1.0}):
        return publish.hard_limit(timeout)


def test_hard_limit__includes_inline_seconds_only_while_steps_run_inline():
    assert publish_limit(30.0) == 32.0
    with override_settings(QUEUETY={"INLINE_STEPS": 1, "HARD_TIMEOUT_GRACE": 2.0}):
        assert publish.hard_limit(30.0) == 32.0
    with override_settings(QUEUETY={"INLINE_SECONDS": 0.25, "HARD_TIMEOUT_GRACE": 2.0}):
        assert publish.hard_limit(5.0) == 7.25
