"""Resource control's decisions, taken from what the runtime read under its locks: a step's
admission at landing and at its claim (decide_admission), and the wake-up of throttled steps
(plan_wake) (queuety.core.resources). No database: each case is a snapshot and its answer."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from queuety.core import resources
from queuety.core.resources import (
    HOLD,
    PUBLISH,
    REFUSE,
    START,
    Limits,
    Load,
    RateTimer,
)

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
