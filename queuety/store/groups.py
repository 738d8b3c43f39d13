"""The rows of resource control: a group's lock, its load counted from live step rows, the
start ledger of rate limits, throttled rows and their wake-ups.

Slots are never stored: a group's load is counted, under the group's lock, from the step rows
that hold one (processing and admitted for their current attempt, or woken and on their way),
so an attempt whose worker died gives its slot back as soon as recovery moves its row on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from queuety.core import resources
from queuety.core.status import StepStatus
from queuety.models import GroupStart, ResourceGroup, StepRun
from queuety.store import locks, sql


def lock(group: str | None, queue: str | None, mode: locks.Mode) -> bool:
    """Serialise, until this transaction ends, every admission of ``group`` and of ``queue``:
    their advisory locks (``queuety.store.locks``), the queue's before the group's, waiting
    for them or only trying (``mode``: ``locks.TRY`` when this transaction already holds a
    resource lock, see ``queuety.store.locks``). False when it only tried and one of them is
    busy; the caller then decides without them. SQLite serialises writers itself (the demo's
    single machine).
    """
    wanted = ([(locks.QUEUE, queue)] if queue is not None else []) + (
        [(locks.GROUP, group)] if group is not None else [])
    return locks.acquire(wanted, mode)


def try_lock_groups(names: list[str]) -> set[str]:
    """Take, without waiting, the locks of those of ``names`` that are free; return them
    (a queue's waker, which holds its queue's lock: see :func:`lock`)."""
    return locks.try_hold(locks.GROUP, names)


def _holding(**where: Any) -> Q:
    """Rows holding a slot of a group or a share of a queue's budget (``where``):
    admitted for their current attempt, or woken."""
    return Q(**where) & (
        Q(status=StepStatus.PROCESSING, admitted_attempt=F("attempt"))
        | Q(status__in=(StepStatus.PENDING, StepStatus.PROCESSING), woken=True))


def load(limits: resources.Limits, now: datetime, *, excluding: int | None = None
         ) -> resources.Load:
    """What ``limits``' group and queue hold now, not counting row ``excluding`` (the row
    being decided). Woken rows count as started for the rate limit, as they are about to, and
    hold their cost of the queue's budget, as they hold their group's slot."""
    group = resources.Load() if limits.group is None else loads(
        {limits.group: limits}, now, excluding=excluding)[limits.group]
    queue_cost = 0
    if limits.queue_cost is not None and limits.queue is not None:
        others = StepRun.objects.exclude(pk=excluding) if excluding else StepRun.objects.all()
        queue_cost = others.filter(_holding(queue=limits.queue)).aggregate(
            cost=Coalesce(Sum("cost_units"), 0))["cost"]
    return replace(group, queue_cost=queue_cost)


def loads(limits: dict[str, resources.Limits], now: datetime, *,
          excluding: int | None = None) -> dict[str, resources.Load]:
    """What each group of ``limits`` holds now (as :func:`load`, without any queue), not
    counting row ``excluding``: one query for all of them, and one more for the rate windows
    of those with a rate limit."""
    if not limits:
        return {}
    rows = StepRun.objects.exclude(pk=excluding) if excluding else StepRun.objects.all()
    held = {row["concurrency_group"]: row for row in rows.filter(
        _holding(concurrency_group__in=list(limits))).values("concurrency_group").annotate(
        n=Count("pk"), cost=Coalesce(Sum("cost_units"), 0),
        woken=Count("pk", filter=Q(woken=True)))}
    windows = {name: resources.rate_window(found.rate[1])
               for name, found in limits.items() if found.rate is not None}
    starts: dict[str, int] = {}
    if windows:
        recent = Q()
        for name, seconds in windows.items():
            recent |= Q(group=name, started_at__gt=now - timedelta(seconds=seconds))
        starts = dict(GroupStart.objects.filter(recent).values("group").annotate(
            n=Count("pk")).values_list("group", "n"))
    found: dict[str, resources.Load] = {}
    for name in limits:
        row = held.get(name, {"n": 0, "cost": 0, "woken": 0})
        found[name] = resources.Load(row["n"], row["cost"],
                                     starts.get(name, 0) + row["woken"] if name in windows
                                     else 0)
    return found


def holding_on_queue(queue: str) -> dict[str, tuple[int, int]]:
    """What each group (``""``: in no group) holds of ``queue``'s budget now: ``{group:
    (steps, cost)}`` of its steps admitted or woken on that queue."""
    return {row["concurrency_group"]: (row["n"], row["cost"]) for row in StepRun.objects.filter(
        _holding(queue=queue)).values("concurrency_group").annotate(
        n=Count("pk"), cost=Coalesce(Sum("cost_units"), 0))}


def mark_served(names: set[str]) -> None:
    """Remember that groups ``names`` had a step woken from a queue's line just now."""
    if names:
        now = timezone.now()
        ResourceGroup.objects.bulk_create(
            [ResourceGroup(name=name, served_at=now) for name in sorted(names)],
            update_conflicts=True, unique_fields=["name"], update_fields=["served_at"])


