"""Wake-ups of throttled steps decided in this process against PostgreSQL, with publishing
captured (no worker): what a release wakes, what it hands to the releasing process, and in
which order, when a group's steps wait on two queues (queuety.runtime.wakeups)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, transaction

import queuety
from queuety import publish
from queuety.core import wake_plan
from queuety.models import StepRun
from queuety.runtime import gates, wakeups
from queuety.store import groups, locks
from queuety.store.definitions import load_spec
from tests import resource_steps
from tests.settings import BUDGET_QUEUE

# The session worker's sweep would wake the throttled steps these tests arrange, or queue for
# the locks they hold, between a test's steps (a release then found nothing left to wake).
pytestmark = pytest.mark.usefixtures("no_sweeps")


@pytest.fixture
def group():
    """A group of the test's own; its runs are cancelled afterwards, so none is left holding
    a share of the budgeted queue (or its message for a later test's worker to run)."""
    name = f"w-{uuid.uuid4().hex[:10]}"
    yield name
    for run_id in set(StepRun.objects.filter(concurrency_group__startswith=name).exclude(
            status__in=("completed", "failed", "cancelled")).values_list("run_id", flat=True)):
        with publish.captured():
            queuety.cancel(run_id)


def _flows(group: str, **options):
    plain = queuety.workflow("wake_plain").then(resource_steps.ledgered,
                                                concurrency_group=group, **options)
    budgeted = queuety.workflow("wake_budgeted").then(
        resource_steps.ledgered, concurrency_group=group, queue=BUDGET_QUEUE, **options)
    return plain, budgeted


def _end(run_id: int) -> gates.resources.Limits:
    """The step of ``run_id`` (woken, holding its slot) ends: its limits, for release()."""
    row = StepRun.objects.select_related("run").get(run_id=run_id)
    StepRun.objects.filter(pk=row.pk).update(status="completed", woken=False)
    return gates.limits_at(load_spec(row.run.definition_id), 0, row.run.state, run_id)


def test_a_release_hands_off_only_a_step_of_its_own_queue(group):
    plain, budgeted = _flows(group, concurrency_limit=1)
    with publish.captured() as sent:
        holder = plain.dispatch({"nap": 0})
        waiter = budgeted.dispatch({"nap": 0})
        assert StepRun.objects.get(run_id=waiter).status == "throttled"
        kept = wakeups.release(_end(holder), keep=True)
    # The waiting step is for the budgeted queue's workers: published there, not handed to the
    # releasing process (which takes the default queue's messages).
    assert kept is None
    row = StepRun.objects.get(run_id=waiter)
    assert (row.status, row.woken) == ("pending", True)
    assert [m.step_run_id for m in sent][-1] == row.pk


def test_a_groups_better_step_in_a_queue_line_starts_before_its_lower_one_in_none(group):
    plain, budgeted = _flows(group, concurrency_limit=1)
    with publish.captured():
        holder = plain.dispatch({"nap": 0})
        low = plain.with_priority("low").dispatch({"nap": 0})
        high = budgeted.with_priority("high").dispatch({"nap": 0})
        assert set(StepRun.objects.filter(run_id__in=[low, high]).values_list(
            "status", flat=True)) == {"throttled"}
        wakeups.release(_end(holder))
    assert StepRun.objects.get(run_id=high).status == "pending"
    assert StepRun.objects.get(run_id=low).status == "throttled"
    # And the plain one goes next, when the queue's step has ended.
    with publish.captured():
        wakeups.release(_end(high))
    assert StepRun.objects.get(run_id=low).status == "pending"


def test_a_release_counts_each_waiting_steps_own_cost_against_the_group_budget(group):
    # A budget of 10, a step of cost 8 ends: the three of cost 1 waiting all fit (counting
    # the free room with the ended step's cost would have let one in).
    from django.test import override_settings

    from tests.settings import QUEUETY as TEST_QUEUETY

    with override_settings(QUEUETY={**TEST_QUEUETY, "GROUP_COST_BUDGETS": {group: 10}}):
        big = queuety.workflow("wake_cost_big").then(resource_steps.ledgered,
                                                     concurrency_group=group, cost_units=8)
        small = queuety.workflow("wake_cost_small").then(resource_steps.ledgered,
                                                         concurrency_group=group, cost_units=1)
        other = queuety.workflow("wake_cost_other").then(resource_steps.ledgered,
                                                         concurrency_group=group, cost_units=5)
        with publish.captured():
            holder = big.dispatch({"nap": 0})
            second = other.dispatch({"nap": 0})   # 8 + 5 > 10: waits
            waiting = [small.dispatch({"nap": 0}) for _ in range(3)]
            wakeups.release(_end(holder))
        # The oldest (cost 5) first, then the three of cost 1: 5 + 3 = 8 fits in 10.
        assert StepRun.objects.get(run_id=second).status == "pending"
        assert [StepRun.objects.get(run_id=pk).status for pk in waiting] == ["pending"] * 3


def test_a_step_waiting_for_its_full_queue_does_not_hold_its_groups_slot(group):
    plain, budgeted = _flows(group, concurrency_limit=1)
    others = queuety.workflow("wake_others").then(
        resource_steps.ledgered, concurrency_group=f"{group}-x", queue=BUDGET_QUEUE,
        concurrency_limit=9)
    with publish.captured():
        fill = [others.dispatch({"nap": 0}) for _ in range(2)]   # the queue's budget of 2
        holder = plain.dispatch({"nap": 0})
        in_line = budgeted.dispatch({"nap": 0})                 # older, waits in the line
        after = plain.dispatch({"nap": 0})
        wakeups.release(_end(holder))
    # The line is full, so its step waits there; the group's slot goes to the next step.
    assert StepRun.objects.get(run_id=in_line).status == "throttled"
    assert StepRun.objects.get(run_id=after).status == "pending"
    # When the queue frees, the line's step has its turn (the group's slot is free again).
    with publish.captured():
        wakeups.release(_end(after))
        wakeups.release(_end(fill[0]))
    assert StepRun.objects.get(run_id=in_line).status == "pending"


def test_a_release_whose_line_served_another_group_gives_its_slot_to_the_next_plain_step(
        group):
    plain, budgeted = _flows(group, concurrency_limit=2)
    others = queuety.workflow("wake_others_line").then(
        resource_steps.ledgered, concurrency_group=f"{group}-x", queue=BUDGET_QUEUE,
        concurrency_limit=9)
    with publish.captured():
        ending, holding = budgeted.dispatch({"nap": 0}), budgeted.dispatch({"nap": 0})
        other = others.dispatch({"nap": 0})                    # the queue's budget is full
        in_line = budgeted.dispatch({"nap": 0})
        after = plain.dispatch({"nap": 0})                     # the group's slots are full
        wakeups.release(_end(ending))
    # The line's freed share went to the other tenant (it held none); the group's freed slot
    # is not left to its step that waits for the full line, but goes to its next one.
    assert StepRun.objects.get(run_id=other).status == "pending"
    assert StepRun.objects.get(run_id=in_line).status == "throttled"
    assert StepRun.objects.get(run_id=after).status == "pending"
    assert StepRun.objects.get(run_id=holding).status == "pending"


def _hold_group_lock(name: str | None, release: threading.Event, taken: threading.Event,
                     queue: str | None = None) -> None:
    """Hold group ``name``'s lock (or queue ``queue``'s) in another connection (a long
    transaction) until ``release`` is set."""
    try:
        with transaction.atomic():
            groups.lock(name, queue, locks.WAIT)
            taken.set()
            release.wait(10)
    finally:
        connection.close()


def _waiting_for_a_queue_lock(kind: int = locks.QUEUE) -> bool:
    """Whether a session waits for a queue's advisory lock (key ``locks.QUEUE``; ``kind``:
    another kind's, e.g. ``locks.GROUP``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT "
                       "granted AND classid = %s", [kind])
        return bool(cursor.fetchone()[0])


def _until(condition, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s"
        time.sleep(0.01)


def test_a_line_that_finds_a_group_busy_retries_it_and_the_retry_wakes_it_once_free(
        group, monkeypatch):
    _, budgeted = _flows(group, concurrency_limit=1)
    others = queuety.workflow("wake_busy_others").then(
        resource_steps.ledgered, concurrency_group=f"{group}-x", queue=BUDGET_QUEUE,
        concurrency_limit=9)
    retries = []
    monkeypatch.setattr(publish, "wake_group_on_commit",
                        lambda name, countdown, **options: retries.append((name, options)))
    release, taken = threading.Event(), threading.Event()
    with publish.captured():
        fill = [others.dispatch({"nap": 0}) for _ in range(2)]   # the queue's budget of 2
        waiter = budgeted.dispatch({"nap": 0})
        assert StepRun.objects.get(run_id=waiter).status == "throttled"
        holder = threading.Thread(target=_hold_group_lock, args=(group, release, taken))
        holder.start()
        try:
            assert taken.wait(10)
            # The line has room again, but the waiting step's group is locked elsewhere: the
            # line does not wait for it, and asks for a retry that only tries its lock.
            wakeups.release(_end(fill[0]))
            assert StepRun.objects.get(run_id=waiter).status == "throttled"
            assert retries == [(group, {"wait": False, "retry": 1})]
            # Each retry that finds it busy again asks for the next, though it runs (as here)
            # in the process that sent the one before it, sooner than its own doubled delay:
            # a guard keyed by the group alone dropped it, and the step waited for the
            # sweeper's next pass (the flake of test_resources' two-queue release).
            for attempt in range(1, wake_plan.BUSY_RETRIES):
                assert wakeups.wake_group(group, busy_retry=True, retry=attempt) == 0
                assert retries[-1] == (group, {"wait": False, "retry": attempt + 1})
            # The last asks for none: the sweeper's pass is the backstop.
            assert wakeups.wake_group(group, busy_retry=True, retry=wake_plan.BUSY_RETRIES) == 0
            assert len(retries) == wake_plan.BUSY_RETRIES
        finally:
            release.set()
            holder.join()
        # Free now: the retry wakes the group's step through its line.
        assert wakeups.wake_group(group, busy_retry=True, retry=wake_plan.BUSY_RETRIES) == 1
    assert StepRun.objects.get(run_id=waiter).status == "pending"


def test_a_groups_line_waits_for_the_groups_lock_another_waker_took_between_the_passes(
        group, monkeypatch):
    # The release's group pass has passed its slot to the line its step waits in; before that
    # line pass has the queue's lock, another waker (the sweeper's) takes the group's. The
    # line waits for it, as a gate would, and wakes the step before the release returns: no
    # retry a broker hop away, no waiting for the sweeper's next pass (the flake of
    # test_resources' two-queue release, 0.6 s and 1.25 s against 0.35 s).
    plain, budgeted = _flows(group, concurrency_limit=1)
    retries = []
    monkeypatch.setattr(publish, "wake_group_on_commit",
                        lambda name, countdown, **options: retries.append((name, options)))
    free_queue, queue_taken = threading.Event(), threading.Event()
    free_group, group_taken = threading.Event(), threading.Event()
    queue_holder = threading.Thread(target=_hold_group_lock,
                                    args=(None, free_queue, queue_taken, BUDGET_QUEUE))

    def other_waker() -> None:
        try:
            # The release's line pass, waiting for the queue's lock.
            _until(_waiting_for_a_queue_lock, "the line pass waiting for the queue's lock")
            group_holder = threading.Thread(target=_hold_group_lock,
                                            args=(group, free_group, group_taken))
            group_holder.start()
            group_taken.wait(10)
            free_queue.set()
            # The line pass has the queue's lock now, and waits for the group's (a pass that
            # only tried it would never wait: this fails, and so does the test).
            _until(lambda: _waiting_for_a_queue_lock(locks.GROUP),
                   "the line pass waiting for the group's lock")
            free_group.set()
            group_holder.join()
        finally:
            free_queue.set()
            free_group.set()
            connection.close()

    with publish.captured():
        holder = plain.dispatch({"nap": 0})
        waiter = budgeted.dispatch({"nap": 0})
        assert StepRun.objects.get(run_id=waiter).status == "throttled"
        limits = _end(holder)
        queue_holder.start()
        assert queue_taken.wait(10)
        orchestrator = threading.Thread(target=other_waker)
        orchestrator.start()
        try:
            wakeups.release(limits)
        finally:
            free_queue.set()
            free_group.set()
            orchestrator.join()
            queue_holder.join()
    assert group_taken.is_set()  # the group's lock was busy when the line pass came to it
    assert StepRun.objects.get(run_id=waiter).status == "pending"
    assert retries == []
