"""Resource control at the step boundary: the gate a claimed step passes before it starts,
and the decision at landing (the wake-ups of waiting steps: ``queuety.runtime.wakeups``).

A step with no concurrency group, no queue cost budget and no worker admission settings
passes without a query (:func:`enter` returns :data:`OPEN` from what is in memory). Any other
claimed step is decided under its group's lock (``queuety.store.groups.lock``): its group's
load is counted from live step rows, and the step either starts, holding a slot, or is handed
back *throttled*: its attempt is not counted, its row holds no worker and no message, and
``throttled_by`` says why. A step row just landed (:func:`publish_landed`) is decided the same
way, before its message exists. Both take one decision, ``core.resources.decide_admission``,
from the load :func:`_decide` counts under the locks; what a busy lock means is its explicit
``if_busy`` (at landing, publish the row for its gate to decide; at the claim, an error).
When an admitted attempt ends, ``queuety.runtime.wakeups.release`` wakes the best throttled
steps into the slots it left; a rate-limited group gets one timer (:func:`set_rate_timer`)
for the moment its window reopens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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
from queuety.store import groups, locks

logger = logging.getLogger("queuety")


@dataclass(frozen=True, slots=True)
class Passage:
    """What the gate decided for one claimed attempt."""

    started: bool
    """False: the step was throttled or deferred and must not run now."""
    limits: resources.Limits | None = None
    """The limits the attempt holds a slot under (given back by
    ``queuety.runtime.wakeups.release``)."""


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

    A step in no group and under no queue budget is published with no query. So is one whose
    group or queue is busy while this transaction already holds another's lock (it lands
    several runs' steps): it only tries the lock (``queuety.store.locks``), and its gate
    decides it when a worker claims it.
    """
    try:
        limits = limits_at(spec, index, state, run_id)
    except exceptions.WorkflowDefinitionError:
        limits = None  # the gate fails the attempt with the error, as for any claim
    if limits is not None:
        row = _Row(spec, index, run_id, step_run_id, limits)
        decided = _decide(row, if_busy=resources.PUBLISH,
                          start=lambda now: groups.reserve(step_run_id, limits, row.priority,
                                                           now),
                          hold=lambda record: groups.park(step_run_id, limits, row.priority,
                                                          record))
        if decided.action == resources.HOLD:
            return True
    publish.publish_on_commit([publish.message_for(spec, step_run_id, index)])
    return False


def enter(held: Claim, spec: WorkflowSpec) -> Passage:
    """Decide whether the claimed attempt ``held`` may start now.

    Raises:
        WorkflowDefinitionError: the step's group names a state key the run lacks (the
            attempt then fails as any definition error does).
        QueuetyError: its group's or queue's lock is busy while this transaction already
            holds another resource lock (a step is claimed in a transaction of its own).
    """
    if settings.ADMISSION and _deferred(held, spec):
        return Passage(False)
    limits = limits_of(spec, held)
    if limits is None:
        return OPEN
    row = _Row(spec, held.step_index, held.run_id, held.step_run_id, limits)
    # A woken step's slot (and its share of a queue's budget) is already reserved.
    if groups.admit_woken(held.step_run_id, held.attempt, limits, row.priority, timezone.now()):
        return Passage(True, limits)
    decided = _decide(row, if_busy=resources.REFUSE,
                      start=lambda now: groups.admit(held.step_run_id, held.attempt, limits,
                                                     row.priority, now),
                      hold=lambda record: groups.throttle(held.step_run_id, held.attempt,
                                                          held.claimed_by, limits,
                                                          row.priority, record))
    return Passage(True, limits) if decided.action == resources.START else Passage(False)


@dataclass(frozen=True, slots=True)
class _Row:
    """A step row at its gate: at landing (:func:`publish_landed`) or claimed (:func:`enter`)."""

    spec: WorkflowSpec
    index: int
    run_id: int
    step_run_id: int
    limits: resources.Limits

    @property
    def priority(self) -> int:
        return resources.PRIORITIES[self.spec.priority_of(self.index) or resources.NORMAL]


