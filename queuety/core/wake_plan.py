"""Wake-ups, the pure part: which throttled steps a freed slot or budget wakes, and in what order.

A waker looks at one lock's worth at a time: a group's own steps under its lock
(:class:`GroupPass`), or a queue's line under the queue's lock (:class:`LinePass`). The runtime
(``queuety.runtime.wakeups``) reads what a pass decides from (:class:`GroupSnapshot`,
:class:`LineSnapshot`), :func:`plan_wake` decides, and the runtime writes the plan and runs the
passes it asks for next (:attr:`WakePlan.then`), one after another. The rules it applies (the
order of waiting steps, the budgets) are ``queuety.core.resources``'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from queuety.core.resources import (
    Limits,
    Load,
    RateTimer,
    Waiting,
    free_slots,
    wake_order,
    within_budgets,
)

#: At most this many of a group's steps are woken by one pass (and read for it).
WAKE_BATCH = 200

#: How soon a queue's waker looks again for a group whose lock was busy (at most once per
#: group and process in that time), doubling for each retry that finds it busy again, and
#: how many retries at most (0.05 + 0.1 + ... + 0.8 s; then the sweeper's pass).
BUSY_RETRY_SECONDS = 0.05
BUSY_RETRIES = 5


@dataclass(frozen=True, slots=True)
class GroupPass:
    """Wake ``group``'s throttled steps into its free slots, under its lock. Its steps that
    wait in a queue's line are woken through that line (a :class:`LinePass`, keeping their
    place); its steps in no line that come after one of them take what the lines leave (a
    second pass, ``plain``)."""

    group: str
    limits: Limits | None = None
    """As the caller knows them; None: as its best waiting step was throttled under."""
    done: frozenset[str] = frozenset()
    """Queues whose lines the caller wakes itself (not again)."""
    plain: bool = False
    """Only its steps in no line: what the lines left of its slots."""
    busy_retry: bool = False
    """A retry after a queue's line found its lock busy: only tries the lock (a busy group is
    left alone), and wakes the lines its steps wait in, whatever its own slots."""
    retry: int = 0
    """How many retries of a busy group led here."""


@dataclass(frozen=True, slots=True)
class LinePass:
    """Wake the steps waiting for ``queue``'s cost budget, of every group, under its lock."""

    queue: str
    floors: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """``group: (priority, id)``: the group's best step in no line, which none of its steps
    in this line may overtake (see :func:`within_budgets`)."""
    floors_of: tuple[str, ...] = ()
    """Groups whose floor is looked up when the pass runs (their best step in no line that
    still waits)."""
    retry: int = 0
    """How many retries of a busy group led here."""
    waits_for: str | None = None
    """The group whose pass asked for this one: its lock is waited for with the queue's, as
    a gate does (the queue's, then the group's), not only tried. Between the two passes
    another waker (the sweeper's) may hold it for a moment, and the group's steps in this
    line would wait for a retry a broker hop away, or for the sweeper's next pass."""


Pass = GroupPass | LinePass


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """What a :class:`GroupPass` read under its group's lock."""

    asked: GroupPass
    limits: Limits | None = None
    """What bounds the group (a queue's budget left to its lines); None: its lock was busy,
    or no step of it waits."""
    load: Load = Load()
    rows: tuple[Waiting, ...] = ()
    """Its best waiting steps (with ``asked.plain``, those in no line), as many as its
    :func:`group_room`."""
    waiting: bool = False
    """Whether any step of it waits (looked at when its rate limit leaves no room: its timer)."""
    lines: frozenset[str] = frozenset()
    """With ``asked.busy_retry``: the queues its steps wait in."""


@dataclass(frozen=True, slots=True)
class LineSnapshot:
    """What a :class:`LinePass` read under its queue's lock."""

    asked: LinePass
    budget: int | None = None
    """The queue's cost budget (None: removed; its whole line is released)."""
    rows: tuple[Waiting, ...] = ()
    """The line's best steps (:func:`line_window`)."""
    limits: Mapping[str, Limits] = dataclasses.field(default_factory=dict)
    """Each group of the line whose lock was taken (without the queue's budget)."""
    loads: Mapping[str, Load] = dataclasses.field(default_factory=dict)
    busy: frozenset[str] = frozenset()
    """Groups of the line whose lock was busy (held by a long transaction)."""
    holding: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """What each group (``""``: none) holds of the queue's budget: ``(steps, cost)``."""
    served: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """When each group was last served from a line (absent: never)."""
    floors: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """The pass's floors, looked up."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Look again at ``groups`` (whose locks a line found busy) in ``delay`` seconds, trying
    their locks: a wake-up carrying ``attempt``."""

    groups: tuple[str, ...]
    attempt: int
    delay: float


