"""Hand step messages to Celery, after the transaction that created them commits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple

from django.db import transaction

from queuety.conf import settings

logger = logging.getLogger("queuety")


class Message(NamedTuple):
    """A request to run the step row ``step_run_id``."""

    step_run_id: int
    countdown: float | None
    """Seconds to hold the message at the broker (short back-offs only)."""
    timeout: float | None
    """The step's timeout: the message carries the matching hard time limit."""
    queue: str | None = None
    """The workflow's queue (``.on_queue()``), else ``QUEUETY["QUEUE"]``."""


_override: Callable[[list[Message]], None] | None = None


def publish(messages: Iterable[Message]) -> None:
    """Send one ``queuety.execute_step`` message per item.

    A broker error is logged, not raised: the step rows are committed, and the sweeper
    re-publishes due rows whose message never arrived.
    """
    messages = list(messages)
    if _override is not None:
        _override(messages)
        return
    from queuety.tasks import execute_step

    for message in messages:
        options: dict = {}
        queue = message.queue or settings.QUEUE
        if queue:
            options["queue"] = queue
        if message.countdown:
            options["countdown"] = message.countdown
        if message.timeout:
            # The handler is interrupted at the timeout by the worker itself; this hard limit
            # only kills a process stuck where signals cannot reach (C code).
            options["time_limit"] = message.timeout + settings.HARD_TIMEOUT_GRACE
        try:
            execute_step.apply_async((message.step_run_id,), **options)
        except Exception:  # noqa: BLE001 - the sweeper is the backstop
            logger.exception("Could not publish step run id=%s; the sweeper will re-publish it.",
                             message.step_run_id)


def publish_on_commit(messages: list[Message]) -> None:
    """Publish ``messages`` once the current transaction commits (at once outside one)."""
    transaction.on_commit(partial(publish, messages))


@contextmanager
def captured() -> Iterable[list[Message]]:
    """Collect published messages instead of sending them (for tests and dry runs)."""
    global _override
    sent: list[Message] = []
    previous, _override = _override, sent.extend
    try:
        yield sent
    finally:
        _override = previous