def oldest_start(group: str, since: datetime) -> datetime | None:
    """The earliest start of ``group`` after ``since``: when it leaves the rate window, one
    more start fits."""
    first: datetime | None = (GroupStart.objects.filter(group=group, started_at__gt=since)
                              .order_by("started_at").values_list("started_at", flat=True)
                              .first())
    return first


def _gate_fields(limits: resources.Limits, priority: int) -> dict[str, Any]:
    return {"concurrency_group": limits.group or "",
            "queue": limits.queue if limits.queue_cost is not None and limits.queue else "",
            "cost_units": limits.cost, "priority": priority}


def admit(step_run_id: int, attempt: int, limits: resources.Limits, priority: int,
          now: datetime) -> None:
    """Let the claimed row start: it holds its slot from now on (and its start is in the
    ledger when the group has a rate limit)."""
    StepRun.objects.filter(pk=step_run_id).update(
        admitted_attempt=attempt, woken=False, throttled_by=None,
        **_gate_fields(limits, priority))
    if limits.group is not None and limits.rate is not None:
        GroupStart.objects.create(group=limits.group, started_at=now)


def reserve(step_run_id: int, limits: resources.Limits, priority: int, now: datetime) -> None:
    """Let a just-landed pending row hold its slot until its gate admits it (woken, as if a
    release had woken it): later landings count it, so they park instead of publishing."""
    StepRun.objects.filter(pk=step_run_id).update(woken=True, published_at=now,
                                                  **_gate_fields(limits, priority))


def park(step_run_id: int, limits: resources.Limits, priority: int,
         record: dict[str, Any]) -> bool:
    """Make a just-landed pending row throttled, with no message (its group or queue budget
    is full): a release wakes and publishes it. False when the row is no longer pending."""
    return bool(StepRun.objects.filter(pk=step_run_id, status=StepStatus.PENDING).update(
        status=StepStatus.THROTTLED, published_at=None, woken=False, throttled_by=record,
        **_gate_fields(limits, priority)))


def admit_woken(step_run_id: int, attempt: int, limits: resources.Limits, priority: int,
                now: datetime) -> bool:
    """Admit a claimed row that is still woken, with no lock and no count: its slot was
    reserved under the group's lock when it was woken or landed, and a woken row is counted
    as holding it (and as a start of a rate window) until now. One ``UPDATE`` (and the
    ledger row of a rate-limited group, in the same transaction, so the start is never
    counted twice or not at all). False when the row is not woken for this group: decide it
    under the lock (:func:`lock`, :func:`load`)."""
    rows = StepRun.objects.filter(pk=step_run_id, status=StepStatus.PROCESSING, attempt=attempt,
                                  woken=True, concurrency_group=limits.group or "")
    fields = {"admitted_attempt": attempt, "woken": False, "throttled_by": None,
              **_gate_fields(limits, priority)}
    if limits.group is None or limits.rate is None:
        return bool(rows.update(**fields))
    with transaction.atomic():
        if not rows.update(**fields):
            return False
        GroupStart.objects.create(group=limits.group, started_at=now)
    return True


def throttle(step_run_id: int, attempt: int, claimed_by: str, limits: resources.Limits,
             priority: int, record: dict[str, Any]) -> bool:
    """Hand a claimed row back as throttled: its attempt is not counted, it holds no worker
    and no message. False when the row is no longer this claim's."""
    return bool(StepRun.objects.filter(
        pk=step_run_id, status=StepStatus.PROCESSING, attempt=attempt, claimed_by=claimed_by,
    ).update(status=StepStatus.THROTTLED, attempt=attempt - 1, claimed_by="", claimed_at=None,
             heartbeat_at=None, published_at=None, woken=False, throttled_by=record,
             **_gate_fields(limits, priority)))


