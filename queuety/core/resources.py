"""Resource control, the pure part: concurrency groups, rate limits, cost budgets, priorities.

A step may name a *concurrency group* (``"openai"``, or a keyed family such as
``"tenant:{tenant_id}"`` formatted from the run's state), a limit of attempts in flight in that
group, a rate limit of starts per period, a priority and a Celery queue. This module resolves
those hints against the site's settings and decides whether one more attempt fits; the runtime
(``queuety.runtime.gates``) counts the live rows and applies the answer under a lock.
"""

from __future__ import annotations

import fnmatch
import string
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from queuety import exceptions

#: Priority words and the order they are claimed in (a larger number goes first).
PRIORITIES: dict[str, int] = {"high": 2, "normal": 1, "low": 0}
NORMAL = "normal"

#: Why a step was not started (the ``reason`` of ``throttled_by``).
CONCURRENCY, RATE, GROUP_COST, QUEUE_COST, MEMORY = (
    "concurrency", "rate", "group_cost", "queue_cost", "memory")


def check_group_template(step_name: str, group: Any) -> str:
    """Return ``group`` (a group name, maybe with ``{field}`` placeholders) if it is valid.

    Raises:
        WorkflowDefinitionError: it is not a non-blank string, or its placeholders are not
            plain state keys (``{tenant_id}``, not ``{0}``, ``{a.b}`` or ``{a!r}``).
    """
    if not isinstance(group, str) or not group.strip():
        raise exceptions.WorkflowDefinitionError(
            f"concurrency_group for step {step_name!r} must be a non-blank string, such as "
            f"'openai' or 'tenant:{{tenant_id}}' (got {group!r}).")
    try:
        parts = list(string.Formatter().parse(group))
    except ValueError as error:
        raise exceptions.WorkflowDefinitionError(
            f"concurrency_group {group!r} of step {step_name!r} is not a valid template "
            f"({error}); write state keys in braces, such as 'tenant:{{tenant_id}}'.") from None
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            raise exceptions.WorkflowDefinitionError(
                f"concurrency_group {group!r} of step {step_name!r} has the placeholder "
                f"{{{field}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}; a placeholder names one state key, "
                "such as {tenant_id}.")
    return group.strip()


def family_of(group: str) -> str:
    """The family of a group template: each ``{field}`` replaced by ``*``
    (``"tenant:{tenant_id}"`` -> ``"tenant:*"``); a plain name is its own family."""
    return "".join(literal + ("*" if field is not None else "")
                   for literal, field, _, _ in string.Formatter().parse(group))


def group_key(template: str, state: dict[str, Any], *, step_name: str, run_id: int) -> str:
    """Format a group template from a run's state (``"tenant:{tenant_id}"`` -> ``"tenant:7"``).

    Raises:
        WorkflowDefinitionError: the state lacks a field the template names, or holds a value
            that is not a string, a number or a boolean there.
    """
    values: dict[str, str] = {}
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        if field not in state:
            raise exceptions.WorkflowDefinitionError(
                f"Step {step_name!r} of run {run_id} uses concurrency group {template!r}, but "
                f"the run's state has no {field!r} key; put {field!r} in the payload or in an "
                "earlier step's output.")
        value = state[field]
        if isinstance(value, dict | list) or value is None:
            raise exceptions.WorkflowDefinitionError(
                f"Step {step_name!r} of run {run_id} uses concurrency group {template!r}, but "
                f"state[{field!r}] is {value!r}; a group key needs a string or a number there.")
        values[field] = str(value)
    return template.format(**values)


def check_limit(what: str, step_name: str, value: Any) -> int | None:
    """A limit given to a step (``concurrency_limit``, ``cost budget``): a whole number >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise exceptions.WorkflowDefinitionError(
            f"{what} for step {step_name!r} must be a whole number of at least 1 "
            f"(got {value!r}).")
    return int(value)


def check_rate(where: str, value: Any) -> tuple[int, float] | None:
    """A rate limit ``(starts, seconds)``: at most ``starts`` starts in any ``seconds``.

    Raises:
        WorkflowDefinitionError: it is not a pair of a whole number >= 1 and a positive number.
    """
    if value is None:
        return None
    if isinstance(value, list | tuple) and len(value) == 2:
        starts, period = value
        if isinstance(starts, int) and not isinstance(starts, bool) and starts >= 1 and \
                isinstance(period, int | float) and not isinstance(period, bool) and period > 0:
            return int(starts), float(period)
    raise exceptions.WorkflowDefinitionError(
        f"rate_limit for {where} must be a pair (starts, seconds), such as (60, 60) for at "
        f"most 60 starts a minute (got {value!r}).")


def check_priority(where: str, value: Any) -> str | None:
    """A priority word: ``"high"``, ``"normal"`` or ``"low"``."""
    if value is None:
        return None
    if value not in PRIORITIES:
        raise exceptions.WorkflowDefinitionError(
            f"priority for {where} must be 'high', 'normal' or 'low' (got {value!r}).")
    return str(value)


def check_queue(where: str, value: Any) -> str | None:
    """A Celery queue name: a non-blank string."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise exceptions.WorkflowDefinitionError(
            f"queue for {where} must be a non-blank Celery queue name (got {value!r}).")
    return value.strip()