@dataclass(frozen=True, slots=True)
class WakePlan:
    """What one wake-up pass writes (:func:`plan_wake`)."""

    wake: tuple[int, ...] = ()
    """The throttled rows to wake, best first."""
    timers: tuple[RateTimer, ...] = ()
    served: frozenset[str] = frozenset()
    """Groups served from a queue's line now (their turn goes round)."""
    retry: Retry | None = None
    then: tuple[Pass, ...] = ()
    """The passes to run next, in order, each under its own lock."""


@dataclass(frozen=True, slots=True)
class WokenStep:
    """A step just woken, as the hand-off to the releasing process sees it."""

    id: int
    queue: str | None
    """Its Celery queue."""
    timed: bool
    """It has a timeout: it runs under its own message, whose time limit backs its deadline."""


def group_room(limits: Limits, load: Load) -> int:
    """How many more of a group's steps may start now by its concurrency and rate limits, at
    most :data:`WAKE_BATCH` (its cost budget is counted row by row, each with its own cost:
    :func:`within_budgets`)."""
    return min(free_slots(replace(limits, group_cost=None), load), WAKE_BATCH)


def rate_full(limits: Limits, load: Load) -> bool:
    """Whether the group's rate limit lets no more start in its current window."""
    return limits.rate is not None and load.starts_in_window >= limits.rate[0]


def line_window(budget: int | None) -> tuple[int, int]:
    """How many of a queue's waiting steps its line reads, and how many of them per group.
    No group can take more than the whole budget's worth (each step costs at least 1), and
    four budgets' worth (at most :data:`WAKE_BATCH`) lets the groups take turns; a removed
    budget releases its whole line."""
    share = WAKE_BATCH if budget is None else max(int(budget), 1)
    return min(4 * share, WAKE_BATCH), share


def release_passes(limits: Limits) -> tuple[Pass, ...]:
    """The wake-up of a step under ``limits`` that gave its slot back: its queue's line when
    it ran under the queue's cost budget (its group's steps in the line not overtaking its
    best in none), then its group."""
    passes: list[Pass] = []
    done: frozenset[str] = frozenset()
    if limits.queue is not None and limits.queue_cost is not None:
        # The group's lock waited for with the queue's (in the gates' order), not only tried:
        # a waker holding it a moment must not leave the step to a retry or the sweeper.
        passes.append(LinePass(limits.queue, floors_of=() if limits.group is None
                               else (limits.group,), waits_for=limits.group))
        done = frozenset({limits.queue})
    if limits.group is not None:
        passes.append(GroupPass(limits.group, limits, done=done))
    return tuple(passes)


def plan_wake(snapshot: GroupSnapshot | LineSnapshot) -> WakePlan:
    """Decide one wake-up pass from what it read under its lock: which throttled rows to wake,
    which timers to set, which busy groups to look at again, and which passes follow.

    A group's pass wakes its best steps into its free slots, highest priority first, then
    oldest, as far as its cost budget fits, up to its first step that waits in a queue's line:
    that one wakes through its line, then what the line leaves goes to the group's steps in no
    line. A queue's line wakes as far as the queue's budget fits: highest priority first, then
    the group holding the fewest of the queue's steps, then the one served longest ago, then
    oldest; each group's own limits hold too.
    """
    if isinstance(snapshot, LineSnapshot):
        return _plan_line(snapshot)
    return _plan_group(snapshot)


