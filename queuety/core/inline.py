"""When a run's next step may run inline: in the process that ran the step before it, with no
message and no claim of its own (``queuety.runtime.attempt``).

Pure rules, so that they can be read and tested apart from the worker that applies them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InlineWindow:
    """What lets a next step run inline in this task: a time window, and how its deadline
    would be enforced.

    A step's deadline is enforced inside the process (a timer interrupts the body), and on the
    prefork pool a *hard limit* kills a process stuck where the timer cannot reach (C code).
    Celery's hard limit covers a whole task, so a timed step may run inline only when the
    task's own limit serves as that step's hard limit: it must not come before the step's
    deadline plus ``grace`` (it would cut the step short) nor more than ``slack`` after it
    (the stuck process would live too long). An untimed step needs a task without a limit of
    its own. On the I/O lane (``own_deadlines``) every deadline is enforced by the lane itself,
    and no process is killed, so any step may follow.
    """

    until: float
    """No step starts inline after this moment (``time.monotonic()``)."""
    killed_at: float | None = None
    """When the task's own hard time limit kills this process; None when it has none."""
    grace: float = 1.0
    """``QUEUETY["HARD_TIMEOUT_GRACE"]``: a step's hard limit comes this long after its
    deadline."""
    slack: float = 1.0
    """How much later than a step's own hard limit the task's may come."""
    own_deadlines: bool = False
    """The lane: deadlines are enforced in-process and no hard limit exists."""

    def admits(self, timeout: float | None, now: float) -> bool:
        """Whether a step with ``timeout`` (None: untimed) may start inline at ``now``."""
        if now >= self.until:
            return False
        if self.own_deadlines:
            return True
        if self.killed_at is None:
            return timeout is None
        if timeout is None:
            return False
        own_limit = now + timeout + self.grace
        return own_limit <= self.killed_at <= own_limit + self.slack