def lookup(table: dict[str, Any], key: str) -> Any:
    """The entry of a settings table for group ``key``: its exact name, else the most specific
    pattern (``"tenant:*"``) that matches it, else None."""
    if key in table:
        return table[key]
    matches = [pattern for pattern in table if "*" in pattern and fnmatch.fnmatchcase(key, pattern)]
    if not matches:
        return None
    return table[max(matches, key=lambda pattern: (len(pattern.replace("*", "")), pattern))]


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds one step's attempts at the moment it is about to start."""

    group: str | None
    """The group key (formatted), or None for a step in no group."""
    concurrency: int | None = None
    """Attempts of the group in flight at once."""
    rate: tuple[int, float] | None = None
    """At most ``rate[0]`` starts in any ``rate[1]`` seconds in the group."""
    group_cost: int | None = None
    """Cost units of the group's attempts in flight at once."""
    queue: str | None = None
    queue_cost: int | None = None
    """Cost units in flight at once on the step's queue."""
    cost: int = 1
    """The step's ``cost_units``."""

    @property
    def gated(self) -> bool:
        """Whether anything bounds the step (False: it starts with no check at all)."""
        return any(value is not None for value in (
            self.concurrency, self.rate, self.group_cost, self.queue_cost))


def limits_for(*, group: str | None, step_limit: int | None, step_rate: tuple[int, float] | None,
               cost: int, queue: str | None, tables: dict[str, dict[str, Any]]) -> Limits:
    """Resolve a step's limits: the site's tables (``CONCURRENCY_LIMITS``, ``RATE_LIMITS``,
    ``GROUP_COST_BUDGETS``, ``QUEUE_COST_BUDGETS``) override the step's own."""
    concurrency = rate = group_cost = None
    if group is not None:
        concurrency = lookup(tables.get("CONCURRENCY_LIMITS", {}), group) or step_limit
        configured = lookup(tables.get("RATE_LIMITS", {}), group)
        rate = step_rate if configured is None else (int(configured[0]), float(configured[1]))
        group_cost = lookup(tables.get("GROUP_COST_BUDGETS", {}), group)
    queue_cost = None if queue is None else tables.get("QUEUE_COST_BUDGETS", {}).get(queue)
    return Limits(group, concurrency, rate, group_cost, queue, queue_cost, cost)


#: How much longer than its period a rate window is counted: a handler starts a few
#: milliseconds after its admission, and when those delays vary, admissions exactly one
#: period apart could put one handler start too many in some window of the period.
RATE_SLACK_SECONDS = 0.05


def rate_window(period: float) -> float:
    """The seconds over which a rate limit of ``period`` counts starts: the period, plus a
    slack of 50 ms (at most 5% of the period) that absorbs the jitter between a step's
    admission and its handler's start."""
    return period + min(RATE_SLACK_SECONDS, period * 0.05)


@dataclass(frozen=True, slots=True)
class Load:
    """What a group and a queue hold right now (counted from live step rows)."""

    in_flight: int = 0
    """Attempts of the group running or already woken to run."""
    group_cost: int = 0
    starts_in_window: int = 0
    """Starts of the group in the last ``rate[1]`` seconds."""
    queue_cost: int = 0


def verdict(limits: Limits, load: Load) -> str | None:
    """None if one more attempt of the step fits; else why not (``CONCURRENCY``, ``RATE``,
    ``GROUP_COST``, ``QUEUE_COST``). A step costing more than a whole budget waits forever,
    so a budget is checked as "nothing else running, or it fits"."""
    if limits.concurrency is not None and load.in_flight + 1 > limits.concurrency:
        return CONCURRENCY
    if limits.rate is not None and load.starts_in_window + 1 > limits.rate[0]:
        return RATE
    if limits.group_cost is not None and load.group_cost > 0 and \
            load.group_cost + limits.cost > limits.group_cost:
        return GROUP_COST
    if limits.queue_cost is not None and load.queue_cost > 0 and \
            load.queue_cost + limits.cost > limits.queue_cost:
        return QUEUE_COST
    return None


