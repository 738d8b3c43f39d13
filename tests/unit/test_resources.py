"""Resource control's pure rules: step options, group keys, limits from settings, the
admission verdict, the wake-up order, memory headroom (queuety.core.resources)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import queuety
from queuety.conf import settings
from queuety.core import resources
from queuety.core.resources import Limits, Load, Waiting
from queuety.runtime import admission
from tests import workflows


class CallModel(queuety.Step):
    concurrency_group = "openai"
    concurrency_limit = 8
    rate_limit = (60, 60)
    cost_units = 5
    queue = "llm"
    priority = "high"

    def handle(self, state):
        return {}


def test_step_class_attributes_are_the_defaults_and_then_overrides_them():
    spec = (queuety.workflow("triage").with_priority("low")
            .then(CallModel)
            .then(CallModel, name="keyed", concurrency_group="tenant:{tenant_id}",
                  concurrency_limit=2)
            .then(workflows.step_a).build())
    own, keyed, plain = spec.steps
    assert (own.concurrency_group, own.concurrency_limit, own.rate_limit, own.cost_units,
            own.queue, own.priority) == ("openai", 8, (60, 60.0), 5, "llm", "high")
    assert (keyed.concurrency_group, keyed.concurrency_limit) == ("tenant:{tenant_id}", 2)
    assert plain.concurrency_group is None and plain.queue is None
    assert spec.priority_of(2) == "low" and spec.priority_of(0) == "high"
    assert spec.queue_of(0) == "llm" and spec.queue_of(2) is None
    assert queuety.workflow("triage").then(CallModel).build() == \
        type(spec).from_dict(queuety.workflow("triage").then(CallModel).build().to_dict())


def test_the_definition_hash_covers_the_new_options_and_keeps_old_hashes():
    plain = queuety.workflow("h").then(workflows.step_a).build()
    assert "concurrency_group" not in plain.canonical_json()
    assert "priority" not in plain.canonical_json()
    hashes = {queuety.workflow("h").then(workflows.step_a, **option).build().definition_hash
              for option in ({}, {"concurrency_group": "g"},
                             {"concurrency_group": "g", "concurrency_limit": 3},
                             {"concurrency_group": "g", "rate_limit": (5, 1)},
                             {"queue": "llm"}, {"priority": "high"})}
    assert len(hashes) == 6
    assert queuety.workflow("h").then(workflows.step_a).with_priority("low").build() \
        .definition_hash != plain.definition_hash


@pytest.mark.parametrize(("options", "words"), [
    ({"concurrency_group": ""}, "non-blank string"),
    ({"concurrency_group": "t:{0}"}, "names one state key"),
    ({"concurrency_group": "t:{a.b}"}, "names one state key"),
    ({"concurrency_group": "t:{a"}, "not a valid template"),
    ({"concurrency_group": "g", "concurrency_limit": 0}, "at least 1"),
    ({"concurrency_group": "g", "rate_limit": (0, 1)}, "pair (starts, seconds)"),
    ({"concurrency_group": "g", "rate_limit": 5}, "pair (starts, seconds)"),
    ({"concurrency_limit": 2}, "no concurrency_group"),
    ({"priority": "urgent"}, "'high', 'normal' or 'low'"),
    ({"queue": " "}, "non-blank queue name"),
])
def test_bad_options_are_refused_with_the_step_named(options, words):
    with pytest.raises(queuety.WorkflowDefinitionError, match="step_a|'step_a'") as caught:
        queuety.workflow("bad").then(workflows.step_a, **options)
    assert words in str(caught.value)


def test_with_priority_refuses_an_unknown_word():
    with pytest.raises(queuety.WorkflowDefinitionError, match="workflow 'w'"):
        queuety.workflow("w").with_priority("asap")


def test_group_keys_are_formatted_from_the_state_and_a_missing_key_is_named():
    assert resources.group_key("tenant:{tenant_id}", {"tenant_id": 7}, step_name="s",
                               run_id=1) == "tenant:7"
    assert resources.family_of("tenant:{tenant_id}:{region}") == "tenant:*:*"
    with pytest.raises(queuety.WorkflowDefinitionError) as caught:
        resources.group_key("tenant:{tenant_id}", {}, step_name="call", run_id=42)
    assert "run 42" in str(caught.value) and "'tenant_id'" in str(caught.value)
    with pytest.raises(queuety.WorkflowDefinitionError, match="string or a number"):
        resources.group_key("t:{x}", {"x": [1]}, step_name="call", run_id=42)


def test_settings_override_step_limits_and_patterns_match_keyed_groups():
    tables = {"CONCURRENCY_LIMITS": {"openai": 3, "tenant:*": 2, "tenant:vip*": 9},
              "RATE_LIMITS": {"openai": (500, 60)}, "GROUP_COST_BUDGETS": {"openai": 12},
              "QUEUE_COST_BUDGETS": {"llm": 20}}
    limits = resources.limits_for(group="openai", step_limit=8, step_rate=(60, 60.0), cost=5,
                                  queue="llm", tables=tables)
    assert (limits.concurrency, limits.rate, limits.group_cost, limits.queue_cost) == \
        (3, (500, 60.0), 12, 20)
    assert resources.limits_for(group="tenant:1", step_limit=5, step_rate=None, cost=1,
                                queue=None, tables=tables).concurrency == 2
    assert resources.limits_for(group="tenant:vip1", step_limit=5, step_rate=None, cost=1,
                                queue=None, tables=tables).concurrency == 9
    own = resources.limits_for(group="other", step_limit=4, step_rate=(2, 1.0), cost=1,
                               queue=None, tables=tables)
    assert (own.concurrency, own.rate, own.gated) == (4, (2, 1.0), True)
    assert not resources.limits_for(group="free", step_limit=None, step_rate=None, cost=1,
                                    queue="other", tables=tables).gated


def test_the_verdict_names_the_first_limit_one_more_attempt_would_pass():
    limits = Limits("openai", concurrency=8, rate=(20, 1.0), group_cost=12, queue="llm",
                    queue_cost=20, cost=5)
    assert resources.verdict(limits, Load(7, 5, 19, 10)) is None
    assert resources.verdict(limits, Load(8, 0, 0, 0)) == resources.CONCURRENCY
    assert resources.verdict(limits, Load(1, 0, 20, 0)) == resources.RATE
    assert resources.verdict(limits, Load(1, 10, 0, 0)) == resources.GROUP_COST
    assert resources.verdict(limits, Load(1, 5, 0, 16)) == resources.QUEUE_COST
    # A step dearer than a whole budget still runs alone, rather than waiting forever.
    alone = Limits("g", group_cost=3, cost=5)
    assert resources.verdict(alone, Load()) is None
    assert resources.free_slots(Limits("g", concurrency=8, rate=(20, 1.0)), Load(5, 0, 18)) == 2


def test_wake_order_is_priority_then_round_robin_across_keys_then_oldest():
    waiting = ([Waiting(i, "tenant:big", 1) for i in range(1, 11)]
               + [Waiting(i, "tenant:small", 1) for i in (20, 21)]
               + [Waiting(30, "tenant:big", 2), Waiting(5, "tenant:small", 0)])
    order = resources.wake_order(waiting, {"tenant:big": 4, "tenant:small": 3})
    assert order[0] == 30                   # the high one first
    assert order[1:5] == [20, 1, 21, 2]      # then the two keys take turns, oldest first
    assert order.count(5) == 1 and order[-1] == 5  # the low one last
    assert len(order) == 7
    assert resources.wake_order(waiting, {}) == []


def _serve_one_at_a_time(backlog: dict[str, int], budget: int, turns: int) -> str:
    """Simulate a queue's line under a budget of ``budget`` steps, one freeing at a time
    (the oldest running ends first); return which tenant each wake-up served."""
    waiting = [Waiting(pk, key, 1) for pk, key in enumerate(
        key for key, count in backlog.items() for _ in range(count))]
    running: list[str] = []
    served: dict[str, float] = {}
    order = ""
    for clock in range(turns):
        if len(running) == budget:
            running.pop(0)
        holding = {key: running.count(key) for key in backlog}
        first = resources.wake_order(waiting, dict.fromkeys(backlog, 9), holding, served)[0]
        key = next(w.group for w in waiting if w.id == first)
        waiting = [w for w in waiting if w.id != first]
        running.append(key)
        served[key] = clock
        order += key
    return order


def test_wake_order_goes_round_the_keys_across_wake_ups_that_free_one_slot_each():
    # The big tenant queued first, with a far older head, yet the slots go round.
    assert _serve_one_at_a_time({"a": 20, "b": 5}, budget=1, turns=8) == "abababab"
    assert _serve_one_at_a_time({"a": 20, "b": 20, "c": 20}, budget=2, turns=9) == \
        "abcabcabc"
    shares = _serve_one_at_a_time({"a": 40, "b": 40, "c": 40}, budget=4, turns=30)
    assert {shares.count(key) for key in "abc"} == {10}
    # Priority still comes before what a key holds or when it was served.
    urgent = [Waiting(7, "tenant:big", 2), Waiting(8, "tenant:small", 1)]
    assert resources.wake_order(urgent, {"tenant:big": 9, "tenant:small": 9},
                                {"tenant:big": 5}, {"tenant:small": 0.0}) == [7, 8]


def test_memory_verdict_checks_the_process_and_the_machine():
    assert resources.memory_verdict(rss_mb=100, max_rss_mb=512, available_mb=900,
                                    min_available_mb=256) is None
    assert "ceiling of 512 MB" in resources.memory_verdict(
        rss_mb=600, max_rss_mb=512, available_mb=None, min_available_mb=None)
    assert "MIN_AVAILABLE_MB" in resources.memory_verdict(
        rss_mb=None, max_rss_mb=None, available_mb=100, min_available_mb=256)


def test_available_memory_prefers_a_visible_cgroup_limit(tmp_path: Path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 2048000 kB\n")
    assert admission.available_mb(tmp_path) == 2000
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("1048576\n")
    assert admission.available_mb(tmp_path) == 2000      # "max": no limit visible
    (cgroup / "memory.max").write_text(f"{512 * 1024 * 1024}\n")
    assert admission.available_mb(tmp_path) == 511        # the container's limit, less usage
    assert admission.rss_mb() is None or admission.rss_mb() > 1


@pytest.mark.parametrize(("key", "value"), [
    ("CONCURRENCY_LIMITS", {"openai": 0}), ("CONCURRENCY_LIMITS", ["openai"]),
    ("RATE_LIMITS", {"openai": 500}), ("RATE_LIMITS", {"openai": (500, 0)}),
    ("QUEUE_COST_BUDGETS", {"llm": "20"}), ("GROUP_COST_BUDGETS", {"": 3}),
    ("ADMISSION", {"MAX_RSS": 512}), ("ADMISSION", {"MAX_RSS_MB": -1}),
    ("MESSAGE_PRIORITIES", {"high": 0}),
])
def test_bad_resource_settings_are_refused_naming_the_key(key, value):
    with override_settings(QUEUETY={key: value}):
        with pytest.raises(ImproperlyConfigured, match=key):
            settings.validate()
    settings.reload()


def test_the_issues_settings_are_accepted():
    with override_settings(QUEUETY={
            "CONCURRENCY_LIMITS": {"openai": 8, "tenant:*": 2}, "RATE_LIMITS": {"openai": (500, 60)},
            "QUEUE_COST_BUDGETS": {"llm": 20}, "GROUP_COST_BUDGETS": {"openai": 12},
            "ADMISSION": {"MAX_RSS_MB": 1024, "MIN_AVAILABLE_MB": 256, "DEFER_SECONDS": 5}}):
        settings.validate()
        assert settings.CONCURRENCY_LIMITS["tenant:*"] == 2
    settings.reload()


def test_throttle_words_say_the_group_and_the_numbers():
    from queuety.core.describe import throttle_words

    assert throttle_words({"group": "openai", "reason": "concurrency", "limit": 8,
                           "in_flight": 8}) == "group 'openai': concurrency 8/8 in flight"
    assert throttle_words({"group": "openai", "reason": "rate", "limit": 60,
                           "per_seconds": 60.0, "starts": 60}) == \
        "group 'openai': rate 60/60 starts in 60 s"
    assert throttle_words({"group": None, "reason": "queue_cost", "queue": "llm",
                           "budget": 20, "running_cost": 18, "cost": 5}) == \
        "queue 'llm': cost budget 18 running + 5 > 20"
    assert throttle_words({"group": None, "reason": "memory", "detail": "low"}) == \
        "worker: deferred: low"


def test_a_rate_window_is_its_period_plus_a_small_slack():
    assert resources.rate_window(1.0) == pytest.approx(1.05)
    assert resources.rate_window(60.0) == pytest.approx(60.05)   # 50 ms at most
    assert resources.rate_window(0.2) == pytest.approx(0.21)     # 5% of a short period


def test_within_budgets_counts_each_rows_own_cost():
    rows = [Waiting(1, "g", 1, cost=1), Waiting(2, "g", 1, cost=10), Waiting(3, "h", 1, cost=3),
            Waiting(4, "g", 1, cost=1)]
    # Group g's budget of 10 holds 4 now: the 10-unit row closes g (the 1-unit row after it
    # does not overtake it); h has no budget of its own.
    assert resources.within_budgets(rows, group_budgets={"g": (10, 4)}) == [1, 3]
    # Nothing held: a budget still admits one row, however costly.
    assert resources.within_budgets([Waiting(9, "g", 1, cost=50)],
                                    group_budgets={"g": (10, 0)}) == [9]
    # A queue's budget stops the line at the first row that does not fit.
    assert resources.within_budgets(rows, queue_budget=12, queue_running=0) == [1, 2]
    # Rows of a lower priority do not overtake a busy group's better one.
    ranked = [Waiting(5, "a", 2), Waiting(6, "b", 1)]
    assert resources.within_budgets(ranked, outranked_by=2) == [5]
    assert resources.within_budgets(ranked, outranked_by=3) == []


def test_within_budgets_leaves_a_groups_rows_that_its_better_step_elsewhere_precedes():
    rows = [Waiting(3, "g", 2), Waiting(5, "g", 1), Waiting(6, "h", 1), Waiting(8, "g", 1)]
    # g's best step in no queue's line is (priority 1, id 7): g's priority-2 row and its older
    # priority-1 row go first, the younger one waits for it; h is not held back.
    assert resources.within_budgets(rows, floors={"g": (1, 7)}) == [3, 5, 6]
