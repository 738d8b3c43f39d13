"""Artifact rows: written from outside a step (visible at once) or inside an attempt (pending
until the attempt's outcome is recorded), published, summarised.

How "visible only if the attempt's outcome is recorded" holds: an attempt's write is a row with
``visible=False`` tagged with the attempt (``step_run_id``, ``attempt``); writing the same key
again in that attempt updates that row. :func:`publish` runs inside the transaction that
records the attempt's outcome (a success or a failure) and only there: it deletes the visible
rows of the same keys, makes the attempt's rows visible, and drops the pending rows earlier
attempts of the step row left (their worker died before an outcome). So an attempt whose
outcome is never recorded leaves nothing visible, and a retried attempt that writes the same
key replaces the earlier version instead of adding a second one.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from queuety.core.artifacts import Encoded
from queuety.models import Artifact
from queuety.runtime.claim import Claim
from queuety.store import locks


def write_pending(held: Claim, step_name: str, encoded: Encoded) -> None:
    """Store an artifact written by the attempt ``held``, invisible until :func:`publish`."""
    fields = _fields(encoded, held.step_index, step_name)
    updated = Artifact.objects.filter(run_id=held.run_id, key=encoded.key, visible=False,
                                      step_run_id=held.step_run_id,
                                      attempt=held.attempt).update(**fields)
    if not updated:
        Artifact.objects.create(run_id=held.run_id, key=encoded.key, visible=False,
                                step_run_id=held.step_run_id, attempt=held.attempt, **fields)


def write_visible(run_id: int, encoded: Encoded, step_index: int | None = None,
                  step_name: str = "") -> None:
    """Store (or replace) an artifact written from outside a step: visible at once."""
    fields = _fields(encoded, step_index, step_name)
    with transaction.atomic():
        # Serialised with other writes of the key and with an attempt's publish of it, so
        # neither finds the other's new visible row in its way (the key's unique constraint).
        locks.hold(locks.ARTIFACT, [f"{run_id}:{encoded.key}"])
        if not Artifact.objects.filter(run_id=run_id, key=encoded.key, visible=True).update(
                step_run_id=None, attempt=None, **fields):
            Artifact.objects.create(run_id=run_id, key=encoded.key, visible=True, **fields)


def publish(held: Claim) -> int:
    """Make the artifacts the attempt ``held`` wrote visible; return how many.

    Call it inside the transaction that records the attempt's outcome, after the guarded
    update of its step row succeeded.
    """
    mine = Artifact.objects.filter(run_id=held.run_id, visible=False,
                                   step_run_id=held.step_run_id)
    keys = list(mine.filter(attempt=held.attempt).values_list("key", flat=True))
    # Rows of earlier attempts of this step row: their outcome was never recorded.
    mine.exclude(attempt=held.attempt).delete()
    if not keys:
        return 0
    locks.hold(locks.ARTIFACT, [f"{held.run_id}:{key}" for key in keys])
    Artifact.objects.filter(run_id=held.run_id, visible=True, key__in=keys).delete()
    return mine.filter(attempt=held.attempt).update(visible=True, updated_at=timezone.now())


def summary(run_id: int) -> list[str]:
    """The keys of the run's visible artifacts, sorted."""
    return list(Artifact.objects.filter(run_id=run_id, visible=True).order_by("key")
                .values_list("key", flat=True))


def _fields(encoded: Encoded, step_index: int | None, step_name: str) -> dict[str, Any]:
    return {"kind": encoded.kind, "content": encoded.data, "size": encoded.size,
            "metadata": encoded.metadata, "step_index": step_index, "step_name": step_name,
            "updated_at": timezone.now()}
