"""Reminders of waits: nudging whoever a parked run waits for, once per interval.

A wait declared with ``remind_after=`` or ``remind_every=`` parks its run with ``remind_at``
set (by :func:`queuety.runtime.landing.land`, which clears it in the write that ends the
wait). The sweeper's ``reminded`` phase finds runs past it in the database, so reminders
survive restarts. Each reminder is claimed by one compare-and-set of the run row: the
``UPDATE`` matches only while the run is still parked at the same step with the same due time
and count, so two sweeps (the lease makes them rare; a sweep that outlived its lease, or a
site's own call, can still overlap) never send one twice, and a run whose wait ended between
the scan and the claim gets none. The claim's transaction also writes the ``wait_reminder``
timeline event and emits ``run_reminder`` (the ``wait.reminder`` webhook event's rows are
written in it too; receivers get the signal once it commits).

The claim does not bump the run's ``revision``: a reminder is no part of the run's state, and
it must not make a concurrent step boundary retry.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import NamedTuple

from django.db import transaction
from django.db.models import F

from queuety import signals
from queuety.core import waits
from queuety.core.definition import StepSpec, WaitStep, WorkflowSpec, timing_of
from queuety.models import Event, RunStatus, WorkflowRun
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")

#: The statuses of a run parked at a wait (a paused run is reminded once resumed).
PARKED = (RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS)



class Due(NamedTuple):
    """A run with a reminder due, as the phase's scan read it (and its claim compares)."""

    pk: int
    definition_id: int
    status: str
    current_step: int
    remind_at: datetime
    waiting_since: datetime | None
    reminders: int


def remind_due(now: datetime, limit: int = 100) -> int:
    """The sweeper's phase: send the reminders due by ``now``, up to ``limit``, oldest first;
    return how many were sent. One bad run never stops the others (it is logged and tried
    again next sweep)."""
    due = list(WorkflowRun.objects.filter(remind_at__lte=now, status__in=PARKED)
               .order_by("remind_at").values_list(*Due._fields)[:limit])
    sent = 0
    for row in due:
        try:
            sent += remind(Due(*row), now)
        except Exception:  # noqa: BLE001 - the next sweep tries it again
            logger.exception("Sending the wait reminder of run id=%s failed", row[0])
    return sent


def kind_of(step: StepSpec) -> str:
    """The wait's kind as ``run_waiting`` names it: ``signal``, ``approval``, ``decision``,
    ``input`` or ``workflows``."""
    if isinstance(step, WaitStep):
        return step.wait.human or "signal"
    return "workflows"


def remind(run: Due, now: datetime) -> bool:
    """Send the reminder due for ``run`` (as the scan read it) if this call claims it;
    return whether it did. Its own transaction."""
    spec = load_spec(run.definition_id)
    index = run.current_step
    step = spec.steps[index] if index < len(spec.steps) else None
    timing = None if step is None else timing_of(step)
    if step is None or timing is None or run.waiting_since is None:
        return False
    claim = WorkflowRun.objects.filter(pk=run.pk, status=run.status, current_step=index,
                                       remind_at=run.remind_at, reminders=run.reminders)
    if waits.first_reminder(timing.remind_after, timing.remind_every) is None:
        # Moved in place onto a wait that does not remind (migrate_runs()): nothing to send,
        # and the due time goes, so the scan does not meet it again.
        claim.update(remind_at=None)
        return False
    following = waits.next_reminder(run.remind_at, now, timing.remind_every)
    with transaction.atomic():
        if not claim.update(remind_at=following, reminders=F("reminders") + 1):
            return False  # another sweep sent it, or the wait ended meanwhile
        _record(spec, run, step, run.waiting_since, now, following)
    return True


def _record(spec: WorkflowSpec, run: Due, step: StepSpec, since: datetime, now: datetime,
            following: datetime | None) -> None:
    """The reminder's timeline event and lifecycle signal (in the claim's transaction)."""
    kind, name, count, run_id = kind_of(step), step.name, run.reminders + 1, run.pk
    waited = round((now - since).total_seconds(), 3)
    Event.objects.create(run_id=run_id, kind="wait_reminder", step_index=run.current_step,
                         step_name=name,
                         data={"kind": kind, "count": count, "waited_seconds": waited,
                               "next_at": None if following is None else following.isoformat()})
    signals.emit("run_reminder", run_id=run_id, workflow=spec.name, step=name, kind=kind,
                 count=count, waited_seconds=waited)
    logger.info("Reminder %d of wait %r of run id=%s (waiting %.0f s)", count, name, run_id,
                waited)
