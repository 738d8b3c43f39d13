"""Resource control's decisions, taken from what the runtime read under its locks: a step's
admission at landing and at its claim (decide_admission), and the wake-up of throttled steps
(plan_wake) (queuety.core.resources). No database: each case is a snapshot and its answer."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from queuety.core import resources, wake_plan
from queuety.core.resources import HOLD, PUBLISH, REFUSE, START, Limits, Load, RateTimer, Waiting
from queuety.core.wake_plan import GroupPass, GroupSnapshot, LinePass, LineSnapshot, WokenStep

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)

CAPPED = Limits("openai", concurrency=2)
RATED = Limits("openai", rate=(3, 60.0))
BUDGETED = Limits("openai", group_cost=10, queue="llm", queue_cost=6, cost=4)


@pytest.mark.parametrize(("limits", "load", "if_busy", "action", "reason", "timer"), [
    # Room: it starts, whatever a busy lock would have meant.
    (CAPPED, Load(1), PUBLISH, START, None, None),
    (CAPPED, Load(1), REFUSE, START, None, None),
    # Full: it waits, and says why.
    (CAPPED, Load(2), PUBLISH, HOLD, resources.CONCURRENCY, None),
    (CAPPED, Load(2), REFUSE, HOLD, resources.CONCURRENCY, None),
    # Its rate limit is why: the group's timer is set for when one more start fits.
    (RATED, Load(0, 0, 2), REFUSE, START, None, None),
    (RATED, Load(0, 0, 3), REFUSE, HOLD, resources.RATE, RateTimer("openai", 60.0)),
    # Cost budgets: each step's own cost; a step dearer than a budget runs alone.
    (BUDGETED, Load(1, 6, 0, 2), REFUSE, START, None, None),
    (BUDGETED, Load(1, 7, 0, 2), REFUSE, HOLD, resources.GROUP_COST, None),
    (BUDGETED, Load(1, 4, 0, 3), PUBLISH, HOLD, resources.QUEUE_COST, None),
    (Limits("g", group_cost=3, cost=5), Load(), REFUSE, START, None, None),
    # A busy lock counted nothing: at landing the row is published for its gate to decide;
    # at the claim it is an error.
    (CAPPED, None, PUBLISH, PUBLISH, None, None),
    (CAPPED, None, REFUSE, REFUSE, None, None),
])
def test_one_admission_decides_a_landed_row_and_a_claimed_one(limits, load, if_busy, action,
                                                              reason, timer):
    decided = resources.decide_admission(limits, load, now=NOW, if_busy=if_busy)
    assert decided.action == action
    assert decided.timer == timer
    assert (decided.record or {}).get("reason") == reason
    assert (decided.record is None) == (action != HOLD)


def test_a_held_rows_record_says_why_since_when_and_under_which_limits():
    decided = resources.decide_admission(BUDGETED, Load(1, 7, 0, 2), now=NOW, if_busy=REFUSE)
    assert decided.record == {
        "group": "openai", "reason": "group_cost", "budget": 10, "running_cost": 7, "cost": 4,
        "since": NOW.isoformat(),
        "limits": {"concurrency": None, "rate": None, "group_cost": 10, "queue": "llm",
                   "queue_cost": 6, "cost": 4}}
    # Its wake-up reads the limits back, the site's tables applied again.
    again = resources.recorded_limits("openai", decided.record, {})
    assert again == Limits("openai", group_cost=None, queue="llm", queue_cost=None, cost=4)
    tables = {"GROUP_COST_BUDGETS": {"openai": 10}, "QUEUE_COST_BUDGETS": {"llm": 6}}
    assert resources.recorded_limits("openai", decided.record, tables) == BUDGETED
    rated = resources.decide_admission(RATED, Load(0, 0, 3), now=NOW, if_busy=PUBLISH)
    assert resources.recorded_limits("openai", rated.record, {}) == RATED


# Wake-ups. A group "g" (limit 3) whose rows wait in no line, or in queue "llm"'s line.

G = Limits("g", concurrency=3)
ASKED = GroupPass("g", G)


def _rows(*spec: str) -> tuple[Waiting, ...]:
    """Waiting rows from words such as ``"1"`` (id 1 of g, in no line), ``"2@llm"`` (in
    llm's line), ``"3:h"`` (of group h; ``"3:"``: of none), ``"4!"`` (high priority),
    ``"5$4"`` (cost 4)."""
    rows = []
    for word in spec:
        word, _, cost = word.partition("$")
        word, _, queue = word.partition("@")
        word, named, group = word.partition(":")
        high = word.endswith("!")
        rows.append(Waiting(int(word.rstrip("!")), group if named else "g", 2 if high else 1,
                            int(cost or 1), queue))
    return tuple(rows)


PLAIN_AGAIN = replace(ASKED, plain=True)


@pytest.mark.parametrize(("seen", "wake", "then", "timers"), [
    # Its best steps into its room, oldest first.
    (GroupSnapshot(ASKED, G, Load(1), _rows("1", "2"), True), (1, 2), (), ()),
    # Its best step waits in a line: the line wakes it, keeping its place, and its steps
    # in no line get what the line leaves; the line's steps of g do not overtake g's best
    # step in no line (the floor), read here or, when none was read, looked up then. The
    # line waits for g's lock with its own (another waker may hold it between the passes).
    (GroupSnapshot(ASKED, G, Load(1), _rows("1@llm", "2"), True), (),
     (LinePass("llm", {"g": (1, 2)}, waits_for="g"), PLAIN_AGAIN), ()),
    (GroupSnapshot(ASKED, G, Load(0), _rows("1", "2@llm", "3"), True), (1,),
     (LinePass("llm", {"g": (1, 3)}, waits_for="g"), PLAIN_AGAIN), ()),
    (GroupSnapshot(ASKED, G, Load(2), _rows("1@llm"), True), (),
     (LinePass("llm", floors_of=("g",), waits_for="g"), PLAIN_AGAIN), ()),
    # A line its caller wakes itself is not woken again; the second pass still runs.
    (GroupSnapshot(replace(ASKED, done=frozenset({"llm"})), G, Load(1), _rows("1@llm"), True),
     (), (replace(PLAIN_AGAIN, done=frozenset({"llm"})),), ()),
    # The second pass: its steps in no line only, and nothing follows.
    (GroupSnapshot(PLAIN_AGAIN, G, Load(2), _rows("4"), True), (4,), (), ()),
    # Its cost budget counts each row's own cost; the first that does not fit closes it.
    (GroupSnapshot(GroupPass("g"), Limits("g", group_cost=10), Load(0, 4),
                   _rows("1$5", "2$1", "3$2", "4$1"), True), (1, 2), (), ()),
    # No room: nothing wakes; the rate timer is set when its rate limit is why and a step
    # waits.
    (GroupSnapshot(ASKED, G, Load(3), (), True), (), (), ()),
    (GroupSnapshot(GroupPass("g"), Limits("g", rate=(2, 1.0)), Load(0, 0, 2), (), True),
     (), (), (RateTimer("g", 1.0),)),
    (GroupSnapshot(GroupPass("g"), Limits("g", rate=(2, 1.0)), Load(0, 0, 2), (), False),
     (), (), ()),
    # Its lock was busy (or nothing waits): a retry wakes the lines its steps wait in all
    # the same (those not done), passing the retry count on; they only try its lock too.
    (GroupSnapshot(GroupPass("g", busy_retry=True, retry=2, done=frozenset({"b"})),
                   lines=frozenset({"b", "llm"})), (),
     (LinePass("llm", floors_of=("g",), retry=2),), ()),
    (GroupSnapshot(GroupPass("g")), (), (), ()),
])
def test_a_groups_pass_wakes_its_best_steps_and_leaves_those_in_a_line_to_it(
        seen, wake, then, timers):
    plan = wake_plan.plan_wake(seen)
    assert (plan.wake, plan.then, plan.timers) == (wake, then, timers)
    assert (plan.served, plan.retry) == (frozenset(), None)


LLM = LinePass("llm")
A, B = Limits("a", concurrency=9), Limits("b", concurrency=9)


def _line(rows: tuple[Waiting, ...], *, asked: LinePass = LLM, budget: int | None = 2,
          limits: dict[str, Limits] | None = None, loads: dict[str, Load] | None = None,
          **seen) -> LineSnapshot:
    limits = {"a": A, "b": B} if limits is None else limits
    loads = {name: Load() for name in limits} | (loads or {})
    return LineSnapshot(asked, budget, rows, limits, loads, **seen)


@pytest.mark.parametrize(("seen", "wake", "served", "retry", "timers"), [
    (_line(()), (), set(), None, ()),
    # Round-robin across the groups, then oldest; as far as the budget's free cost fits.
    (_line(_rows("1:a", "2:a", "3:a", "4:b")), (1, 4), {"a", "b"}, None, ()),
    # The group holding the fewest of the queue goes first; a step costs its own units.
    (_line(_rows("1:a", "4:b", "5:b"), budget=3, holding={"a": (2, 2)}), (4,), {"b"}, None,
     ()),
    (_line(_rows("1:a$2", "4:b")), (1,), {"a"}, None, ()),
    # Of two holding as many, the one served longest ago (never: first).
    (_line(_rows("1:a", "4:b"), budget=1, served={"a": 5.0, "b": 9.0}), (1,), {"a"}, None,
     ()),
    (_line(_rows("1:a", "4:b"), budget=1, served={"a": 5.0}), (4,), {"b"}, None, ()),
    # Priority before all that.
    (_line(_rows("1:a", "4!:b"), holding={"b": (1, 1)}), (4,), {"b"}, None, ()),
    # Nothing holds any of the budget: one step fits, however costly.
    (_line(_rows("1:a$5", "2:b")), (1,), {"a"}, None, ()),
    # A removed budget releases the whole line (each group's own limits still hold).
    (_line(_rows("1:a", "2:a", "3:b"), budget=None, limits={"a": Limits("a", concurrency=1),
                                                            "b": B}),
     (1, 3), {"a", "b"}, None, ()),
    # A step in no group waits in the line too; it serves no group's turn.
    (_line(_rows("1:", "2:a"), budget=None), (1, 2), {"a"}, None, ()),
    # A group's steps in the line do not overtake its better step in no line.
    (_line(_rows("1:a", "2!:a", "3:b"), budget=None, floors={"a": (1, 0)}), (2, 3),
     {"a", "b"}, None, ()),
    # A busy group's best is not overtaken by a lower priority, and while room is left the
    # busy group is looked at again soon, a little later each time, five times at most.
    (_line(_rows("1!:c", "2:a"), busy=frozenset({"c"})), (), set(),
     wake_plan.Retry(("c",), 1, 0.05), ()),
    (_line(_rows("1:c", "2:a"), asked=LinePass("llm", retry=3), busy=frozenset({"c"})),
     (2,), {"a"}, wake_plan.Retry(("c",), 4, 0.4), ()),
    (_line(_rows("1:c", "2:a"), asked=LinePass("llm", retry=5), busy=frozenset({"c"})),
     (2,), {"a"}, None, ()),
    (_line(_rows("1:c", "2:a", "3:a"), busy=frozenset({"c"})), (2, 3), {"a"}, None, ()),
    # A group of the line without room waits; its rate timer is set when that is why.
    (_line(_rows("1:a", "2:b"), limits={"a": Limits("a", rate=(1, 30.0)), "b": B},
           loads={"a": Load(0, 0, 1)}),
     (2,), {"b"}, None, (RateTimer("a", 30.0),)),
])
def test_a_queues_line_wakes_across_groups_in_turns_within_its_budget(seen, wake, served,
                                                                      retry, timers):
    plan = wake_plan.plan_wake(seen)
    assert (plan.wake, plan.served, plan.retry, plan.timers, plan.then) == (
        wake, frozenset(served), retry, timers, ())


def test_a_release_wakes_its_queues_line_then_its_group_and_hands_off_one_of_its_queue():
    budgeted = Limits("g", concurrency=1, queue="llm", queue_cost=4)
    assert wake_plan.release_passes(budgeted) == (
        LinePass("llm", floors_of=("g",), waits_for="g"), GroupPass("g", budgeted, done=frozenset({"llm"})))
    plain = Limits("g", concurrency=1, queue="default")
    assert wake_plan.release_passes(plain) == (GroupPass("g", plain),)
    assert wake_plan.release_passes(Limits(None, queue="llm", queue_cost=4)) == (
        LinePass("llm"),)
    woken = [WokenStep(1, "llm", False), WokenStep(2, "default", True),
             WokenStep(3, "default", False), WokenStep(4, "default", False),
             WokenStep(5, None, False)]
    # The best untimed one for the releasing process's own Celery queue; or none.
    assert wake_plan.hand_off(woken, "default") == 3
    assert wake_plan.hand_off(woken, None) == 5
    assert wake_plan.hand_off(woken, "other") is None
    assert wake_plan.hand_off([], "default") is None


def test_a_lines_window_holds_a_budgets_worth_per_group_and_a_few_budgets_in_all():
    assert wake_plan.line_window(2) == (8, 2)
    assert wake_plan.line_window(100) == (200, 100)
    assert wake_plan.line_window(None) == (200, 200)
    assert wake_plan.group_room(Limits("g", concurrency=500), Load(10)) == wake_plan.WAKE_BATCH
    assert wake_plan.group_room(Limits("g", concurrency=3, group_cost=1), Load(1, 9)) == 2


def test_a_groups_better_step_in_a_line_goes_before_its_lower_one_in_none():
    # g (limit 1) frees its slot; its high step waits in llm's line, its low one in none.
    high, low = Waiting(7, "g", 2, 1, "llm"), Waiting(8, "g", 0)
    first = wake_plan.plan_wake(GroupSnapshot(GroupPass("g", Limits("g", concurrency=1)),
                                              Limits("g", concurrency=1), Load(),
                                              (high,), True))
    assert first.wake == ()
    line, again = first.then
    assert line == LinePass("llm", floors_of=("g",), waits_for="g")
    # The line (its floor looked up: the low step) wakes the high one; then g has no room.
    woke = wake_plan.plan_wake(LineSnapshot(line, 2, (high,), {"g": Limits("g", concurrency=1)},
                                            {"g": Load()}, floors={"g": (low.priority,
                                                                       low.id)}))
    assert woke.wake == (7,)
    assert wake_plan.plan_wake(GroupSnapshot(again, Limits("g", concurrency=1), Load(1),
                                             (), True)).wake == ()
    # Had the low one been better (say, high priority too and older), the line would wait.
    assert wake_plan.plan_wake(LineSnapshot(line, 2, (high,), {"g": Limits("g", concurrency=1)},
                                            {"g": Load()}, floors={"g": (2, 3)})).wake == ()
