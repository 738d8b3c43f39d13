"""Slots of a concurrency group held from inside a running step.

A whole step holds its group's slot from its admission to its outcome (``queuety.store.
groups``). Some work holds a slot for part of a step only: an agent's model request, which
shares a provider's limit with every other run's requests while the step around it also runs
tools. :func:`try_acquire` takes such a slot (a :class:`~queuety.models.GroupLease` row) in
one short transaction of its own, under the group's row lock, counting the live leases and,
for a rate limit, the group's starts in its window (the same ledger, ``GroupStart``, that the
step gates count). A lease counts only while its step row is processing the attempt that took
it: a worker killed mid-request frees its slot once its attempt is taken for lost (the row
is retried under a later attempt, or fails). A lease whose row does not show the attempt as
processing yet counts for a grace of ``STALE_AFTER`` (its claim may not be visible to this
connection yet).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from queuety.conf import settings
from queuety.core import resources
from queuety.core.status import StepStatus
from queuety.models import GroupLease, GroupStart, ResourceGroup

#: Seconds to wait before asking again for a slot of a full group (a released lease wakes no
#: one: acquirers poll, so keep it short; jitter is added by the caller).
POLL_SECONDS = 0.05


_FINISHED = (StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.CANCELLED)


def _dead(now: datetime) -> Q:
    """Leases whose attempt is over: its row moved on to a later attempt or finished, or has
    not been processing it for longer than a claim takes to be seen."""
    grace = now - timedelta(seconds=settings.STALE_AFTER)
    return (Q(step_run__attempt__gt=F("attempt")) | Q(step_run__status__in=_FINISHED)
            | (~Q(step_run__status=StepStatus.PROCESSING) & Q(acquired_at__lt=grace)))


def try_acquire(group: str, concurrency: int | None, rate: tuple[int, float] | None,
                step_run_id: int, attempt: int, now: datetime) -> tuple[int | None, float]:
    """Take a slot of ``group`` for attempt ``attempt`` of step row ``step_run_id``: return
    ``(lease id, 0)``, or ``(None, seconds)`` when the group is full (at ``concurrency``
    leases) or its rate window is (``rate``): ask again after that many seconds."""
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
                                          attempt=attempt, acquired_at=now)
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
