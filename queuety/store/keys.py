"""The rows of keyed runs (``queuety.keyed``): the key's lock, its live runs, and the first
step row of a run that has not started yet (a debounced run, an open batch, a queued run).

A keyed run's first step row (``seq`` 0) is what says whether it has started: a debounced run
or an open batch is a run whose first task row is still ``pending`` and unclaimed, due later;
a queued run is one whose first row is ``held`` until the live run of its key finishes. Every
change to such a row is a conditional update on that status, so a worker's claim (a
conditional update too) and a keyed start never both win.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Exists, F, OuterRef
from django.db.models.functions import Now
from django.utils import timezone

from queuety.core.status import UNFINISHED
from queuety.models import RunStatus, StepRun, StepStatus, WorkflowRun
from queuety.store import locks

#: First key of the advisory lock that serialises the keyed starts of one (workflow, key).
KEY_LOCK = 7_430


def lock_key(workflow: str, key: str) -> None:
    """Serialise, until this transaction ends, the keyed starts of ``key`` of ``workflow``
    across every process (a no-op on SQLite, which serialises writers itself). No one waits
    for another lock while holding it before this, so it closes no deadlock cycle."""
    locks.hold(KEY_LOCK, [json.dumps([workflow, key])])


def live_runs(workflow: str, key: str) -> list[int]:
    """The unfinished runs of ``key`` of ``workflow``, oldest first (the partial index)."""
    return list(WorkflowRun.objects.filter(name=workflow, key=key, status__in=UNFINISHED)
                .order_by("pk").values_list("pk", flat=True))


def lock_live(run_id: int) -> bool:
    """Lock run ``run_id``'s row for this transaction; whether it is still unfinished (a
    finishing transaction that held it has committed by then)."""
    return WorkflowRun.objects.select_for_update().filter(
        pk=run_id, status__in=UNFINISHED).exists()


def not_started(workflow: str, key: str) -> tuple[int, int, int] | None:
    """``(run id, first step row id, definition id)`` of the newest run of ``key`` whose first
    task row is still pending and unclaimed (a debounced run or an open batch), if any."""
    found = (StepRun.objects.filter(
        kind="step", seq=0, status=StepStatus.PENDING, attempt=0, run__name=workflow,
        run__key=key, run__status=RunStatus.RUNNING, run__transitions=0)
        .order_by("-run_id").values_list("run_id", "pk", "run__definition_id").first())
    return None if found is None else (found[0], found[1], found[2])


def push_due(step_run_id: int, due: datetime | None, published: bool, *,
             margin: float = 0.0) -> bool:
    """Move a not-yet-due first step row to ``due`` (None: keep its due time, only lock it);
    False (nothing written) if it is due within ``margin`` seconds, or claimed. On success the
    row stays locked until this transaction ends, so a worker's claim waits and then finds it
    not due.

    "Not due" is judged by PostgreSQL's clock, read after any claim that scanned the row:
    a claim that scanned it due (by its own clock, taken earlier) makes this update find it
    due too, and give up (the row is then the worker's, with the state it read). A row whose
    due time is kept needs ``margin``: a claim that begins while this transaction runs, and
    finds the row due by then, would wait for it and then take the row with the state from
    before it (a claim reads the run as it was when the claim began).
    """
    horizon = timedelta(seconds=margin)
    not_due = Now() + horizon if connection.vendor == "postgresql" else timezone.now() + horizon
    changes: dict[str, Any] = {"available_at": F("available_at")} if due is None else {
        "available_at": due, "published_at": due if published else None}
    return StepRun.objects.filter(
        pk=step_run_id, status=StepStatus.PENDING, attempt=0, available_at__gt=not_due,
    ).update(**changes) == 1


def run_state(run_id: int) -> dict[str, Any]:
    """The stored state of run ``run_id``."""
    state: dict[str, Any] = WorkflowRun.objects.values_list("state", flat=True).get(pk=run_id)
    return state


def write_state(run_id: int, state: dict[str, Any]) -> None:
    """Replace the state of a run that has not started (no step has read it yet)."""
    WorkflowRun.objects.filter(pk=run_id).update(state=state, updated_at=timezone.now(),
                                                 revision=F("revision") + 1)


def hold_first_step(run_id: int) -> int:
    """Hold a just-dispatched run's first step row (not claimable, never published) until
    :func:`release_first_step`; its id."""
    row = StepRun.objects.get(run_id=run_id, kind="step", seq=0)
    StepRun.objects.filter(pk=row.pk).update(status=StepStatus.HELD, published_at=None)
    return row.pk


def next_queued(workflow: str, key: str) -> tuple[int, int, int] | None:
    """After a run of ``key`` of ``workflow`` finished: ``(run id, first step row id,
    definition id)`` of the run of its key to start now, if any: the oldest unfinished run of
    the key, when it is a queued (held) one."""
    oldest = (WorkflowRun.objects.filter(name=workflow, key=key, status__in=UNFINISHED)
              .order_by("pk").values_list("pk", "definition_id").first())
    if oldest is None:
        return None
    held = StepRun.objects.filter(run_id=oldest[0], kind="step", seq=0,
                                  status=StepStatus.HELD).values_list("pk", flat=True).first()
    return None if held is None else (oldest[0], held, oldest[1])


def stranded_queued(limit: int = 100) -> list[tuple[int, int, int]]:
    """Queued (held) first steps of keyed runs whose key has no older unfinished run left:
    ``(run id, first step row id, definition id)``, oldest first. Their live run finished
    without releasing them (its process died between its completion and the release); the
    partial index ``queuety_step_queued`` keeps this a scan of the queued rows alone."""
    older = WorkflowRun.objects.filter(name=OuterRef("run__name"), key=OuterRef("run__key"),
                                       status__in=UNFINISHED, pk__lt=OuterRef("run_id"))
    return list(StepRun.objects.filter(kind="step", seq=0, status=StepStatus.HELD,
                                       run__key__isnull=False, run__status__in=UNFINISHED)
                .exclude(Exists(older)).order_by("pk")
                .values_list("run_id", "pk", "run__definition_id")[:limit])


def release_first_step(step_run_id: int, now: datetime) -> bool:
    """Make a held first step row due now; False if another finish released it first."""
    return StepRun.objects.filter(pk=step_run_id, status=StepStatus.HELD).update(
        status=StepStatus.PENDING, available_at=now, published_at=now) == 1
