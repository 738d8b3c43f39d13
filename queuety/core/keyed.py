"""Keyed runs, the pure rules: the flow-control options of a start (``key=``, ``debounce=``,
``singleton=`` with ``on_conflict=``, ``batch=``), checked once, and when a batch closes.

``queuety.keyed`` applies them against the database; nothing here reads a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from queuety import exceptions

#: What ``singleton=True`` does while a run of the key is live.
SINGLETON_CONFLICTS = ("reject", "queue", "replace", "signal", "existing")
#: The builder's idempotency-key conflict values: a different option with a clashing name.
IDEMPOTENCY_CONFLICTS = ("report", "error")
#: The longest key (the column's size).
MAX_KEY_LENGTH = 255
#: The longest debounce or batch wait: a year (a due time must stay a valid datetime).
MAX_SECONDS = 366 * 86_400


def _positive_seconds(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise exceptions.InvalidPayload(
            f"{what} must be a positive number of seconds, at most {MAX_SECONDS} (a year) "
            f"(got {value!r:.80}).")
    return float(value)


@dataclass(frozen=True, slots=True)
class Batch:
    """Collect the events of one key into one run whose state is ``{"items": [...]}`` (the
    payloads in the order their calls committed).

    The batch closes, and its run starts, at ``max_items`` items or ``max_wait`` seconds after
    its first item, whichever comes first. ``max_wait`` is required, so a quiet key never
    strands its items; ``max_items=None`` closes by time only.
    """

    max_items: int | None = None
    max_wait: float | None = None

    def __post_init__(self) -> None:
        if self.max_items is not None and (isinstance(self.max_items, bool) or
                                           not isinstance(self.max_items, int) or
                                           self.max_items < 1):
            raise exceptions.InvalidPayload(
                f"Batch(max_items=...) must be a whole number of at least 1 (got "
                f"{self.max_items!r}), or None to close the batch by max_wait only.")
        if self.max_wait is None:
            raise exceptions.InvalidPayload(
                "Batch(max_wait=...) is required: the seconds after its first item that a "
                "batch closes, so a key that goes quiet still starts its run.")
        object.__setattr__(self, "max_wait", _positive_seconds("Batch(max_wait=...)",
                                                               self.max_wait))

    def is_full(self, count: int) -> bool:
        """Whether a batch of ``count`` items is closed by its size."""
        return self.max_items is not None and count >= self.max_items

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the REST API's ``batch`` field)."""
        return {"max_items": self.max_items, "max_wait": self.max_wait}


@dataclass(frozen=True, slots=True)
class FlowOptions:
    """The checked flow-control options of one start (see :func:`flow_options`)."""

    key: str
    mode: str | None
    """``debounce``, ``singleton``, ``batch``, or None (the key is only stored on the run)."""
    debounce: float | None = None
    on_conflict: str = "reject"
    signal: str = "input"
    batch: Batch | None = None


def flow_options(workflow: str, *, key: Any = None, debounce: Any = None,
                 singleton: Any = False, on_conflict: Any = None, signal: Any = "input",
                 batch: Any = None) -> FlowOptions | None:
    """Check a start's flow-control options; None when it has none (a plain start).

    Raises:
        InvalidPayload: an option is malformed, two modes are combined, a mode has
            no ``key``, or ``on_conflict``/``signal`` are given without what they belong to.
    """
    if not isinstance(singleton, bool):
        raise exceptions.InvalidPayload(
            f"singleton= on workflow {workflow!r} must be True or False (got {singleton!r:.80}).")
    modes = [name for name, on in (("debounce", debounce is not None),
                                   ("singleton", bool(singleton)),
                                   ("batch", batch is not None)) if on]
    if key is None:
        if modes:
            raise exceptions.InvalidPayload(
                f"{modes[0]}= on workflow {workflow!r} needs key='...': flow control is per "
                "key (the runs that share a key are the ones it orders).")
        _check_unused(workflow, None, on_conflict, signal)
        return None
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH or \
            "\x00" in key:
        raise exceptions.InvalidPayload(
            f"The key of a run of workflow {workflow!r} must be a non-blank string of at most "
            f"{MAX_KEY_LENGTH} characters, without NUL (got {key!r:.80}).")
    if len(modes) > 1:
        raise exceptions.InvalidPayload(
            f"Workflow {workflow!r} was started with both {modes[0]}= and {modes[1]}=; use one "
            "flow control per start (debounce=, singleton= or batch=).")
    mode = modes[0] if modes else None
    _check_unused(workflow, mode, on_conflict, signal)
    if batch is not None and not isinstance(batch, Batch):
        raise exceptions.InvalidPayload(
            f"batch= takes queuety.Batch(max_items=..., max_wait=...) (got {batch!r:.80}).")
    return FlowOptions(
        key=key, mode=mode,
        debounce=None if debounce is None else _positive_seconds("debounce=", debounce),
        on_conflict=on_conflict or "reject", signal=signal, batch=batch)


def _check_unused(workflow: str, mode: str | None, on_conflict: Any, signal: Any) -> None:
    """``on_conflict`` belongs to ``singleton=True``, ``signal`` to ``on_conflict="signal"``."""
    if on_conflict is not None and on_conflict in IDEMPOTENCY_CONFLICTS:
        raise exceptions.InvalidPayload(
            f"on_conflict={on_conflict!r} is an idempotency-key option: pass it as "
            f".idempotency_key(key, on_conflict={on_conflict!r}). With singleton=True, "
            f"on_conflict is one of {', '.join(map(repr, SINGLETON_CONFLICTS))}.")
    if on_conflict is not None and on_conflict not in SINGLETON_CONFLICTS:
        raise exceptions.InvalidPayload(
            f"on_conflict must be one of {', '.join(map(repr, SINGLETON_CONFLICTS))} (got "
            f"{on_conflict!r:.80}).")
    if on_conflict is not None and mode != "singleton":
        raise exceptions.InvalidPayload(
            f"on_conflict={on_conflict!r} on workflow {workflow!r} needs singleton=True and a "
            "key: it says what a start does while a run of that key is live.")
    if not isinstance(signal, str) or not signal or len(signal) > MAX_KEY_LENGTH or \
            "\x00" in signal:
        raise exceptions.InvalidPayload(
            f"signal= must name a signal (got {signal!r:.80}).")
    if signal != "input" and on_conflict != "signal":
        raise exceptions.InvalidPayload(
            f"signal={signal!r} on workflow {workflow!r} is used only with singleton=True and "
            "on_conflict='signal'.")


def debounce_due(now: datetime, seconds: float) -> datetime:
    """When a debounced run starts if its key stays quiet from ``now``."""
    return now + timedelta(seconds=seconds)


def batch_state(items: list[Any]) -> dict[str, Any]:
    """The state of a batch's run: its items, in the order they came."""
    return {"items": list(items)}
