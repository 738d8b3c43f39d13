"""Slots of a concurrency group held from inside a running step.

A whole step holds its group's slot from its admission to its outcome (``queuety.store.
groups``). Some work holds a slot for part of a step only: an agent's model request, which
shares a provider's limit with every other run's requests while the step around it also runs
tools. :func:`try_acquire` takes such a slot (a :class:`~queuety.models.GroupLease` row) in
one short transaction of its own, under the group's row lock, counting the live leases and,
for a rate limit, the group's starts in its window (the same ledger, ``GroupStart``, that the
step gates count).

A lease lives as long as the process holding it (``holder``, its ``claimed_by`` name): that
process's heartbeat thread refreshes ``beat_at`` while it runs steps, and a lease whose beat
is older than ``WORKER_LOST_AFTER`` is dead (its worker was killed mid-request) and deleted by
the next acquirer. Not by its attempt: an attempt the sweeper took for lost may still be
running in a live but stalled process, its request in flight, and its slot must count until
that request ends. Such an attempt is refused a new slot (:class:`~queuety.exceptions.
WorkerLost`): its row moved on to a later attempt or finished, so the attempt stops.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from queuety import exceptions
from queuety.conf import settings
from queuety.core import resources
from queuety.core.status import StepStatus
from queuety.models import GroupLease, GroupStart, ResourceGroup, StepRun

#: Seconds to wait before asking again for a slot of a full group (a released lease wakes no
#: one: acquirers poll, so keep it short; jitter is added by the caller).
POLL_SECONDS = 0.05


_FINISHED = (StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.CANCELLED)


def _dead(now: datetime) -> Q:
    """Leases whose holding process stopped beating (killed mid-request)."""
    return Q(beat_at__lt=now - timedelta(seconds=settings.WORKER_LOST_AFTER))


def beat(holder: str, now: datetime) -> None:
    """Keep the leases ``holder`` (a process's ``claimed_by`` name) holds alive; its
    heartbeat thread calls this with each beat of its steps."""
    GroupLease.objects.filter(holder=holder).update(beat_at=now)


def _check_owner(step_run_id: int, attempt: int) -> None:
    """Refuse a slot to an attempt its row no longer runs (the sweeper took it for lost)."""
    if StepRun.objects.filter(Q(attempt__gt=attempt) | Q(status__in=_FINISHED),
                              pk=step_run_id).exists():
        raise exceptions.WorkerLost(
            f"Attempt {attempt} of step row {step_run_id} was taken for lost (its row moved "
            "on to a later attempt or finished) and may not take a slot of a concurrency "
            "group: it stops here; the row's current attempt does the work.")


def try_acquire(group: str, concurrency: int | None, rate: tuple[int, float] | None,
                step_run_id: int, attempt: int, now: datetime, holder: str
                ) -> tuple[int | None, float]:
    """Take a slot of ``group`` for attempt ``attempt`` of step row ``step_run_id``: return
    ``(lease id, 0)``, or ``(None, seconds)`` when the group is full (at ``concurrency``
    leases) or its rate window is (``rate``): ask again after that many seconds. ``holder``
    is the calling process's ``claimed_by`` name (its heartbeat keeps the lease alive).

    Raises:
        WorkerLost: the attempt no longer owns its row; nothing was taken.
    """
    _check_owner(step_run_id, attempt)
    ResourceGroup.objects.get_or_create(name=group)
    with transaction.atomic():
        # The group's row serialises its acquirers: two cannot both see the last free slot.
        list(ResourceGroup.objects.select_for_update().filter(name=group).values_list("pk"))
        if concurrency is not None:
            live = GroupLease.objects.filter(group=group).count()
            if live >= concurrency:
                if not GroupLease.objects.filter(_dead(now), group=group).delete()[0]:
                    return None, POLL_SECONDS
                if GroupLease.objects.filter(group=group).count() >= concurrency:
                    return None, POLL_SECONDS
        if rate is not None:
            window = resources.rate_window(rate[1])
            recent = GroupStart.objects.filter(group=group,
                                               started_at__gt=now - timedelta(seconds=window))
            if recent.count() >= rate[0]:
                oldest = recent.order_by("started_at").values_list("started_at",
                                                                    flat=True).first()
                wait = POLL_SECONDS if oldest is None else (
                    oldest + timedelta(seconds=window) - now).total_seconds()
                return None, max(wait, POLL_SECONDS)
            GroupStart.objects.create(group=group, started_at=now)
        lease = GroupLease.objects.create(group=group, step_run_id=step_run_id,
                                          attempt=attempt, acquired_at=now, holder=holder,
                                          beat_at=now)
    return lease.pk, 0.0


def release(lease_id: int) -> None:
    """Give a slot back."""
    GroupLease.objects.filter(pk=lease_id).delete()


def holding() -> dict[str, int]:
    """Live leases per group (the groups page shows them as in flight)."""
    counts: dict[str, int] = {}
    for group in GroupLease.objects.exclude(_dead(timezone.now())).values_list("group",
                                                                                flat=True):
        counts[group] = counts.get(group, 0) + 1
    return counts
