"""Resource control at the step boundary: the gate a claimed step passes before it starts,
and the wake-up of waiting steps when it is done.

A step with no concurrency group, no queue cost budget and no worker admission settings
passes without a query (:func:`enter` returns :data:`OPEN` from what is in memory). Any other
claimed step is decided under its group's lock (``queuety.store.groups.lock``): its group's
load is counted from live step rows, and the step either starts, holding a slot, or is handed
back *throttled*: its attempt is not counted, its row holds no worker and no message, and
``throttled_by`` says why. When an admitted attempt ends, :func:`release` wakes the best
throttled steps of its group into the slots it left (highest priority, then oldest), handing
the first to the releasing process; the sweeper does the same for every group as a backstop,
and a rate-limited group gets one timer for the moment its window reopens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from queuety import exceptions, publish, signals
from queuety.conf import settings
from queuety.core import resources
from queuety.core.definition import WorkflowSpec
from queuety.runtime import admission
from queuety.runtime.claim import Claim
from queuety.store import groups
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")


@dataclass(frozen=True, slots=True)
class Passage:
    """What the gate decided for one claimed attempt."""

    started: bool
    """False: the step was throttled or deferred and must not run now."""
    limits: resources.Limits | None = None
    """The limits the attempt holds a slot under (give it back with :func:`release`)."""


#: The passage of a step nothing bounds.
OPEN = Passage(True)


def _tables() -> dict[str, dict[str, Any]]:
    return {key: getattr(settings, key) for key in (
        "CONCURRENCY_LIMITS", "RATE_LIMITS", "GROUP_COST_BUDGETS", "QUEUE_COST_BUDGETS")}


def limits_of(spec: WorkflowSpec, held: Claim) -> resources.Limits | None:
    """The limits that bound this attempt, or None when nothing does (no query).

    Raises:
        WorkflowDefinitionError: the step's group names a state key the run lacks.
    """
    return limits_at(spec, held.step_index, held.state, held.run_id)


def limits_at(spec: WorkflowSpec, index: int, state: dict[str, Any], run_id: int
              ) -> resources.Limits | None:
    """The limits that bound step ``index`` of run ``run_id`` (whose state is ``state``), or
    None when nothing does: decided from what is in memory, with no query.

    Raises:
        WorkflowDefinitionError: the step's group names a state key the run lacks.
    """
    step = spec.steps[index]
    queue = spec.queue_of(index) or settings.QUEUE
    if step.concurrency_group is None and (not queue or queue not in
                                           settings.QUEUE_COST_BUDGETS):
        return None
    group = None if step.concurrency_group is None else resources.group_key(
        step.concurrency_group, state, step_name=step.name, run_id=run_id)
    limits = resources.limits_for(group=group, step_limit=step.concurrency_limit,
                                  step_rate=step.rate_limit, cost=step.cost_units, queue=queue,
                                  tables=_tables())
    return limits if limits.gated else None


def publish_landed(spec: WorkflowSpec, step_run_id: int, index: int, run_id: int,
                   state: dict[str, Any]) -> bool:
    """Publish the message of the task row ``step_run_id`` a run just landed on (in the
    transaction that created it), or park the row throttled when its group or queue budget
    is already full: then no message exists until a release wakes it, so the broker never
    holds a backlog that every worker must claim and throttle in turn. A row published here
    is marked woken, so it holds its slot until its gate admits it and later landings see
    the group as it will be. Returns whether the row was parked.

    A step in no group and under no queue budget is published with no query.
    """
    try:
        limits = limits_at(spec, index, state, run_id)
    except exceptions.WorkflowDefinitionError:
        limits = None  # the gate fails the attempt with the error, as for any claim
    if limits is None:
        publish.publish_on_commit([publish.message_for(spec, step_run_id, index)])
        return False
    priority = resources.PRIORITIES[spec.priority_of(index) or resources.NORMAL]
    now = timezone.now()
    with transaction.atomic():
        groups.lock(limits.group, limits.queue if limits.queue_cost is not None else None)
        load = groups.load(limits, now, excluding=step_run_id)
        why = resources.verdict(limits, load)
        if why is None:
            groups.reserve(step_run_id, limits, priority, now)
            publish.publish_on_commit([publish.message_for(spec, step_run_id, index)])
            return False
        record = {**resources.describe_throttle(limits, why, load),
                  "since": now.isoformat(), "limits": _limits_record(limits)}
        groups.park(step_run_id, limits, priority, record)
        if why == resources.RATE and limits.group is not None and limits.rate is not None:
            _set_timer(limits.group, limits.rate[1], now)
        _throttled(spec, index, run_id, step_run_id, record)
    return True


def enter(held: Claim, spec: WorkflowSpec) -> Passage:
    """Decide whether the claimed attempt ``held`` may start now.

    Raises:
        WorkflowDefinitionError: the step's group names a state key the run lacks (the
            attempt then fails as any definition error does).
    """
    if settings.ADMISSION:
        problem = admission.headroom_problem()
        if problem is not None:
            _defer(held, spec, problem)
            return Passage(False)
    limits = limits_of(spec, held)
    if limits is None:
        return OPEN
    priority = resources.PRIORITIES[spec.priority_of(held.step_index) or resources.NORMAL]
    now = timezone.now()
    # A woken step's slot (and its share of a queue's budget) is already reserved.
    if groups.admit_woken(held.step_run_id, held.attempt, limits, priority, now):
        return Passage(True, limits)
    with transaction.atomic():
        groups.lock(limits.group, limits.queue if limits.queue_cost is not None else None)
        load = groups.load(limits, now, excluding=held.step_run_id)
        why = resources.verdict(limits, load)
        if why is None:
            groups.admit(held.step_run_id, held.attempt, limits, priority, now)
            return Passage(True, limits)
        record = {**resources.describe_throttle(limits, why, load),
                  "since": now.isoformat(), "limits": _limits_record(limits)}
        if not groups.throttle(held.step_run_id, held.attempt, held.claimed_by, limits,
                               priority, record):
            return Passage(False)
        if why == resources.RATE and limits.group is not None and limits.rate is not None:
            _set_timer(limits.group, limits.rate[1], now)
        became_throttled(held, spec, record)
    return Passage(False)


def became_throttled(held: Claim, spec: WorkflowSpec, record: dict[str, Any]) -> None:
    """A claimed step was not started because of its resources and now waits, throttled
    (called in the transaction that throttled it; ``record`` is its ``throttled_by``)."""
    _throttled(spec, held.step_index, held.run_id, held.step_run_id, record)


def _throttled(spec: WorkflowSpec, index: int, run_id: int, step_run_id: int,
               record: dict[str, Any]) -> None:
    """Tell that step ``index`` of run ``run_id`` waits throttled: the one place, for a claimed
    step (:func:`became_throttled`) and one parked at landing (:func:`publish_landed`). Called
    inside the throttling transaction: ``run_throttled`` reaches its webhook rows in it and
    its receivers once it commits."""
    step = spec.steps[index].name
    signals.emit("run_throttled", run_id=run_id, workflow=spec.name, step=step,
                 reason=record.get("reason"))
    logger.info("Step %r of run id=%s (step run id=%s) is throttled by group %r: %s.",
                step, run_id, step_run_id, record.get("group"), record.get("reason"))


def _defer(held: Claim, spec: WorkflowSpec, problem: str) -> None:
    """Hand the attempt back unstarted for later: this worker lacks the memory to run it."""
    now = timezone.now()
    wait = admission.defer_seconds()
    record = {"group": None, "reason": resources.MEMORY, "detail": problem,
              "worker": held.claimed_by, "since": now.isoformat()}
    with transaction.atomic():
        if not groups.defer(held.step_run_id, held.attempt, held.claimed_by,
                            now + timedelta(seconds=wait), record):
            return
        publish.publish_on_commit([publish.step_message(spec, held.step_run_id,
                                                        held.step_index, held.timeout, wait)])
    logger.warning("Step %r of run id=%s deferred for %.1f s: %s.",
                   spec.steps[held.step_index].name, held.run_id, wait, problem)


def _limits_record(limits: resources.Limits) -> dict[str, Any]:
    return {"concurrency": limits.concurrency,
            "rate": None if limits.rate is None else list(limits.rate),
            "group_cost": limits.group_cost, "queue": limits.queue,
            "queue_cost": limits.queue_cost, "cost": limits.cost}


def limits_from_record(group: str, record: dict[str, Any] | None) -> resources.Limits:
    """The limits a throttled row was decided under (its ``throttled_by``), with the site's
    settings applied again (they may have changed since)."""
    saved = (record or {}).get("limits") or {}
    rate = saved.get("rate")
    return resources.limits_for(
        group=group, step_limit=saved.get("concurrency"),
        step_rate=None if rate is None else (int(rate[0]), float(rate[1])),
        cost=int(saved.get("cost") or 1), queue=saved.get("queue"), tables=_tables())


def _set_timer(group: str, period: float, now: datetime) -> None:
    """Send one wake-up of ``group`` for when its oldest start in the window leaves it."""
    window = timedelta(seconds=resources.rate_window(period))
    oldest = groups.oldest_start(group, now - window)
    at = (oldest or now) + window
    if groups.set_timer(group, at, now):
        publish.wake_group_on_commit(group, max((at - now).total_seconds(), 0) + 0.005)


def release(limits: resources.Limits | None, *, keep: bool = False) -> int | None:
    """An admitted attempt under ``limits`` ended (completed, failed, retried or recovered):
    wake the throttled steps its slot, and any other free one, lets start.

    With ``keep``, the best woken step without a timeout is not published but returned: the
    caller (the worker process whose slot it takes) runs it next, with no broker hop, or
    hands it back with :func:`hand_back`. Call after the attempt's outcome committed, so the
    count sees its slot free.
    """
    if limits is None:
        return None
    kept = None
    if limits.queue is not None and limits.queue_cost is not None:
        kept = wake_queue(limits.queue, keep=keep)
    if limits.group is not None:
        handed = wake_group(limits.group, limits, keep=keep and kept is None)
        kept = kept if kept is not None or not keep else handed
    return kept if keep else None


def wake_everything_of(group: str) -> int:
    """Wake ``group``'s throttled steps, those waiting for a queue's budget too (a rate
    limit's timer, a dead worker's slot): the queues' lines are woken as wholes."""
    woken = wake_group(group) or 0
    for queue in groups.throttled_queues(group=group):
        woken += wake_queue(queue) or 0
    return woken


