"""Releasing the step rows a paused queue held (``queuety.store.pauses``): by a resume
(``queuety.queues.resume_queue``), and by the sweeper for rows whose pause is gone (a resume
killed half-way, or a hold that committed after its resume looked).

Each chunk is one transaction: its rows become pending, due now, and their messages are sent
after it commits. A message is built from the row and its hold record: the step's queue and
priority from its definition when that loads (as every publish does), else the queue the hold
recorded (the one its message came from) and no priority, so an unloadable definition blocks
nothing: its claim then fails the step, as any claim of it would. A row whose message cannot
be built at all is left held and reported (logged, and counted in ``skipped``); the sweeper
tries it again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from queuety import publish
from queuety.store import pauses
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")

#: Held rows released per transaction.
CHUNK = 500


@dataclass(frozen=True, slots=True)
class Released:
    """What a release did: rows released, and rows left held (their message unbuildable)."""

    released: int = 0
    skipped: int = 0


def release(queue: str | None, *, chunk: int = CHUNK) -> Released:
    """Release every row ``queue``'s pause holds (None: every row held by a pause that no
    longer exists), ``chunk`` rows per transaction. Returns the counts."""
    released = skipped = after = 0
    while True:
        with transaction.atomic():
            rows = pauses.held(queue, chunk, after)
            if not rows:
                break
            after = rows[-1][0]
            messages = {}
            for pk, definition_pk, index, timeout, held_on in rows:
                message = _message(pk, definition_pk, index, timeout, held_on)
                if message is None:
                    skipped += 1
                else:
                    messages[pk] = message
            count = pauses.release(list(messages), timezone.now())
            released += count
            publish.publish_on_commit(list(messages.values()))
    return Released(released, skipped)


def _message(pk: int, definition_pk: int, index: int, timeout: float | None,
             held_on: str) -> publish.Message | None:
    try:
        spec = load_spec(definition_pk)
        return publish.step_message(spec, pk, index, timeout)
    except Exception:  # noqa: BLE001 - an unloadable definition: the recorded queue
        if held_on:
            return publish.Message(pk, None, timeout, held_on)
    logger.error("Could not build the message of held step run id=%s (its definition id=%s "
                 "does not load and its hold recorded no queue); it stays held.", pk,
                 definition_pk)
    return None


def release_orphans(now: datetime) -> int:
    """The sweeper's phase: release the rows held by a pause that no longer exists (one
    query of the throttled rows' partial index when there are none). Returns how many it
    released."""
    return release(None).released