def free_slots(limits: Limits, load: Load) -> int:
    """How many more attempts of a group could start now (a large number when unbounded)."""
    free = 1_000_000
    if limits.concurrency is not None:
        free = min(free, limits.concurrency - load.in_flight)
    if limits.rate is not None:
        free = min(free, limits.rate[0] - load.starts_in_window)
    if limits.group_cost is not None:
        # A budget admits at least one step when nothing runs (see verdict()).
        free = min(free, max(limits.group_cost - load.group_cost, 0) // max(limits.cost, 1)
                   or (1 if load.group_cost == 0 else 0))
    return max(free, 0)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A throttled step row, as the waker sees it."""

    id: int
    group: str
    priority: int
    cost: int = 1
    queue: str = ""
    """The queue whose cost budget it waits under ("": none)."""


def wake_order(waiting: list[Waiting], free: dict[str, int],
               holding: dict[str, int] | None = None,
               served: dict[str, float] | None = None) -> list[int]:
    """Which throttled rows to start, in order: highest priority first, then round-robin
    across the group keys (a tenant with 1,000 waiting steps does not starve one with 5),
    then oldest (lowest id) within a key; at most ``free[key]`` per key.

    ``waiting`` may hold several keys of one family (``tenant:1``, ``tenant:2``) that share
    one resource (a queue's cost budget). Round-robin goes on across wake-ups, not only
    within one: the key that holds the fewest of the shared resource (``holding[key]``) goes
    next, and of keys that hold as many, the one served longest ago (``served[key]``, a
    time; never served comes first), so one slot freed at a time still goes round the keys
    instead of to whoever queued first.
    """
    queues: dict[str, list[Waiting]] = {}
    for row in sorted(waiting, key=lambda w: (-w.priority, w.id)):
        queues.setdefault(row.group, []).append(row)
    left = {key: free.get(key, 0) for key in queues}
    taken = {key: (holding or {}).get(key, 0) for key in queues}
    last = {key: (served or {}).get(key, float("-inf")) for key in queues}
    order: list[int] = []
    while True:
        ready = [key for key, rows in queues.items() if rows and left[key] > 0]
        if not ready:
            return order
        key = min(ready, key=lambda k: (-queues[k][0].priority, taken[k], last[k],
                                        queues[k][0].id))
        order.append(queues[key].pop(0).id)
        left[key] -= 1
        taken[key] += 1
        last[key] = 1e18 + len(order)  # served now: after every key served before it


def within_budgets(order: list[Waiting], *, queue_budget: int | None = None,
                   queue_running: int = 0,
                   group_budgets: dict[str, tuple[int | None, int]] | None = None,
                   outranked_by: int | None = None,
                   floors: dict[str, tuple[int, int]] | None = None) -> list[int]:
    """Of throttled rows in the order they would be woken (:func:`wake_order`), the ids that
    fit, each row's own cost counted: against a queue's cost budget (``queue_running`` held
    now; the first that does not fit waits first in line, and nothing after it is woken) and
    against each group's cost budget (``group_budgets[key] = (budget, running)``; a group's
    first row that does not fit closes that group). A budget admits one row when nothing holds
    any of it (see :func:`verdict`). ``outranked_by``: a priority whose waiting rows could not
    be looked at now; nothing of a lower priority overtakes them. ``floors[key] = (priority,
    id)``: a row of that key that must come before, elsewhere (a group's best step waiting in
    no queue's line); the key's rows it does not precede wait for it.
    """
    chosen: list[int] = []
    closed: set[str] = set()
    running = queue_running
    spent = {key: used for key, (_, used) in (group_budgets or {}).items()}
    for row in order:
        if outranked_by is not None and row.priority < outranked_by:
            break
        if row.group in closed:
            continue
        floor = (floors or {}).get(row.group)
        if floor is not None and (row.priority, -row.id) < (floor[0], -floor[1]):
            closed.add(row.group)
            continue
        budget = (group_budgets or {}).get(row.group, (None, 0))[0]
        used = spent.get(row.group, 0)
        if budget is not None and used and used + row.cost > budget:
            closed.add(row.group)
            continue
        if queue_budget is not None and running and running + row.cost > queue_budget:
            break
        running += row.cost
        spent[row.group] = used + row.cost
        chosen.append(row.id)
    return chosen


def describe_throttle(limits: Limits, reason: str, load: Load) -> dict[str, Any]:
    """The ``throttled_by`` record of a step that was not started: the group, the reason and
    the numbers behind it, as ``workflow_status()``, the admin and the CLI show them."""
    record: dict[str, Any] = {"group": limits.group, "reason": reason}
    if reason == CONCURRENCY:
        record.update(limit=limits.concurrency, in_flight=load.in_flight)
    elif reason == RATE and limits.rate is not None:
        record.update(limit=limits.rate[0], per_seconds=limits.rate[1],
                      starts=load.starts_in_window)
    elif reason == GROUP_COST:
        record.update(budget=limits.group_cost, running_cost=load.group_cost, cost=limits.cost)
    elif reason == QUEUE_COST:
        record.update(queue=limits.queue, budget=limits.queue_cost, running_cost=load.queue_cost,
                      cost=limits.cost)
    return record


def limits_record(limits: Limits) -> dict[str, Any]:
    """The limits a throttled step was decided under, as its ``throttled_by["limits"]``
    keeps them for its wake-up (:func:`recorded_limits` reads them back)."""
    return {"concurrency": limits.concurrency,
            "rate": None if limits.rate is None else list(limits.rate),
            "group_cost": limits.group_cost, "queue": limits.queue,
            "queue_cost": limits.queue_cost, "cost": limits.cost}


def recorded_limits(group: str, record: dict[str, Any] | None,
                    tables: dict[str, dict[str, Any]]) -> Limits:
    """The limits a throttled row of ``group`` was decided under (its ``throttled_by``), with
    the site's tables applied again (they may have changed since)."""
    saved = (record or {}).get("limits") or {}
    rate = saved.get("rate")
    return limits_for(group=group, step_limit=saved.get("concurrency"),
                      step_rate=None if rate is None else (int(rate[0]), float(rate[1])),
                      cost=int(saved.get("cost") or 1), queue=saved.get("queue"), tables=tables)


def throttled_by(limits: Limits, reason: str, load: Load, now: datetime) -> dict[str, Any]:
    """The ``throttled_by`` of a step not started for ``reason``: what status shows
    (:func:`describe_throttle`), since when, and the limits it was decided under (for its
    wake-up)."""
    return {**describe_throttle(limits, reason, load), "since": now.isoformat(),
            "limits": limits_record(limits)}


@dataclass(frozen=True, slots=True)
class RateTimer:
    """A wake-up of ``group`` to send for the moment its rate window lets one more start."""

    group: str
    period: float
    """The rate limit's period (the runtime finds the moment from the group's oldest start)."""


#: What a gate does with a step row (:func:`decide_admission`): it fits and starts, holding a
#: slot (START); it waits throttled (HOLD); or its lock was busy and nothing was counted,
#: and the caller said what that means: at landing, publish it for its gate to decide when it
#: is claimed (PUBLISH); at the claim, an error, since a claim has a transaction of its own
#: (REFUSE).
START: Final = "start"
HOLD: Final = "hold"
PUBLISH: Final = "publish"
REFUSE: Final = "refuse"
IfBusy = Literal["publish", "refuse"]


@dataclass(frozen=True, slots=True)
class Admission:
    """What a gate decided for one step row (:func:`decide_admission`)."""

    action: Literal["start", "hold", "publish", "refuse"]
    record: dict[str, Any] | None = None
    """HOLD: the row's ``throttled_by`` (:func:`throttled_by`)."""
    timer: RateTimer | None = None
    """HOLD because of the group's rate limit: its timer, for when one more start fits."""


def decide_admission(limits: Limits, load: Load | None, *, now: datetime,
                     if_busy: IfBusy) -> Admission:
    """Whether one more step under ``limits`` starts now, given what its group and queue hold
    (``load``, counted under their locks): the one decision of a row just landed and of a
    claimed one (``queuety.runtime.gates``). ``load`` None: a lock was busy (the caller's
    transaction already held another, so it only tried) and nothing was counted; the answer
    is then ``if_busy``."""
    if load is None:
        return Admission(if_busy)
    reason = verdict(limits, load)
    if reason is None:
        return Admission(START)
    timer = None
    if reason == RATE and limits.group is not None and limits.rate is not None:
        timer = RateTimer(limits.group, limits.rate[1])
    return Admission(HOLD, throttled_by(limits, reason, load, now), timer)


def memory_verdict(*, rss_mb: float | None, max_rss_mb: float | None,
                   available_mb: float | None, min_available_mb: float | None) -> str | None:
    """None if a worker has the memory headroom to start a step; else a sentence saying why
    not. The process's RSS is held against ``max_rss_mb``, and the memory left to the machine
    (the container's cgroup when one is visible) against ``min_available_mb``."""
    if max_rss_mb is not None and rss_mb is not None and rss_mb >= max_rss_mb:
        return (f"the worker process uses {rss_mb:.0f} MB, at or over its ceiling of "
                f"{max_rss_mb:.0f} MB (QUEUETY['ADMISSION']['MAX_RSS_MB'])")
    if min_available_mb is not None and available_mb is not None and \
            available_mb < min_available_mb:
        return (f"{available_mb:.0f} MB of memory is available, under the "
                f"{min_available_mb:.0f} MB QUEUETY['ADMISSION']['MIN_AVAILABLE_MB'] asks for")
    return None