def _plan_group(seen: GroupSnapshot) -> WakePlan:
    """A group's pass (see :func:`plan_wake`)."""
    asked, limits = seen.asked, seen.limits
    if limits is None:  # its lock was busy, or nothing waits: a retry still wakes its lines
        return WakePlan(then=_lines_next(asked, seen.lines, None))
    room = group_room(limits, seen.load)
    rows = seen.rows if room > 0 else ()
    # Its steps in no line before its first step in one; that one and the rest wait for what
    # its line leaves.
    cut = next((n for n, row in enumerate(rows) if row.queue), len(rows))
    wake = within_budgets(list(rows[:cut]), group_budgets={
        asked.group: (limits.group_cost, seen.load.group_cost)})
    timers = _timer(asked.group, limits, seen.load) if seen.waiting else ()
    in_line = frozenset(row.queue for row in rows if row.queue)
    # A line wakes the group's steps only as far as they come before its best in no line.
    better = next((row for row in rows if not row.queue and row.id not in wake), None)
    then = _lines_next(asked, seen.lines | in_line, better)
    if in_line:  # what the lines leave of its slots goes to its steps in no line
        then += (replace(asked, limits=limits, plain=True),)
    return WakePlan(tuple(wake), timers, then=then)


def _lines_next(asked: GroupPass, lines: frozenset[str], better: Waiting | None
                ) -> tuple[Pass, ...]:
    """The line passes a group's pass asks for: each of ``lines`` it does not leave to its
    caller, with the group's floor (``better``, else looked up)."""
    floors = {} if better is None else {asked.group: (better.priority, better.id)}
    floors_of = () if better is not None else (asked.group,)
    # A retry of a busy group only tries its lock, in its lines too.
    waits_for = None if asked.busy_retry else asked.group
    return tuple(LinePass(queue, floors, floors_of, asked.retry, waits_for)
                 for queue in sorted(lines - asked.done))


def _timer(group: str, limits: Limits, load: Load) -> tuple[RateTimer, ...]:
    """The timer of a group whose steps wait when its rate limit lets none start now."""
    if limits.rate is None or not rate_full(limits, load):
        return ()
    return (RateTimer(group, limits.rate[1]),)


def _plan_line(seen: LineSnapshot) -> WakePlan:
    """A queue's line (see :func:`plan_wake`)."""
    if not seen.rows:
        return WakePlan()
    rooms = {name: group_room(limits, seen.loads[name]) for name, limits in seen.limits.items()}
    running = sum(cost for _, cost in seen.holding.values())
    order = wake_order(list(seen.rows), {"": len(seen.rows), **rooms},
                       {name: steps for name, (steps, _) in seen.holding.items()},
                       dict(seen.served))
    by_id = {row.id: row for row in seen.rows}
    chosen = within_budgets(
        [by_id[pk] for pk in order], queue_budget=seen.budget, queue_running=running,
        group_budgets={name: (limits.group_cost, seen.loads[name].group_cost)
                       for name, limits in seen.limits.items()},
        # A busy group's best is not overtaken by a lower priority.
        outranked_by=max((row.priority for row in seen.rows if row.group in seen.busy),
                         default=None),
        floors=dict(seen.floors))
    timers = tuple(timer for name, limits in seen.limits.items()
                   for timer in _timer(name, limits, seen.loads[name]))
    served = frozenset(by_id[pk].group for pk in chosen if by_id[pk].group)
    # Room is left while the busy groups' steps wait: look at them again soon.
    spent = running + sum(by_id[pk].cost for pk in chosen)
    room_left = seen.budget is None or spent < seen.budget
    return WakePlan(tuple(chosen), timers, served,
                    _retry(seen.busy, seen.asked.retry) if room_left else None)


def _retry(busy: frozenset[str], retry: int) -> Retry | None:
    """The retry of the busy groups of a line: after :data:`BUSY_RETRY_SECONDS`, doubling for
    each retry that found one busy again, :data:`BUSY_RETRIES` times at most (then the
    sweeper's pass)."""
    if not busy or retry >= BUSY_RETRIES:
        return None
    return Retry(tuple(sorted(busy)), retry + 1, BUSY_RETRY_SECONDS * 2 ** retry)


def hand_off(woken: Sequence[WokenStep], queue: str | None) -> int | None:
    """Of the steps a pass just woke, best first, the one handed to the releasing process to
    run next, with no broker hop: the best untimed one for its Celery queue ``queue``. The
    others are published."""
    return next((step.id for step in woken if not step.timed and step.queue == queue), None)