def _decide(row: _Row, *, if_busy: resources.IfBusy, start: Callable[[datetime], object],
            hold: Callable[[dict[str, Any]], bool]) -> resources.Admission:
    """Decide ``row`` under its group's and queue's locks (``core.resources.
    decide_admission``), and write the answer in the same transaction: ``start(now)`` when it
    fits (from then on it holds its slot), ``hold(record)`` when it waits throttled (False:
    the row was no longer there to hold back), nothing when a lock was busy and ``if_busy``
    is PUBLISH.

    Raises:
        QueuetyError: a lock was busy and ``if_busy`` is REFUSE.
    """
    now = timezone.now()
    with transaction.atomic():
        # Only its transaction's first resource locks are waited for (queuety.store.locks).
        mode = locks.TRY if locks.holding() else locks.WAIT
        locked = groups.lock(row.limits.group, _budget_queue(row.limits), mode)
        load = groups.load(row.limits, now, excluding=row.step_run_id) if locked else None
        decided = resources.decide_admission(row.limits, load, now=now, if_busy=if_busy)
        if decided.action == resources.REFUSE:
            raise exceptions.QueuetyError(
                f"The gate of step run id={row.step_run_id} (run {row.run_id}) was reached "
                "inside a transaction that holds another group's lock, and this group's was "
                "busy; a step is claimed in a transaction of its own.")
        if decided.action == resources.START:
            start(now)
        elif decided.record is not None and hold(decided.record):
            _throttled(row, decided, now)
    return decided


def _budget_queue(limits: resources.Limits) -> str | None:
    """The queue whose budget bounds the step (its lock is taken), or None."""
    return limits.queue if limits.queue_cost is not None else None


def _throttled(row: _Row, decided: resources.Admission, now: datetime) -> None:
    """Step ``row`` now waits throttled: the one place, for a claimed step (:func:`enter`) and
    one parked at landing (:func:`publish_landed`). Sets the group's timer when its rate
    limit is why, and tells: called inside the throttling transaction, ``run_throttled``
    reaches its webhook rows in it and its receivers once it commits."""
    if decided.timer is not None:
        set_rate_timer(decided.timer.group, decided.timer.period, now)
    record = decided.record or {}
    step = row.spec.steps[row.index].name
    signals.emit("run_throttled", run_id=row.run_id, workflow=row.spec.name, step=step,
                 reason=record.get("reason"))
    logger.info("Step %r of run id=%s (step run id=%s) is throttled by group %r: %s.",
                step, row.run_id, row.step_run_id, record.get("group"), record.get("reason"))


def _deferred(held: Claim, spec: WorkflowSpec) -> bool:
    """Whether this worker lacks the memory headroom to run the attempt (``ADMISSION``): then
    it is handed back unstarted for later."""
    problem = admission.headroom_problem()
    if problem is not None:
        _defer(held, spec, problem)
    return problem is not None


def _defer(held: Claim, spec: WorkflowSpec, problem: str) -> None:
    """Hand the attempt back unstarted for later: this worker lacks the memory to run it."""
    wait = admission.defer_seconds()
    if hold(held, spec, wait, resources.MEMORY, problem):
        logger.warning("Step %r of run id=%s deferred for %.1f s: %s.",
                       spec.steps[held.step_index].name, held.run_id, wait, problem)


def hold(held: Claim, spec: WorkflowSpec, seconds: float, reason: str, detail: str) -> bool:
    """Hand the claimed attempt ``held`` back unstarted, due again in ``seconds``: its attempt
    is not counted and its row holds no worker; its ``throttled_by`` says ``reason`` and
    ``detail``. False when the row is no longer this claim's."""
    now = timezone.now()
    record = {"group": None, "reason": reason, "detail": detail, "worker": held.claimed_by,
              "since": now.isoformat()}
    with transaction.atomic():
        if not groups.defer(held.step_run_id, held.attempt, held.claimed_by,
                            now + timedelta(seconds=seconds), record):
            return False
        publish.publish_on_commit([publish.step_message(spec, held.step_run_id,
                                                        held.step_index, held.timeout, seconds)])
    return True


def limits_from_record(group: str, record: dict[str, Any] | None) -> resources.Limits:
    """The limits a throttled row was decided under (its ``throttled_by``), with the site's
    settings applied again (they may have changed since)."""
    return resources.recorded_limits(group, record, _tables())


def set_rate_timer(group: str, period: float, now: datetime) -> None:
    """Send one wake-up of ``group`` for when its oldest start in the window leaves it."""
    window = timedelta(seconds=resources.rate_window(period))
    oldest = groups.oldest_start(group, now - window)
    at = (oldest or now) + window
    if groups.set_timer(group, at, now):
        publish.wake_group_on_commit(group, max((at - now).total_seconds(), 0) + 0.005)