def defer(step_run_id: int, attempt: int, claimed_by: str, due: datetime,
          record: dict[str, Any]) -> bool:
    """Hand a claimed row back as pending, due at ``due``, its attempt not counted (a worker
    without the memory headroom to run it). False when the row is no longer this claim's."""
    return bool(StepRun.objects.filter(
        pk=step_run_id, status=StepStatus.PROCESSING, attempt=attempt, claimed_by=claimed_by,
    ).update(status=StepStatus.PENDING, attempt=attempt - 1, claimed_by="", claimed_at=None,
             heartbeat_at=None, available_at=due, published_at=due, throttled_by=record))


def waiting(groups: list[str], limit: int, *, plain: bool = False) -> list[resources.Waiting]:
    """Throttled rows of ``groups``, best first (highest priority, then oldest), at most
    ``limit``; with ``plain``, only those under no queue's budget (a row under one, its
    ``queue`` set, is woken in that queue's line, across groups: :func:`waiting_for_queue`)."""
    rows = StepRun.objects.filter(status=StepStatus.THROTTLED, concurrency_group__in=groups)
    if plain:
        rows = rows.filter(queue="")
    found = (rows.order_by("-priority", "pk")
             .values_list("pk", "concurrency_group", "priority", "cost_units", "queue")[:limit])
    return [resources.Waiting(pk, group, priority, cost, queue)
            for pk, group, priority, cost, queue in found]


@dataclass(frozen=True, slots=True)
class Line:
    """The best of a queue's waiting steps (:func:`waiting_for_queue`)."""

    rows: list[resources.Waiting]
    records: dict[str, dict[str, Any] | None]
    """The ``throttled_by`` of each group's best row (the limits it waits under)."""
    served: dict[str, float]
    """When each group was last served from a line (epoch seconds; absent: never)."""


def waiting_for_queue(queue: str, limit: int, per_group: int) -> Line:
    """Throttled rows under ``queue``'s cost budget, of every group (``""``: in no group):
    each group's best ``per_group`` (highest priority, then oldest), interleaved so that a
    group with 1,000 waiting rows does not fill the ``limit`` before one with 5 is seen (the
    groups served longest ago first, so more groups than ``limit`` still take turns)."""
    served_at = ResourceGroup.objects.filter(name=OuterRef("concurrency_group")).values(
        "served_at")[:1]
    ranked = (StepRun.objects.filter(status=StepStatus.THROTTLED, queue=queue)
              .annotate(rank=Window(RowNumber(), partition_by=[F("concurrency_group")],
                                    order_by=[F("priority").desc(), F("pk").asc()]),
                        served=Subquery(served_at))
              .filter(rank__lte=per_group)
              .order_by("-priority", "rank", F("served").asc(nulls_first=True), "pk")
              .values_list("pk", "concurrency_group", "priority", "cost_units", "rank",
                           "throttled_by", "served")[:limit])
    line = Line([], {}, {})
    for pk, group, priority, cost, rank, record, served_at in ranked:
        line.rows.append(resources.Waiting(pk, group, priority, cost, queue))
        if rank == 1:
            line.records[group] = record
            if served_at is not None and group:
                line.served[group] = served_at.timestamp()
    return line


def throttled_groups(limit: int = 500) -> list[str]:
    """Groups with throttled rows (the sweeper's backstop wakes each)."""
    return list(StepRun.objects.filter(status=StepStatus.THROTTLED)
                .exclude(concurrency_group="")
                .values_list("concurrency_group", flat=True).distinct()
                .order_by("concurrency_group")[:limit])


def throttled_queues(limit: int = 100, *, group: str | None = None) -> list[str]:
    """Queues with throttled rows waiting under their cost budget, in a group or not (with
    ``group``: rows of that group only)."""
    rows = StepRun.objects.filter(status=StepStatus.THROTTLED)
    if group is not None:
        rows = rows.filter(concurrency_group=group)
    return list(rows.exclude(queue="").values_list("queue", flat=True).distinct()
                .order_by("queue")[:limit])


def throttle_record(step_run_id: int) -> dict[str, Any] | None:
    """The ``throttled_by`` of a row."""
    record: dict[str, Any] | None = StepRun.objects.filter(pk=step_run_id).values_list(
        "throttled_by", flat=True).first()
    return record


