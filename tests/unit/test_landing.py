"""The landing planner (``queuety.core.landing``), table-driven, against an in-memory Facts.

Every kind a landing does without a worker, and the kinds it lands on, × paused × pruned; timed
waits (first visit, a signal that does not settle, a resume, a loop back); budget breaches; and
workflow waits that can no longer be satisfied. No database: the plan is a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import queuety
from queuety import exceptions
from queuety.core import landing
from queuety.core.budget import Usage
from queuety.core.landing import (
    Complete,
    ConsumeSignals,
    DelayRow,
    Depend,
    Emit,
    FanOut,
    Mode,
    RunView,
    StartChild,
    TaskRow,
    Undepend,
    plan,
)
from queuety.core.transition import transition

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(minutes=5)


def work(state):
    return {}


def item_work(state, item, index):
    return {}


def finish(state):
    return {}


@dataclass
class Facts:
    """The database as a few lists: stored signals, other runs, the runs a start step makes."""

    signals: list[tuple[int, str, Any]] = field(default_factory=list)
    runs: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    next_id: int = 100
    started: list[tuple[int, list[dict[str, Any]], str]] = field(default_factory=list)

    def stored_signals(self, names):
        return [s for s in self.signals if s[1] in names]

    def awaited(self, ids):
        return {i: self.runs[i] for i in ids if i in self.runs}

    def start_runs(self, index, payloads, group):
        self.started.append((index, payloads, group))
        ids = list(range(self.next_id, self.next_id + len(payloads)))
        self.next_id += len(payloads)
        for i in ids:  # a started run is running until something finishes it
            self.runs[i] = ("running", {})
        return ids


def view(**changes: Any) -> RunView:
    """A run locked at step 0, three transitions in, running."""
    base = RunView(run_id=7, status="running", current_step=0, transitions=3,
                   wait_expires_at=None, state={"order": 1}, usage=Usage(3, 3, 0), writes={},
                   loops={}, groups={}, now=NOW)
    return replace(base, **changes)


def arriving(**changes: Any) -> RunView:
    """A run that just counted a transition (its row's count is behind the landing's)."""
    return view(**{"usage": Usage(4, 4, 0), **changes})


def child() -> queuety.WorkflowBuilder:
    return queuety.workflow("landing_child").then(work)


# -- the kinds, each as the step a run lands on -------------------------------------------------

def build(kind: str, pruned: bool) -> queuety.WorkflowSpec:
    """A workflow whose step 1 is of ``kind`` (step 0 a task, a task after it)."""
    flow = queuety.workflow(f"landing_{kind}").then(work, name="first")
    if pruned:
        flow = flow.prune_state_after(1)
    flow = {
        "task": lambda f: f.then(work, name="the_step"),
        "delay": lambda f: f.delay(seconds=30, name="the_step"),
        "parallel": lambda f: f.parallel([work, work], name="the_step"),
        "for_each": lambda f: f.for_each("items", item_work, name="the_step"),
        "for_each_empty": lambda f: f.for_each("nothing", item_work, name="the_step"),
        "repeat_again": lambda f: f.repeat_until("first", "done", name="the_step"),
        "repeat_done": lambda f: f.repeat_until("first", "order", 1, name="the_step"),
        "start": lambda f: f.start_workflows("items", child(), name="the_step",
                                             group_key="kids"),
        "signal_parked": lambda f: f.wait_for_signal("nothing_yet", name="the_step"),
        "signal_settled": lambda f: f.wait_for_signal("go", result_key="go", name="the_step"),
        "approval": lambda f: f.wait_for_approval(name="the_step"),
        "workflows_pending": lambda f: f.wait_for_workflows([50], name="the_step"),
        "workflows_settled": lambda f: f.wait_for_workflows([51], result_key="r",
                                                            name="the_step"),
        "workflows_impossible": lambda f: f.wait_for_workflows([52], name="the_step"),
        "child": lambda f: f.run_workflow("the_step", child()),
        "timed_signal": lambda f: f.wait_for_signal("later", name="the_step", timeout=60),
    }[kind](flow)
    return flow.then(work, name="after").build()


def facts_for_kinds() -> Facts:
    return Facts(signals=[(11, "go", {"ok": True})],
                 runs={50: ("running", {}), 51: ("completed", {"x": 1}), 52: ("failed", {})})


#: kind -> (status, index it stays at, entry type, notes, effects' types) when not paused.
EXPECTED: dict[str, tuple[str, int | None, type | None, list[str], list[type]]] = {
    "task": ("running", 1, TaskRow, [], []),
    "delay": ("running", 1, DelayRow, [], []),
    "parallel": ("running", 1, FanOut, [], []),
    "for_each": ("running", 1, FanOut, [], []),
    "for_each_empty": ("running", 2, TaskRow, ["for_each_settled"], []),
    "repeat_again": ("running", 0, TaskRow, ["repeat_evaluated"], []),
    "repeat_done": ("running", 2, TaskRow, ["repeat_evaluated"], []),
    "start": ("running", 2, TaskRow, ["workflows_started"], []),
    "signal_parked": ("waiting_for_signal", 1, None, ["workflow_waiting"], [Emit]),
    "signal_settled": ("running", 2, TaskRow, ["wait_settled"], [ConsumeSignals]),
    "approval": ("waiting_for_signal", 1, None, ["workflow_waiting"], [Emit]),
    "workflows_pending": ("waiting_for_workflows", 1, None, ["workflow_waiting"],
                          [Depend, Emit]),
    "workflows_settled": ("running", 2, TaskRow, ["wait_settled"], [Undepend]),
    "workflows_impossible": ("failed", 1, None, [], []),
    "child": ("waiting_for_workflows", 1, StartChild, [], []),
    "timed_signal": ("waiting_for_signal", 1, None, ["workflow_waiting"], [Emit]),
}

#: The transitions a landing on each kind counts itself.
COUNTED = {"for_each_empty": 1, "repeat_again": 1, "repeat_done": 1, "start": 1,
           "signal_settled": 1, "workflows_settled": 1}

#: The keys a landing on each kind writes by its own transition (prune_state_after).
WRITTEN = {"for_each_empty": {"the_step_results"}, "start": {"started_workflow_ids"},
           "signal_settled": {"go"}, "workflows_settled": {"r"}}

CASES = [(kind, paused, pruned) for kind in EXPECTED for paused in (False, True)
         for pruned in (False, True)]


@pytest.mark.parametrize(("kind", "paused", "pruned"), CASES,
                         ids=[f"{k}-{'paused' if p else 'moving'}-{'pruned' if q else 'kept'}"
                              for k, p, q in CASES])
def test_landing_on_each_kind(kind, paused, pruned):
    spec = build(kind, pruned)
    facts = facts_for_kinds()
    arrival = arriving(state={"order": 1, "items": [1, 2], "nothing": [], "done": False})
    planned = plan(spec, arrival, 1, facts, NOW, mode=Mode.HOLD if paused else Mode.MOVE)
    if paused:  # it moves, evaluates nothing, stays paused: only a task row is made, held
        assert (planned.status, planned.index, planned.notes, planned.effects) == (
            "paused", 1, (), ())
        assert planned.entry == (TaskRow(1, published=False) if kind == "task" else None)
        assert facts.started == []
        assert planned.usage == arrival.usage
        return
    status, index, entry, notes, effects = EXPECTED[kind]
    failed = planned.failure is not None
    assert ("failed" if failed else planned.status) == status
    assert (planned.failure.index if failed else planned.index) == index
    assert (planned.entry is None and entry is None) or isinstance(planned.entry, entry)
    assert [note.kind for note in planned.notes] == notes
    assert [type(effect) for effect in planned.effects] == effects
    assert planned.usage.transitions == 4 + COUNTED.get(kind, 0)
    # A pruned workflow's landing carries its state_writes; any other writes none.
    assert (planned.writes is not None) == pruned
    if pruned:  # the keys the landing's own transition wrote, at its number
        written = {k for k, n in planned.writes.items() if n == 5}
        assert written == WRITTEN.get(kind, set())


# -- what each kind decides, in detail -----------------------------------------------------------

def test_a_task_step_gets_its_published_row():
    planned = plan(build("task", False), arriving(), 1, Facts(), NOW)
    assert planned.entry == TaskRow(1, published=True)
    assert planned.state == {"order": 1}


def test_a_delay_step_gets_its_due_row():
    planned = plan(build("delay", False), arriving(), 1, Facts(), NOW)
    assert planned.entry == DelayRow(1, 30)


def test_a_for_each_step_fans_out_to_the_items_it_found():
    planned = plan(build("for_each", False), arriving(state={"items": ["a", "b"]}), 1,
                   Facts(), NOW)
    assert planned.entry == FanOut(1, ("a", "b"))


def test_a_parallel_step_fans_out_without_items():
    planned = plan(build("parallel", False), arriving(), 1, Facts(), NOW)
    assert planned.entry == FanOut(1, None)


def test_an_empty_for_each_settles_as_a_transition_with_its_aggregate():
    spec = queuety.workflow("empty_each").then(work).for_each(
        "items", item_work, result_key="r", name="each").then(finish).build()
    planned = plan(spec, arriving(state={"items": []}), 1, Facts(), NOW)
    assert planned.index == 2
    assert planned.state["r"]["total"] == 0
    assert planned.notes[0].data["output"]["r"]["total"] == 0


def test_a_for_each_without_a_list_raises():
    with pytest.raises(exceptions.InvalidStepOutput):
        plan(build("for_each", False), arriving(state={"items": "nope"}), 1, Facts(), NOW)


def test_a_repeat_goes_back_and_counts_its_iteration():
    planned = plan(build("repeat_again", False), arriving(state={"done": False}), 1, Facts(),
                   NOW)
    assert planned.index == 0
    assert planned.loops == {"1": 1}
    assert planned.notes[0].data == {"again": True, "iterations": 1}


def test_a_repeat_continues_from_the_loop_counters_it_locked():
    planned = plan(build("repeat_again", False),
                   arriving(state={"done": False}, loops={"1": 4}), 1, Facts(), NOW)
    assert planned.loops == {"1": 5}


def test_a_finished_repeat_drops_its_counter():
    planned = plan(build("repeat_done", False), arriving(loops={"1": 4, "9": 1}), 1, Facts(),
                   NOW)
    assert planned.loops == {"9": 1}
    assert planned.index == 2


def test_a_repeat_past_its_max_iterations_raises():
    spec = queuety.workflow("loop_cap").then(work, name="first").repeat_until(
        "first", "done", max_iterations=2, name="loop").then(finish).build()
    with pytest.raises(exceptions.BudgetExceeded, match="max_iterations"):
        plan(spec, arriving(state={"done": False}, loops={"1": 2}), 1, Facts(), NOW)


def test_no_loop_counters_are_written_without_a_repeat():
    assert plan(build("task", False), arriving(), 1, Facts(), NOW).loops is None


def test_a_start_step_starts_its_runs_and_fills_its_group():
    facts = Facts()
    planned = plan(build("start", False), arriving(state={"items": ["a", "b"]}), 1, facts, NOW)
    assert facts.started == [(1, [{"item": "a", "start_item_index": 0},
                                  {"item": "b", "start_item_index": 1}], "kids")]
    assert planned.state["started_workflow_ids"] == [100, 101]
    assert planned.groups == {"kids": [100, 101]}
    assert planned.usage.started_workflows == 2
    assert planned.notes[0].data["runs"] == [100, 101]


def test_a_start_step_entered_again_replaces_its_group():
    planned = plan(build("start", False),
                   arriving(state={"items": ["a"]}, groups={"kids": [1, 2], "other": [3]}), 1,
                   Facts(), NOW)
    assert planned.groups == {"kids": [100], "other": [3]}


def test_a_start_step_over_its_budget_starts_nothing():
    spec = queuety.workflow("start_cap").then(work).max_started_workflows(1).start_workflows(
        "items", child()).build()
    facts = Facts()
    with pytest.raises(exceptions.BudgetExceeded, match="none was started"):
        plan(spec, arriving(state={"items": [1, 2]}), 1, facts, NOW)
    assert facts.started == []


def test_started_runs_can_be_awaited_in_the_same_landing():
    spec = queuety.workflow("start_then_wait").then(work).start_workflows(
        "items", child(), group_key="g").wait_for_workflow_group("g").then(finish).build()
    facts = Facts()
    planned = plan(spec, arriving(state={"items": [1, 2]}), 1, facts, NOW)
    assert planned.status == "waiting_for_workflows"
    assert planned.index == 2
    assert planned.effects[0] == Depend(2, (100, 101))
    assert planned.groups == {"g": [100, 101]}


def test_no_groups_are_written_without_a_start_or_a_workflow_wait():
    assert plan(build("signal_settled", False), arriving(), 1, facts_for_kinds(),
                NOW).groups is None


# -- signal waits -----------------------------------------------------------------------------

def test_a_stored_signal_settles_its_wait_and_is_consumed():
    planned = plan(build("signal_settled", False), arriving(), 1, facts_for_kinds(), NOW)
    assert planned.state["go"] == {"ok": True}
    assert planned.effects == (ConsumeSignals((11,), "the_step"),)
    assert planned.notes[0].data["signal_ids"] == [11]


def test_two_waits_for_one_signal_take_two_signals():
    spec = queuety.workflow("twice").then(work).wait_for_signal(
        "go", result_key="a", name="one").wait_for_signal(
        "go", result_key="b", name="two").then(finish).build()
    facts = Facts(signals=[(1, "go", "first"), (2, "go", "second")])
    planned = plan(spec, arriving(), 1, facts, NOW)
    assert (planned.state["a"], planned.state["b"]) == ("first", "second")
    assert planned.effects == (ConsumeSignals((1,), "one"), ConsumeSignals((2,), "two"))
    assert planned.index == 3


def test_a_second_wait_for_one_signal_parks_when_only_one_came():
    spec = queuety.workflow("twice_one").then(work).wait_for_signal(
        "go", name="one").wait_for_signal("go", name="two").then(finish).build()
    planned = plan(spec, arriving(), 1, Facts(signals=[(1, "go", {})]), NOW)
    assert (planned.status, planned.index) == ("waiting_for_signal", 2)


def test_a_signal_that_does_not_match_leaves_the_wait_parked():
    spec = queuety.workflow("matching").then(work).wait_for_signal(
        "go", match_payload={"ok": False}).then(finish).build()
    planned = plan(spec, arriving(), 1, facts_for_kinds(), NOW)
    assert planned.status == "waiting_for_signal"


def test_a_parked_wait_tells_who_listens_what_it_waits_for():
    planned = plan(build("approval", False), arriving(), 1, Facts(), NOW)
    assert planned.effects == (Emit("run_waiting", {
        "run_id": 7, "workflow": "landing_approval", "step": "the_step",
        "waiting_for": ["approval"], "kind": "approval"}),)


def test_a_wait_that_settles_then_completes_the_run():
    spec = queuety.workflow("last_wait").then(work).wait_for_signal("go").build()
    planned = plan(spec, arriving(), 1, facts_for_kinds(), NOW)
    assert (planned.status, planned.index, planned.entry) == ("completed", None, Complete())
    assert [n.kind for n in planned.notes] == ["wait_settled", "workflow_completed"]


def test_landing_past_the_last_step_completes_even_paused():
    spec = queuety.workflow("done").then(finish).build()
    for mode in Mode:
        planned = plan(spec, arriving(), None, Facts(), NOW, mode=mode)
        assert (planned.status, planned.entry) == ("completed", Complete())


def test_a_loop_back_to_a_wait_settles_it_again_from_a_new_signal():
    spec = queuety.workflow("loop_wait").then(work, name="first").wait_for_signal(
        "go", result_key="go", name="wait").repeat_while("wait", "again", True,
                                                        name="loop").then(finish).build()
    facts = Facts(signals=[(1, "go", 1), (2, "go", 2)])
    planned = plan(spec, arriving(state={"again": True}), 1, facts, NOW)
    # wait (1) -> loop back -> wait (2) -> loop back -> wait parks: no third signal
    assert (planned.status, planned.index) == ("waiting_for_signal", 1)
    assert planned.loops == {"2": 2}
    assert [n.kind for n in planned.notes] == ["wait_settled", "repeat_evaluated",
                                               "wait_settled", "repeat_evaluated",
                                               "workflow_waiting"]


# -- timed waits ------------------------------------------------------------------------------

TIMED = build("timed_signal", False)


def test_a_timed_wait_first_visited_expires_its_timeout_from_now():
    planned = plan(TIMED, arriving(), 1, Facts(), NOW)
    assert planned.wait_expires_at == NOW + timedelta(seconds=60)
    assert planned.notes[0].data["expires_at"] == (NOW + timedelta(seconds=60)).isoformat()
    assert [type(e) for e in planned.effects] == [Emit]


def test_a_signal_that_does_not_settle_a_timed_wait_keeps_its_expiry_and_says_nothing():
    parked = view(status="waiting_for_signal", current_step=1, wait_expires_at=EARLIER)
    planned = plan(TIMED, parked, 1, Facts(signals=[(3, "other", {})]), NOW)
    assert planned.wait_expires_at == EARLIER
    assert planned.effects == ()


def test_a_resumed_timed_wait_keeps_its_expiry_and_announces_the_wait_again():
    paused = view(status="paused", current_step=1, wait_expires_at=EARLIER)
    planned = plan(TIMED, paused, 1, Facts(), NOW)
    assert planned.wait_expires_at == EARLIER
    assert [type(e) for e in planned.effects] == [Emit]


def test_a_timed_wait_expires_from_the_landings_own_time():
    later = NOW + timedelta(hours=1)
    planned = plan(TIMED, arriving(), 1, Facts(), later)
    assert planned.wait_expires_at == later + timedelta(seconds=60)


def test_a_resumed_timed_wait_without_an_expiry_gets_a_new_one():
    planned = plan(TIMED, view(status="paused", current_step=1), 1, Facts(), NOW)
    assert planned.wait_expires_at == NOW + timedelta(seconds=60)


def test_a_loop_back_to_a_timed_wait_starts_a_new_timeout():
    parked = arriving(status="waiting_for_signal", current_step=1, wait_expires_at=EARLIER)
    planned = plan(TIMED, parked, 1, Facts(), NOW)
    assert planned.wait_expires_at == NOW + timedelta(seconds=60)


def test_a_paused_run_keeps_the_expiry_of_the_timed_wait_it_is_paused_at():
    paused = view(status="paused", current_step=1, wait_expires_at=EARLIER)
    planned = plan(TIMED, paused, 1, Facts(), NOW, mode=Mode.HOLD)
    assert (planned.status, planned.wait_expires_at) == ("paused", EARLIER)


def test_a_paused_run_at_an_untimed_step_has_no_expiry():
    paused = view(status="paused", current_step=1, wait_expires_at=EARLIER)
    planned = plan(build("signal_parked", False), paused, 1, Facts(), NOW, mode=Mode.HOLD)
    assert planned.wait_expires_at is None


def test_an_untimed_wait_has_no_expiry():
    planned = plan(build("signal_parked", False), arriving(), 1, Facts(), NOW)
    assert planned.wait_expires_at is None


def test_a_running_run_clears_its_expiry():
    planned = plan(build("task", False), arriving(wait_expires_at=EARLIER), 1, Facts(), NOW)
    assert planned.wait_expires_at is None


@pytest.mark.parametrize("status", ["waiting_for_signal", "paused", "running"])
@pytest.mark.parametrize("behind", [False, True])
def test_whether_a_parked_wait_is_announced(status, behind):
    seen = (arriving if behind else view)(status=status, current_step=1,
                                          wait_expires_at=EARLIER)
    planned = plan(TIMED, seen, 1, Facts(), NOW)
    stays_waiting = status == "waiting_for_signal" and not behind
    assert (planned.effects == ()) == stays_waiting
    kept = status in ("waiting_for_signal", "paused") and not behind
    assert planned.wait_expires_at == (EARLIER if kept else NOW + timedelta(seconds=60))


# -- budget breaches --------------------------------------------------------------------------

def capped(builder: queuety.WorkflowBuilder) -> queuety.WorkflowSpec:
    return builder.then(finish).build()


def test_a_wait_whose_settling_breaches_fails_the_run_there_with_its_earlier_state():
    spec = capped(queuety.workflow("cap_wait").max_transitions(4).then(work)
                  .wait_for_signal("go", result_key="go"))
    planned = plan(spec, arriving(), 1, facts_for_kinds(), NOW)
    assert planned.failure is not None
    assert planned.failure.index == 1
    assert planned.failure.state == {"order": 1}
    assert planned.failure.usage == Usage(4, 4, 0)
    assert planned.failure.error["budget"] == "max_transitions"
    assert planned.effects == ()  # nothing consumed


def test_a_signals_breach_raises_so_its_transaction_rolls_back():
    spec = capped(queuety.workflow("cap_ask").max_transitions(4).then(work)
                  .wait_for_signal("go", result_key="go"))
    with pytest.raises(exceptions.BudgetExceeded):
        plan(spec, arriving(), 1, facts_for_kinds(), NOW, mode=Mode.ASK)


def test_a_workflow_waits_breach_fails_the_run_at_the_wait():
    spec = capped(queuety.workflow("cap_wf").max_transitions(4).then(work)
                  .wait_for_workflows([51], result_key="r"))
    planned = plan(spec, arriving(), 1, facts_for_kinds(), NOW)
    assert planned.failure is not None and planned.failure.error["budget"] == "max_transitions"


def test_a_merge_over_the_state_size_budget_fails_at_the_wait():
    spec = capped(queuety.workflow("cap_bytes").max_state_bytes(40).then(work)
                  .wait_for_signal("go", result_key="go"))
    facts = Facts(signals=[(1, "go", "x" * 100)])
    planned = plan(spec, arriving(), 1, facts, NOW)
    assert planned.failure is not None and planned.failure.error["budget"] == "max_state_bytes"


@pytest.mark.parametrize("kind", ["repeat_again", "start", "for_each_empty"])
def test_a_counted_step_over_max_transitions_raises(kind):
    flow = queuety.workflow(f"cap_{kind}").max_transitions(4).then(work, name="first")
    flow = {"repeat_again": lambda f: f.repeat_until("first", "done"),
            "start": lambda f: f.start_workflows("items", child()),
            "for_each_empty": lambda f: f.for_each("nothing", item_work)}[kind](flow)
    with pytest.raises(exceptions.BudgetExceeded, match="max_transitions"):
        plan(flow.then(finish).build(),
             arriving(state={"items": [1], "nothing": [], "done": False}), 1,
             Facts(), NOW)


def test_a_breach_after_an_earlier_wait_keeps_that_waits_consumption():
    spec = capped(queuety.workflow("cap_second").max_transitions(5).then(work)
                  .wait_for_signal("a", name="one").wait_for_signal("b", name="two"))
    facts = Facts(signals=[(1, "a", {}), (2, "b", {})])
    planned = plan(spec, arriving(), 1, facts, NOW)
    assert planned.failure is not None and planned.failure.index == 2
    assert planned.effects == (ConsumeSignals((1,), "one"),)
    assert [n.kind for n in planned.notes] == ["wait_settled"]


# -- workflow waits that can no longer be satisfied -------------------------------------------

@pytest.mark.parametrize(("mode", "quorum", "runs", "impossible"), [
    ("all", None, {1: "completed", 2: "failed"}, True),
    ("all", None, {1: "completed", 2: "cancelled"}, True),
    ("all", None, {1: "completed"}, True),  # a missing run counts as failed
    ("all", None, {1: "completed", 2: "running"}, False),
    ("any", None, {1: "failed", 2: "failed"}, True),
    ("any", None, {1: "failed", 2: "running"}, False),
    ("quorum", 2, {1: "failed", 2: "completed"}, True),
    ("quorum", 1, {1: "failed", 2: "running"}, False),
])
def test_an_impossible_workflow_wait_fails_the_run(mode, quorum, runs, impossible):
    spec = capped(queuety.workflow(f"wf_{mode}").then(work)
                  .wait_for_workflows([1, 2], mode=mode, quorum=quorum))
    facts = Facts(runs={i: (status, {}) for i, status in runs.items()})
    planned = plan(spec, arriving(), 1, facts, NOW)
    assert (planned.failure is not None) == impossible
    if impossible:
        assert planned.failure.error["type"].endswith("WorkflowWaitFailed")
        assert "can no longer be satisfied" in planned.failure.error["message"]
        assert planned.failure.state == {"order": 1}
    else:
        assert planned.status == "waiting_for_workflows"


def test_a_workflow_wait_on_a_state_key_without_ids_fails_the_run():
    spec = capped(queuety.workflow("wf_key").then(work).wait_for_workflows("children"))
    planned = plan(spec, arriving(state={"children": "nope"}), 1, Facts(), NOW)
    assert planned.failure is not None
    assert planned.failure.error["type"].endswith("InvalidStepOutput")


def test_a_settled_workflow_wait_merges_the_runs_states():
    spec = capped(queuety.workflow("wf_merge").then(work).wait_for_workflows([1, 2]))
    facts = Facts(runs={1: ("completed", {"a": 1}), 2: ("completed", {"b": 2})})
    planned = plan(spec, arriving(), 1, facts, NOW)
    assert planned.state == {"order": 1, "a": 1, "b": 2}
    assert planned.notes[0].data["workflows"] == [1, 2]


# -- pruning --------------------------------------------------------------------------------

def test_a_landings_transitions_prune_the_keys_written_long_enough_ago():
    spec = capped(queuety.workflow("prune_wait").then(work).prune_state_after(1)
                  .wait_for_signal("go", result_key="go"))
    arrival = arriving(state={"order": 1, "old": 1}, writes={"old": 4})
    planned = plan(spec, arrival, 1, facts_for_kinds(), NOW)
    assert "old" not in planned.state
    assert planned.writes == {"go": 5}
    assert planned.notes[0].data["pruned"] == ["old"]


def test_a_landing_without_pruning_writes_no_state_writes():
    planned = plan(build("signal_settled", False), arriving(writes={"x": 1}), 1,
                   facts_for_kinds(), NOW)
    assert planned.writes is None
    assert "pruned" not in planned.notes[0].data


# -- one transition -------------------------------------------------------------------------

PLAIN = queuety.workflow("plain").then(finish).build()
PRUNED = queuety.workflow("pruned_t").then(work).prune_state_after(2).build()


def test_a_transition_merges_the_public_output_and_counts():
    moved = transition(PLAIN, 1, {"a": 1}, None, Usage(2, 5, 1), {"b": 2, "_next_step": "x"},
                       cost=3, started=2)
    assert moved.state == {"a": 1, "b": 2}
    assert moved.usage == Usage(3, 8, 3)
    assert (moved.writes, moved.pruned, moved.breach, moved.event_data) == (None, [], None, {})


def test_a_transition_takes_a_state_its_caller_merged():
    moved = transition(PLAIN, 1, {"a": 1}, None, Usage(), {"b": 2}, merged={"c": 3})
    assert moved.state == {"c": 3}


def test_a_transition_records_what_it_wrote_and_prunes():
    moved = transition(PRUNED, 1, {"a": 1, "b": 1}, {"a": 1, "b": 2}, Usage(2, 0, 0),
                       {"c": 1})
    assert moved.state == {"b": 1, "c": 1}
    assert moved.writes == {"b": 2, "c": 3}
    assert moved.event_data == {"pruned": ["a"]}


def test_a_transition_records_only_what_its_caller_says_was_written():
    moved = transition(PRUNED, 1, {"a": 1}, {}, Usage(), {"a": 1, "b": 2}, written={"b": 2})
    assert moved.writes == {"b": 1}


def test_a_transition_returns_its_breach_and_checked_raises_it():
    spec = queuety.workflow("t_cap").max_transitions(2).then(finish).build()
    moved = transition(spec, 9, {}, None, Usage(2, 0, 0), {"x": 1})
    assert isinstance(moved.breach, exceptions.BudgetExceeded)
    assert moved.state == {"x": 1}
    with pytest.raises(exceptions.BudgetExceeded):
        moved.checked()


def test_a_transition_within_budget_checks_clean():
    spec = queuety.workflow("t_ok").max_transitions(3).then(finish).build()
    moved = transition(spec, 9, {}, None, Usage(2, 0, 0), {})
    assert moved.checked() is moved


def test_a_view_after_a_transition_keeps_what_was_locked():
    moved = transition(PRUNED, 7, {"order": 1}, {}, Usage(3, 3, 0), {"x": 1})
    after = view().after(moved)
    assert (after.state, after.usage, after.writes) == ({"order": 1, "x": 1}, Usage(4, 3, 0),
                                                         {"x": 4})
    assert (after.status, after.transitions, after.current_step) == ("running", 3, 0)
    assert view(writes={"k": 1}).after(transition(PLAIN, 7, {}, None, Usage(), {})).writes \
        == {"k": 1}


# -- small rules ------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "index", "direct"), [
    ("task", 1, True), ("task", None, True), ("delay", 1, False), ("parallel", 1, False),
    ("signal_parked", 1, False), ("child", 1, False), ("start", 1, False)])
def test_which_landings_the_one_statement_transition_may_take(kind, index, direct):
    assert landing.lands_on_task(build(kind, False), index) is direct


@pytest.mark.parametrize(("status", "mode"), [
    ("paused", Mode.HOLD), ("running", Mode.MOVE), ("waiting_for_signal", Mode.MOVE)])
def test_a_paused_run_lands_held(status, mode):
    assert landing.mode_of(status) is mode


def test_a_child_step_started_from_a_workflow_wait_chain():
    spec = queuety.workflow("wf_then_child").then(work).wait_for_workflows(
        [1]).run_workflow("kid", child()).build()
    planned = plan(spec, arriving(), 1, Facts(runs={1: ("completed", {})}), NOW)
    assert (planned.status, planned.entry) == ("waiting_for_workflows", StartChild(2))
