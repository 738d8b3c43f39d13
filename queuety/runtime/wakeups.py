"""Waking throttled steps: when an admitted attempt gives its slot back, when a rate limit's
window reopens, when a dead worker's slot is recovered, and the sweeper's backstop.

A group's throttled steps are woken into its free slots, highest priority first, then oldest
(:func:`wake_group`). Steps waiting for a queue's cost budget stand in one line per queue,
whatever their group, and are woken as far as the budget's free cost fits: highest priority
first, then round-robin across their groups, then oldest, each group's own limits holding too
(:func:`wake_queue`). A woken step is pending, holds its slot (and its share of the queue's
budget) and has its message on the way, or is handed to the releasing process to run next
when it is for that process's queue.

A wake-up is a list of passes (``core.wake_plan.GroupPass``, ``LinePass``), each in a
transaction of its own under one lock: the group's, or the queue's (which then only tries its
groups', except the group whose pass asked for it: that lock it waits for with the queue's,
as a gate does). Each pass reads what it decides from (:func:`_look_at_group`,
:func:`_look_at_line`), ``core.wake_plan.plan_wake`` decides, and :func:`_write` writes the
plan; the passes the plan asks for next (a group's lines, then what they left to its steps in
no line) run right after it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from queuety import exceptions, publish
from queuety.conf import settings
from queuety.core import resources, wake_plan
from queuety.core.wake_plan import GroupPass, LinePass
from queuety.runtime.gates import limits_from_record, set_rate_timer
from queuety.store import groups, locks
from queuety.store.definitions import load_spec

#: Woken rows: ``(id, definition id, step index, timeout)``.
Woken = list[tuple[int, int, int, float | None]]

#: When this process last asked for each ``(group, retry attempt)``'s retry.
_retries_sent: dict[tuple[str, int], float] = {}
_retries_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Wakeup:
    """What a wake-up did."""

    woken: int = 0
    """How many throttled steps it woke (the one kept included)."""
    kept: int | None = None
    """The woken step handed to the caller to run next, not published (:func:`release`)."""


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
    return _run(wake_plan.release_passes(limits), keep=keep, on_queue=limits.queue).kept


def wake_group(group: str, now: datetime | None = None, *, busy_retry: bool = False,
               retry: int = 0) -> int:
    """Wake as many of ``group``'s throttled steps as its free slots (and cost budget) allow,
    best first, under the limits its best waiting step was throttled under; its steps that
    wait in a queue's line through that line, keeping their place. Returns how many were
    woken. ``busy_retry``: a retry after a queue's line found the group's lock busy (then
    ``retry`` says how many came before), which leaves the group alone if it is busy again
    and wakes its lines whatever its own slots."""
    return _run([GroupPass(group, busy_retry=busy_retry, retry=retry)], now).woken


def wake_queue(queue: str, now: datetime | None = None) -> int:
    """Wake the steps waiting for ``queue``'s cost budget, in whatever group, as many as its
    free budget fits (at least one when nothing holds any): highest priority first, then
    round-robin across their groups (the keys of a family such as ``tenant:*`` share the
    queue's budget, and a tenant with 1,000 waiting steps must not starve one with 5), then
    oldest; each group's own limits hold too. Returns how many were woken.

    The round-robin goes on across wake-ups: the group holding the fewest of the queue's
    steps goes next, and of those holding as many, the one served longest ago.
    """
    return _run([LinePass(queue)], now).woken


def wake_freed(freed: set[str], queues: set[str]) -> None:
    """Slots of groups ``freed`` and shares of ``queues``' budgets were given back at once (a
    dead worker's attempts, recovered): wake those queues' lines, then those groups, each
    group's steps in a line not overtaking its better ones in none."""
    floors = _floors(sorted(freed))
    _run([LinePass(queue, floors) for queue in sorted(queues)]
         + [GroupPass(group, done=frozenset(queues)) for group in sorted(freed)])


def wake_all(now: datetime) -> int:
    """Wake every group's throttled steps into their free slots and every queue's line into
    its free budget (the sweeper's backstop for a wake-up that was lost, or a limit the site
    raised); returns how many were woken."""
    queues = frozenset(groups.throttled_queues())
    woken = _run([LinePass(queue) for queue in sorted(queues)], now).woken
    return woken + _run([GroupPass(group, done=queues)
                         for group in groups.throttled_groups()], now).woken


def hand_back(step_run_id: int) -> None:
    """Publish a woken step a worker process kept (:func:`release`) but will not run now."""
    row = groups.woken_row(step_run_id)
    if row is not None:
        _publish_woken([row])


def _run(passes: Sequence[wake_plan.Pass], now: datetime | None = None, *, keep: bool = False,
         on_queue: str | None = None) -> Wakeup:
    """Run the wake-up ``passes`` in order, each one's follow-ups right after it. With
    ``keep``, the first pass that wakes an untimed step for Celery queue ``on_queue`` hands
    it to the caller instead of publishing it (``core.wake_plan.hand_off``)."""
    todo = list(reversed(passes))
    woken, kept = 0, None
    while todo:
        asked = todo.pop()
        plan, done = _pass(asked, now or timezone.now(), keep=keep and kept is None,
                           on_queue=on_queue)
        woken += done.woken
        kept = done.kept if kept is None else kept
        todo.extend(reversed(plan.then))
    return Wakeup(woken, kept)


def _pass(asked: wake_plan.Pass, now: datetime, *, keep: bool, on_queue: str | None
          ) -> tuple[wake_plan.WakePlan, Wakeup]:
    """One pass, in a transaction of its own: read under its lock, decide, write."""
    with transaction.atomic():
        seen = _look_at_group(asked, now) if isinstance(asked, GroupPass) else \
            _look_at_line(asked, now)
        plan = wake_plan.plan_wake(seen)
        woken = _write(plan, now)
        kept = _keep_or_publish(woken, keep, on_queue)
    return plan, Wakeup(len(woken), kept)


def _look_at_group(asked: GroupPass, now: datetime) -> wake_plan.GroupSnapshot:
    """What a group's pass decides from, read under the group's lock: its limits, its load,
    its best waiting steps, as many as it has room for, and, for a retry, its lines."""
    lines: frozenset[str] = frozenset()
    if asked.busy_retry and not asked.plain:
        lines = frozenset(groups.throttled_queues(group=asked.group))
    if not _lock(asked.group, None, busy_retry=asked.busy_retry):
        return wake_plan.GroupSnapshot(asked, lines=lines)
    limits = _recorded_limits(asked.group) if asked.limits is None else asked.limits
    if limits is None:
        return wake_plan.GroupSnapshot(asked, lines=lines)
    limits = replace(limits, queue=None, queue_cost=None)  # its lines decide that
    load = groups.load(limits, now)
    room = wake_plan.group_room(limits, load)
    rows = groups.waiting([asked.group], room, plain=asked.plain) if room > 0 else []
    # Whether any step waits for its rate window to reopen (then its timer is set).
    waiting = bool(rows) or (wake_plan.rate_full(limits, load)
                             and bool(groups.waiting([asked.group], 1)))
    return wake_plan.GroupSnapshot(asked, limits, load, tuple(rows), waiting, lines)


def _recorded_limits(group: str) -> resources.Limits | None:
    """The limits ``group``'s best waiting step was throttled under (None: none waits)."""
    first = groups.waiting([group], 1)
    return None if not first else limits_from_record(group,
                                                     groups.throttle_record(first[0].id))


def _look_at_line(asked: LinePass, now: datetime) -> wake_plan.LineSnapshot:
    """What a queue's line decides from, read under the queue's lock: its best steps, the
    limits and loads of their groups whose locks are free, which are busy, what each holds of
    the queue's budget and when each was served."""
    found = settings.QUEUE_COST_BUDGETS.get(asked.queue)
    budget = None if found is None else int(found)
    _lock(asked.waits_for, asked.queue, busy_retry=False)
    floors = {**asked.floors, **_floors(asked.floors_of)}
    line = groups.waiting_for_queue(asked.queue, *wake_plan.line_window(budget))
    if not line.rows:
        return wake_plan.LineSnapshot(asked, budget)
    named = sorted(name for name in line.records if name)
    # Only the group locks that are free: a busy one may be held by a long transaction
    # (one landing several runs' steps), and this queue's admissions must not wait for it.
    # The one waited for above is held already (advisory locks are re-entrant).
    locked = groups.try_lock_groups(named)
    limits = {name: replace(limits_from_record(name, line.records[name]), queue=None,
                            queue_cost=None) for name in named if name in locked}
    return wake_plan.LineSnapshot(
        asked, budget, tuple(line.rows), limits, groups.loads(limits, now),
        frozenset(named) - locked, groups.holding_on_queue(asked.queue), line.served, floors)


def _floors(names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Each group's floor in a queue's line: its best step in no line that still waits, which
    none of its steps in a line may overtake (a group with none has no floor)."""
    floors = {}
    for name in names:
        best = groups.waiting([name], 1, plain=True)
        if best:
            floors[name] = (best[0].priority, best[0].id)
    return floors


def _lock(group: str | None, queue: str | None, *, busy_retry: bool) -> bool:
    """Take a group's or a queue's lock for a waker, which runs in a transaction of its own,
    so it waits (``queuety.store.locks``). A retry of a busy group only tries (False: busy
    again). Inside a transaction that already holds a resource lock it only tries too, and
    raises when the lock is busy."""
    mode = locks.TRY if busy_retry or locks.holding() else locks.WAIT
    if groups.lock(group, queue, mode):
        return True
    if busy_retry:
        return False
    raise exceptions.QueuetyError(
        f"The wake-up of {'group ' + repr(group) if group else 'queue ' + repr(queue)} ran "
        "inside a transaction that holds another group's lock, and this one was busy; "
        "wake-ups run in transactions of their own.")


def _write(plan: wake_plan.WakePlan, now: datetime) -> Woken:
    """Write what a pass decided: wake its rows, mark the groups served, set the timers and
    ask for the retries. Returns the rows woken (a row that moved meanwhile is not)."""
    woken = groups.wake(list(plan.wake), now)
    groups.mark_served(set(plan.served))
    for timer in plan.timers:
        set_rate_timer(timer.group, timer.period, now)
    if plan.retry is not None:
        _retry_later(plan.retry)
    return woken


def _retry_later(retry: wake_plan.Retry) -> None:
    """Ask a worker to look at the busy groups again in ``retry.delay`` s, without waiting for
    their locks (``queuety.wake_group`` with ``wait=False``), at most once per group, retry
    attempt and process in that time, so a group held by a long transaction sends no storm of
    retries. Counted per attempt: a retry that finds the group busy again sends the next one
    even when the retry before it left this process less than the new delay ago (keyed by the
    group alone, that one was dropped, and the step waited for the sweeper's next pass)."""
    moment = time.monotonic()
    with _retries_lock:
        due = [name for name in retry.groups
               if moment - _retries_sent.get((name, retry.attempt), -retry.delay)
               >= retry.delay]
        for name in due:
            _retries_sent[(name, retry.attempt)] = moment
        if len(_retries_sent) > 10_000:  # forget groups not seen for a while
            for key in [key for key, at in _retries_sent.items() if moment - at > 60]:
                del _retries_sent[key]
    for name in due:
        publish.wake_group_on_commit(name, retry.delay, wait=False, retry=retry.attempt)


def _keep_or_publish(woken: Woken, keep: bool, on_queue: str | None) -> int | None:
    """Publish the woken rows, except, with ``keep``, the best one without a timeout whose
    Celery queue is ``on_queue`` (the releasing process's): that one's id is returned for the
    caller to run (see :func:`release`)."""
    kept = None
    if keep:
        kept = wake_plan.hand_off([wake_plan.WokenStep(
            pk, load_spec(definition_pk).queue_of(index) or settings.QUEUE, timeout is not None)
            for pk, definition_pk, index, timeout in woken], on_queue)
    _publish_woken([row for row in woken if row[0] != kept])
    return kept


def _publish_woken(woken: Woken) -> None:
    messages = []
    for pk, definition_pk, index, timeout in woken:
        spec = load_spec(definition_pk)
        messages.append(publish.step_message(spec, pk, index, timeout))
    publish.publish_on_commit(messages)