def _room(group: str, limits: resources.Limits, now: datetime, waiting: bool | None = True
          ) -> tuple[int, resources.Load]:
    """How many more of ``group``'s steps may start now (under its lock), and its load. When
    none may because of its rate limit and steps wait (``waiting``; None: look), its timer
    is set for the moment one more fits."""
    load = groups.load(limits, now)
    free = resources.free_slots(limits, load)
    if free <= 0 and limits.rate is not None and load.starts_in_window >= limits.rate[0] and \
            (waiting or (waiting is None and groups.waiting([group], 1))):
        _set_timer(group, limits.rate[1], now)
    return free, load


def _keep_or_publish(woken: list[tuple[int, int, int, float | None]], keep: bool
                     ) -> int | None:
    """Publish the woken rows, except, with ``keep``, the best one without a timeout: that
    one's id is returned for the caller to run (see :func:`release`)."""
    kept = next((row[0] for row in woken if row[3] is None), None) if keep else None
    _publish_woken([row for row in woken if row[0] != kept])
    return kept


def wake_group(group: str, limits: resources.Limits | None = None,
               now: datetime | None = None, *, keep: bool = False) -> int | None:
    """Wake as many of ``group``'s throttled steps (those under no queue budget) as its free
    slots allow, best first, and publish them. ``limits``: as the caller knows them, else as
    the best waiting row was throttled under. With ``keep``, the best woken step without a
    timeout is returned instead of published (see :func:`release`); otherwise, how many
    were woken."""
    now = now or timezone.now()
    with transaction.atomic():
        groups.lock(group, None)
        if limits is None:
            best = groups.waiting([group], 1)
            if not best:
                return None if keep else 0
            limits = limits_from_record(group, groups.throttle_record(best[0].id))
        free, _ = _room(group, limits, now, waiting=None)
        if free <= 0:
            return None if keep else 0
        order = resources.wake_order(groups.waiting([group], free), {group: free})
        woken = groups.wake(order, now)
        kept = _keep_or_publish(woken, keep)
    return kept if keep else len(woken)