def wake(ids: list[int], now: datetime) -> list[tuple[int, int, int, float | None]]:
    """Make throttled rows ``ids`` pending and woken (each then holds its slot until its gate
    admits it); return ``(id, definition id, step index, timeout)`` of each one woken, in
    the order of ``ids``."""
    if not ids:
        return []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql.WAKE_THROTTLED, [now, now, ids])
            returned = {row[0]: tuple(row) for row in cursor.fetchall()}
        return [returned[pk] for pk in ids if pk in returned]
    found = {row[0]: row for row in StepRun.objects.filter(
        pk__in=ids, status=StepStatus.THROTTLED).values_list(
        "pk", "run__definition_id", "step_index", "timeout")}
    StepRun.objects.filter(pk__in=list(found), status=StepStatus.THROTTLED
                           ).update(status=StepStatus.PENDING, woken=True, available_at=now,
                                    published_at=now)
    return [found[pk] for pk in ids if pk in found]


def woken_row(step_run_id: int) -> tuple[int, int, int, float | None] | None:
    """``(id, definition id, step index, timeout)`` of row ``step_run_id`` while it is woken
    and pending (a kept hand-off not yet claimed); None otherwise."""
    row: tuple[int, int, int, float | None] | None = (
        StepRun.objects.filter(pk=step_run_id, status=StepStatus.PENDING, woken=True)
        .values_list("pk", "run__definition_id", "step_index", "timeout").first())
    return row


def release_stale_woken(older_than: datetime) -> int:
    """Forget the reservation of woken rows whose message has not been consumed since
    ``older_than`` (the sweeper republishes them; meanwhile they must not hold a slot)."""
    return StepRun.objects.filter(status=StepStatus.PENDING, woken=True,
                                  published_at__lt=older_than).update(woken=False)


def set_timer(group: str, at: datetime, now: datetime) -> bool:
    """Whether a wake-up of ``group`` at ``at`` should be sent: False while one is already due
    no later than that (one timer per group and window, not one per throttled step)."""
    ResourceGroup.objects.get_or_create(name=group)
    return bool(ResourceGroup.objects.filter(name=group).filter(
        Q(wake_at__isnull=True) | Q(wake_at__lt=now) | Q(wake_at__gt=at)).update(wake_at=at))


def prune_starts(before: datetime) -> int:
    """Delete ledger rows older than ``before`` (no rate window reaches them)."""
    deleted, _ = GroupStart.objects.filter(started_at__lt=before).delete()
    return deleted


def overview() -> list[dict[str, Any]]:
    """Every group with a step in flight, woken or throttled: ``{group, in_flight, woken,
    waiting, cost}``, by name."""
    groups: dict[str, dict[str, Any]] = {}
    live = (StepRun.objects.exclude(concurrency_group="")
            .filter(Q(status=StepStatus.PROCESSING, admitted_attempt=F("attempt"))
                    | Q(status=StepStatus.PENDING, woken=True) | Q(status=StepStatus.THROTTLED))
            .values("concurrency_group").annotate(
                in_flight=Count("pk", filter=Q(status=StepStatus.PROCESSING)),
                woken=Count("pk", filter=Q(status=StepStatus.PENDING)),
                waiting=Count("pk", filter=Q(status=StepStatus.THROTTLED)),
                cost=Coalesce(Sum("cost_units", filter=Q(status=StepStatus.PROCESSING)), 0)))
    for row in live:
        name = row.pop("concurrency_group")
        groups[name] = {"group": name, **row}
    return [groups[name] for name in sorted(groups)]


def queue_overview() -> dict[str, dict[str, int]]:
    """Every queue with a step holding or waiting for its cost budget: ``{queue: {running,
    running_cost, waiting}}`` (running: admitted or woken)."""
    found: dict[str, dict[str, int]] = {}
    live = (StepRun.objects.exclude(queue="")
            .filter(_holding() | Q(status=StepStatus.THROTTLED))
            .values("queue").annotate(
                running=Count("pk", filter=~Q(status=StepStatus.THROTTLED)),
                running_cost=Coalesce(Sum("cost_units", filter=~Q(status=StepStatus.THROTTLED)),
                                      0),
                waiting=Count("pk", filter=Q(status=StepStatus.THROTTLED))))
    for row in live:
        found[row.pop("queue")] = row
    return found


def recent_starts(group: str, seconds: float, now: datetime) -> int:
    """Starts of ``group`` in the last ``seconds``."""
    return GroupStart.objects.filter(group=group,
                                     started_at__gt=now - timedelta(seconds=seconds)).count()
