"""Waking throttled steps: when an admitted attempt gives its slot back, when a rate limit's
window reopens, when a dead worker's slot is recovered, and the sweeper's backstop.

A group's throttled steps are woken into its free slots, highest priority first, then oldest
(:func:`wake_group`). Steps waiting for a queue's cost budget stand in one line per queue,
whatever their group, and are woken as far as the budget's free cost fits: highest priority
first, then round-robin across their groups, then oldest, each group's own limits holding too
(:func:`wake_queue`). A woken step is pending, holds its slot (and its share of the queue's
budget) and has its message on the way, or is handed to the releasing process to run next
when it is for that process's queue.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from queuety import exceptions, publish
from queuety.conf import settings
from queuety.core import resources
from queuety.runtime.gates import limits_from_record, set_rate_timer
from queuety.store import groups, locks
from queuety.store.definitions import load_spec

#: How soon a queue's waker looks again for a group whose lock was busy (at most once per
#: group and process in that time), doubling for each retry that finds it busy again, and
#: how many retries at most (0.05 + 0.1 + ... + 0.8 s; then the sweeper's pass).
BUSY_RETRY_SECONDS = 0.05
BUSY_RETRIES = 5

#: Woken rows: ``(id, definition id, step index, timeout)``.
Woken = list[tuple[int, int, int, float | None]]

_retries_sent: dict[str, float] = {}
_retries_lock = threading.Lock()


def release(limits: resources.Limits | None, *, keep: bool = False) -> int | None:
    """An admitted attempt under ``limits`` ended (completed, failed, retried or recovered):
    wake the throttled steps its slot, and any other free one, lets start: its queue's line
    when it ran under a queue's cost budget, then its group's.

    With ``keep``, the best woken step without a timeout and for the same Celery queue is not
    published but returned: the caller (the worker process whose slot it takes) runs it next,
    with no broker hop, or hands it back with :func:`hand_back`. Call after the attempt's
    outcome committed, so the count sees its slot free.
    """
    if limits is None:
        return None
    kept = None
    done: set[str] = set()
    if limits.queue is not None and limits.queue_cost is not None:
        floors = None if limits.group is None else _floors(limits.group, None)
        kept = wake_queue(limits.queue, keep=keep, floors=floors)
        done.add(limits.queue)
    if limits.group is not None:
        handed = wake_group(limits.group, limits, keep=keep and kept is None,
                            on_queue=limits.queue, done=done)
        kept = kept if kept is not None or not keep else handed
    return kept if keep else None


def wake_group(group: str, limits: resources.Limits | None = None,
               now: datetime | None = None, *, keep: bool = False,
               on_queue: str | None = None, done: set[str] | frozenset[str] = frozenset(),
               wait: bool = True, retry: int = 0, plain: bool = False) -> int | None:
    """Wake as many of ``group``'s throttled steps as its free slots (and cost budget)
    allow, best first. A step of it that waits in a queue's line is woken through that line
    (:func:`wake_queue`, for each such queue not in ``done``), keeping its place: the group's
    steps in no line that come after it take only the slots the line leaves.
    ``limits``: as the caller knows them, else as the best waiting row was throttled under.

    With ``keep``, the best woken step without a timeout whose Celery queue is ``on_queue``
    is returned instead of published (see :func:`release`); otherwise, how many were woken.
    Without ``wait`` (a retry after a queue's line found the group busy), the group is left
    alone if its lock is busy again, and its lines are looked at whatever its own slots (a
    line that finds it busy again retries later). With ``plain``, only its steps in no line
    are woken (what the lines left).
    """
    now = now or timezone.now()
    lines: set[str] = set()
    if not wait:
        lines = set(groups.throttled_queues(group=group)) - set(done)
    rows: list[resources.Waiting] = []
    woken: Woken = []
    kept = None
    with transaction.atomic():
        if wait:
            _lock_or_raise(group, None)
            locked = True
        else:
            locked = bool(groups.try_lock_groups([group]))
        if locked and limits is None:
            first = groups.waiting([group], 1)
            limits = None if not first else limits_from_record(
                group, groups.throttle_record(first[0].id))
        if locked and limits is not None:
            limits = replace(limits, queue=None, queue_cost=None)  # its line decides that
            load = groups.load(limits, now)
            free = _free(group, limits, load, now, waiting=None)
            rows = groups.waiting([group], free, plain=plain) if free > 0 else []
            # The steps in no line before the group's first step in one; that one and the
            # rest wait for what its line leaves.
            cut = next((n for n, row in enumerate(rows) if row.queue), len(rows))
            woken = groups.wake(resources.within_budgets(
                rows[:cut], group_budgets={group: (limits.group_cost, load.group_cost)}), now)
            kept = _keep_or_publish(woken, keep, on_queue)
    count = len(woken)
    in_line = [row for row in rows if row.queue]
    lines |= {row.queue for row in in_line} - set(done)
    if lines:
        # A line wakes this group's steps only as far as they come before its best in no
        # line that is still waiting.
        woken_ids = {row[0] for row in woken}
        floors = _floors(group, next((row for row in rows if not row.queue
                                      and row.id not in woken_ids), None))
        for queue in sorted(lines):
            mine = keep and kept is None and queue == on_queue
            found = wake_queue(queue, now, keep=mine, retry=retry, floors=floors)
            if mine:
                kept = found
            elif not keep:
                count += found or 0
    if in_line and limits is not None:
        # What the lines left of the slots goes to the group's steps in no line.
        again = wake_group(group, limits, now, keep=keep and kept is None, on_queue=on_queue,
                           wait=wait, plain=True)
        if keep and kept is None:
            kept = again
        elif not keep:
            count += again or 0
    return kept if keep else count


def wake_freed(freed: set[str], queues: set[str]) -> None:
    """Slots of groups ``freed`` and shares of ``queues``' budgets were given back at once (a
    dead worker's attempts, recovered): wake those queues' lines, then those groups, each
    group's steps in a line not overtaking its better ones in none."""
    floors: dict[str, tuple[int, int]] = {}
    for group in sorted(freed):
        floors.update(_floors(group, None) or {})
    for queue in sorted(queues):
        wake_queue(queue, floors=floors or None)
    for group in sorted(freed):
        wake_group(group, done=queues)


def _floors(group: str, better: resources.Waiting | None
            ) -> dict[str, tuple[int, int]] | None:
    """The floor of ``group``'s steps in a queue's line: its best step in no line that
    still waits (``better``, else looked up), which none of them may overtake."""
    if better is None:
        found = groups.waiting([group], 1, plain=True)
        better = found[0] if found else None
    return None if better is None else {group: (better.priority, better.id)}


def wake_queue(queue: str, now: datetime | None = None, *, keep: bool = False,
               floors: dict[str, tuple[int, int]] | None = None, retry: int = 0
               ) -> int | None:
    """Wake the steps waiting for ``queue``'s cost budget, in whatever group, as many as its
    free budget fits (at least one when nothing holds any): highest priority first, then
    round-robin across their groups (the keys of a family such as ``tenant:*`` share the
    queue's budget, and a tenant with 1,000 waiting steps must not starve one with 5), then
    oldest; each group's own limits hold too. With ``keep``, as :func:`release` (the steps in
    this line are all for ``queue``); otherwise how many were woken. ``floors``: see
    ``core.resources.within_budgets``; ``retry``: how many retries of a busy group led here.

    The round-robin goes on across wake-ups: the group holding the fewest of the queue's
    steps goes next, and of those holding as many, the one served longest ago.
    """
    now = now or timezone.now()
    budget = settings.QUEUE_COST_BUDGETS.get(queue)
    # No group can take more than the whole budget's worth (each step costs at least 1); a
    # removed budget releases its whole line.
    share = 200 if budget is None else max(int(budget), 1)
    with transaction.atomic():
        _lock_or_raise(None, queue)
        line = groups.waiting_for_queue(queue, min(4 * share, 200), share)
        candidates, records = line.rows, line.records
        if not candidates:
            return None if keep else 0
        named = sorted(name for name in records if name)
        # Only the group locks that are free: a busy one may be held by a long transaction
        # (one landing several runs' steps), and this queue's admissions must not wait for it.
        locked = groups.try_lock_groups(named)
        busy = [name for name in named if name not in locked]
        limits = {name: replace(limits_from_record(name, records[name]), queue=None,
                                queue_cost=None) for name in locked}
        free = {"": len(candidates)}
        loads = groups.loads(limits, now)
        for name, load in loads.items():
            free[name] = _free(name, limits[name], load, now, waiting=True)
        holding = groups.holding_on_queue(queue)
        running = sum(cost for _, cost in holding.values())
        order = resources.wake_order(candidates, free,
                                     {name: n for name, (n, _) in holding.items()},
                                     line.served)
        by_id = {row.id: row for row in candidates}
        chosen = resources.within_budgets(
            [by_id[pk] for pk in order], queue_budget=budget, queue_running=running,
            group_budgets={name: (limits[name].group_cost, loads[name].group_cost)
                           for name in limits},
            # A busy group's best is not overtaken by a lower priority.
            outranked_by=max((row.priority for row in candidates if row.group in busy),
                             default=None),
            floors=floors)
        woken = groups.wake(chosen, now)
        groups.mark_served({by_id[row[0]].group for row in woken if by_id[row[0]].group})
        if busy and (budget is None or running + sum(by_id[pk].cost for pk in chosen) < budget):
            _retry_later(busy, retry)  # room is left while their steps wait
        kept = _keep_or_publish(woken, keep, queue)
    return kept if keep else len(woken)


def hand_back(step_run_id: int) -> None:
    """Publish a woken step a worker process kept (:func:`release`) but will not run now."""
    row = groups.woken_row(step_run_id)
    if row is not None:
        _publish_woken([row])


def wake_all(now: datetime) -> int:
    """Wake every group's throttled steps into their free slots and every queue's line into
    its free budget (the sweeper's backstop for a wake-up that was lost, or a limit the site
    raised); returns how many were woken."""
    woken = 0
    queues = frozenset(groups.throttled_queues())
    for queue in sorted(queues):
        woken += wake_queue(queue, now) or 0
    for group in groups.throttled_groups():
        woken += wake_group(group, now=now, done=queues) or 0
    return woken


def _free(group: str, limits: resources.Limits, load: resources.Load, now: datetime, *,
          waiting: bool | None) -> int:
    """How many more of ``group``'s steps may start now (under its lock), given its load, by
    its concurrency and rate limits (its cost budget is counted row by row, each with its own
    cost: ``core.resources.within_budgets``), at most a line's worth. When none may because
    of its rate limit and steps wait (``waiting``; None: look), its timer is set for the
    moment one more fits."""
    free = min(resources.free_slots(replace(limits, group_cost=None), load), 200)
    if free <= 0 and limits.rate is not None and load.starts_in_window >= limits.rate[0] and \
            (waiting or (waiting is None and groups.waiting([group], 1))):
        set_rate_timer(group, limits.rate[1], now)
    return free


def _retry_later(busy: list[str], retry: int) -> None:
    """Ask a worker to look at the busy groups again shortly, without waiting for their locks
    (``queuety.wake_group`` with ``wait=False``): after :data:`BUSY_RETRY_SECONDS`, doubling
    for each retry that found a group busy again, :data:`BUSY_RETRIES` times at most (then the
    sweeper's pass), and at most once per group and process in that time, so a group held
    by a long transaction sends no storm of retries."""
    if retry >= BUSY_RETRIES:
        return
    delay = BUSY_RETRY_SECONDS * 2 ** retry
    moment = time.monotonic()
    with _retries_lock:
        due = [name for name in busy if moment - _retries_sent.get(name, -delay) >= delay]
        for name in due:
            _retries_sent[name] = moment
        if len(_retries_sent) > 10_000:  # forget groups not seen for a while
            for name in [n for n, at in _retries_sent.items() if moment - at > 60]:
                del _retries_sent[name]
    for name in due:
        publish.wake_group_on_commit(name, delay, wait=False, retry=retry + 1)


def _lock_or_raise(group: str | None, queue: str | None) -> None:
    """Take a group's or a queue's lock for a waker, which runs in a transaction of its own,
    so it waits; inside one that already holds a resource lock it only tries
    (``queuety.store.locks``), and raises when the lock is busy."""
    mode = locks.TRY if locks.holding() else locks.WAIT
    if not groups.lock(group, queue, mode):
        raise exceptions.QueuetyError(
            f"The wake-up of {'group ' + repr(group) if group else 'queue ' + repr(queue)} ran "
            "inside a transaction that holds another group's lock, and this one was busy; "
            "wake-ups run in transactions of their own.")


def _keep_or_publish(woken: Woken, keep: bool, on_queue: str | None) -> int | None:
    """Publish the woken rows, except, with ``keep``, the best one without a timeout whose
    Celery queue is ``on_queue`` (the releasing process's): that one's id is returned for the
    caller to run (see :func:`release`)."""
    kept = None
    if keep:
        kept = next((pk for pk, definition_pk, index, timeout in woken if timeout is None and
                     (load_spec(definition_pk).queue_of(index) or settings.QUEUE) == on_queue),
                    None)
    _publish_woken([row for row in woken if row[0] != kept])
    return kept


def _publish_woken(woken: Woken) -> None:
    messages = []
    for pk, definition_pk, index, timeout in woken:
        spec = load_spec(definition_pk)
        messages.append(publish.step_message(spec, pk, index, timeout))
    publish.publish_on_commit(messages)
