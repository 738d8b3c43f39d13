"""Retry policies: attempts, back-off, bounded jitter and exception scoping.

Pure Python. A policy is a frozen value; the engine asks it two questions after a failed attempt:
``should_retry(error, attempt)`` and ``delay(attempt)``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from queuety import exceptions
from queuety.core.imports import dotted_path, import_path

#: The largest jitter fraction a policy accepts. A wait never exceeds its nominal value by more
#: than ``jitter`` (at most 25 %), unlike engines whose default doubles a wait.
MAX_JITTER = 0.25


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how soon a failed step is tried again.

    Args:
        max_attempts: attempts in all, the first included; ``1`` means no retry.
        initial_delay: seconds before attempt 2.
        backoff_factor: each later wait is this many times the previous one (>= 1).
        max_delay: cap on any single wait, in seconds.
        jitter: fraction in ``[0, 0.25]``; attempt ``n`` waits a uniform time in
            ``[w - h, w + h]`` where ``w`` is the nominal wait and ``h = min(jitter * w,
            max_delay - w)``, so a wait is never longer than ``(1 + jitter) * w`` nor than
            ``max_delay``, and the mean is exactly ``w``.
        retry_on: exception classes (or dotted paths to them) that are retried, matched with
            ``isinstance``. ``None`` retries every :class:`Exception` except those that can never
            succeed on retry (:class:`~queuety.PermanentError`, definition errors) and
            :class:`~queuety.StepTimeout`, which is retried only when named here (or a base class
            of it, such as ``TimeoutError``). Worker losses are always retried while attempts are
            left.
    """

    max_attempts: int = 3
    initial_delay: float = 1.0
    backoff_factor: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] | None = field(default=None)

    def __init__(
        self,
        max_attempts: int = 3,
        initial_delay: float = 1.0,
        backoff_factor: float = 2.0,
        max_delay: float = 60.0,
        jitter: float = 0.1,
        retry_on: Iterable[type[BaseException] | str] | None = None,
    ) -> None:
        problems = []
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            problems.append(f"max_attempts must be an integer of at least 1 (got {max_attempts!r})")
        if initial_delay < 0:
            problems.append(f"initial_delay must be 0 or more seconds (got {initial_delay!r})")
        if backoff_factor < 1:
            problems.append(f"backoff_factor must be at least 1 (got {backoff_factor!r})")
        if max_delay < initial_delay:
            problems.append(
                f"max_delay ({max_delay!r}) must not be less than initial_delay ({initial_delay!r})"
            )
        if not 0 <= jitter <= MAX_JITTER:
            problems.append(f"jitter must be between 0 and {MAX_JITTER} (got {jitter!r})")
        if problems:
            raise exceptions.WorkflowDefinitionError(
                "Invalid RetryPolicy: " + "; ".join(problems) + "."
            )
        classes = None if retry_on is None else tuple(_exception_class(c) for c in retry_on)
        set_ = object.__setattr__
        set_(self, "max_attempts", max_attempts)
        set_(self, "initial_delay", float(initial_delay))
        set_(self, "backoff_factor", float(backoff_factor))
        set_(self, "max_delay", float(max_delay))
        set_(self, "jitter", float(jitter))
        set_(self, "retry_on", classes)

    # -- questions the engine asks ---------------------------------------------------------

    def nominal_delay(self, attempt: int) -> float:
        """Return the wait before attempt ``attempt + 1``, without jitter (``attempt`` >= 1)."""
        return min(self.initial_delay * self.backoff_factor ** (attempt - 1), self.max_delay)

    def delay_bounds(self, attempt: int) -> tuple[float, float]:
        """Return the shortest and longest wait jitter may give after attempt ``attempt``."""
        nominal = self.nominal_delay(attempt)
        half_width = min(self.jitter * nominal, self.max_delay - nominal)
        return nominal - half_width, nominal + half_width

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Draw the wait before attempt ``attempt + 1``."""
        low, high = self.delay_bounds(attempt)
        if low == high:
            return low
        return (rng or random).uniform(low, high)

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Say whether a step whose attempt ``attempt`` raised ``error`` gets another attempt."""
        if attempt >= self.max_attempts:
            return False
        if isinstance(error, exceptions.WorkerLost):
            return True
        if isinstance(error, exceptions.NEVER_RETRIED):
            return False
        if self.retry_on is None:
            return isinstance(error, Exception) and not isinstance(error, exceptions.StepTimeout)
        return isinstance(error, self.retry_on)

    def max_total_wait(self) -> float:
        """Return the longest total back-off a step can spend waiting between its attempts."""
        return sum(self.delay_bounds(n)[1] for n in range(1, self.max_attempts))

    def max_total_time(self, timeout: float, grace: float = 1.5) -> float:
        """Return the worst-case time from first attempt to final failure for a timed step.

        Each attempt lasts at most ``timeout + grace`` (the hard stop) and the waits at most
        :meth:`max_total_wait`.
        """
        return self.max_attempts * (timeout + grace) + self.max_total_wait()

    # -- (de)serialisation -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form stored in workflow definitions."""
        return {
            "max_attempts": self.max_attempts,
            "initial_delay": self.initial_delay,
            "backoff_factor": self.backoff_factor,
            "max_delay": self.max_delay,
            "jitter": self.jitter,
            "retry_on": None if self.retry_on is None else [dotted_path(c) for c in self.retry_on],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetryPolicy:
        """Build a policy from :meth:`to_dict` output."""
        return cls(**data)

    def describe(self) -> str:
        """Return a one-line summary for ``status`` output."""
        if self.retry_on is None:
            scope = "any Exception except StepTimeout and permanent errors"
        elif not self.retry_on:
            scope = "no exception (worker losses only)"
        else:
            scope = ", ".join(dotted_path(c).removeprefix("builtins.") for c in self.retry_on)
        return (
            f"max_attempts={self.max_attempts} initial_delay={self.initial_delay:g}s "
            f"backoff_factor={self.backoff_factor:g} max_delay={self.max_delay:g}s "
            f"jitter={self.jitter:g} retry_on=[{scope}] "
            f"max_total_wait={self.max_total_wait():g}s"
        )


def _exception_class(value: type[BaseException] | str) -> type[BaseException]:
    if isinstance(value, str):
        try:
            value = import_path(value)
        except ImportError as error:
            raise exceptions.WorkflowDefinitionError(
                f"retry_on entry {value!r} cannot be imported ({error}). "
                "Give an exception class or a dotted path such as 'builtins.ConnectionError'."
            ) from None
    if not (isinstance(value, type) and issubclass(value, BaseException)):
        raise exceptions.WorkflowDefinitionError(
            f"retry_on entry {value!r} is not an exception class."
        )
    return value


#: The policy of a step when neither the step, its workflow nor ``QUEUETY["DEFAULT_RETRY"]``
#: set one: no exception is retried (a plain failure runs once), but a step whose worker died
#: mid-attempt is run again, up to 3 attempts in all.
NO_RETRY = RetryPolicy(max_attempts=3, retry_on=())
