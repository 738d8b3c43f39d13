"""Chunk rows of streaming steps: stored one by one as a generator yields them, read back by
the next attempt of the same step row and by readers while the step runs."""

from __future__ import annotations

import json
from typing import Any

from django.utils import timezone

from queuety.models import StepChunk
from queuety.runtime.claim import Claim
from queuety.store import rows


def stored(step_run_id: int) -> list[Any]:
    """The chunks stored for a step row so far, in order, as JSON values."""
    return [json.loads(text) for text in StepChunk.objects.filter(step_run_id=step_run_id)
            .order_by("index").values_list("content", flat=True)]


def append(held: Claim, step_name: str, index: int, text: str) -> bool:
    """Store chunk ``index`` (JSON ``text``) of the attempt ``held``, in autocommit; False
    when the attempt no longer owns its step row (nothing was stored)."""
    return rows.append_chunk([held.run_id, held.step_run_id, held.step_index, step_name, index,
                              held.attempt, text, timezone.now(), held.step_run_id,
                              held.attempt, held.claimed_by])