def wake_queue(queue: str, now: datetime | None = None, *, keep: bool = False) -> int | None:
    """Wake the steps waiting for ``queue``'s cost budget, in whatever group, as many as its
    free budget fits (at least one when nothing holds any): highest priority first, then
    round-robin across their groups (the keys of a family such as ``tenant:*`` share the
    queue's budget, and a tenant with 1,000 waiting steps must not starve one with 5), then
    oldest; each group's own limits hold too. With ``keep``, as :func:`release`; otherwise
    how many were woken."""
    now = now or timezone.now()
    budget = settings.QUEUE_COST_BUDGETS.get(queue)
    # No group can take more than the whole budget's worth (each step costs at least 1).
    share = max(int(budget or 1), 1)
    with transaction.atomic():
        groups.lock(None, queue)  # the queue's lock first, then its groups' (groups.lock)
        candidates, records = groups.waiting_for_queue(queue, min(4 * share, 200), share)
        if not candidates:
            return None if keep else 0
        named = sorted(name for name in records if name)
        groups.lock_groups(named)
        free, holding = {"": len(candidates)}, {}
        for name in named:
            free[name], load = _room(name, limits_from_record(name, records[name]), now)
            holding[name] = load.in_flight
        running = 0 if budget is None else groups.load(
            resources.Limits(None, queue=queue, queue_cost=budget), now).queue_cost
        chosen: list[int] = []
        costs = {row.id: row.cost for row in candidates}
        for pk in resources.wake_order(candidates, free, holding):
            if budget is not None and running and running + costs[pk] > budget:
                break  # the best that does not fit waits first in line, not overtaken
            running += costs[pk]
            chosen.append(pk)
        woken = groups.wake(chosen, now)
        kept = _keep_or_publish(woken, keep)
    return kept if keep else len(woken)


def hand_back(step_run_id: int) -> None:
    """Publish a woken step a worker process kept (:func:`release`) but will not run now."""
    row = groups.woken_row(step_run_id)
    if row is not None:
        _publish_woken([row])


def wake_all(now: datetime) -> int:
    """Wake every group's throttled steps into their free slots (the sweeper's backstop for
    a wake-up that was lost, or a limit the site raised); returns how many were woken."""
    woken = 0
    for group in groups.throttled_groups():
        woken += wake_group(group, now=now) or 0
    for queue in groups.throttled_queues():
        woken += wake_queue(queue, now) or 0
    return woken


def _publish_woken(woken: list[tuple[int, int, int, float | None]]) -> None:
    messages = []
    for pk, definition_pk, index, timeout in woken:
        spec = load_spec(definition_pk)
        messages.append(publish.step_message(spec, pk, index, timeout))
    publish.publish_on_commit(messages)
