"""The pure rules between a step's outcome and its run's next row (``queuety.core.flow``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import queuety
from queuety.core import flow
from queuety.core.budget import Usage
from tests import workflows

# -- module-level helpers: the builder stores them by dotted path ---------------------------


def touch_state(state):
    """A repeat condition that writes to the state it is given (it must get a copy)."""
    state["touched"] = True
    return False


def tally(state, aggregate):
    """A reducer: sees the state with the aggregate merged in."""
    return {"tally": aggregate["succeeded"], "saw_result": "r" in state, "base": state.get("base")}


def reduce_to_nothing(state, aggregate):
    return None


def reduce_to_list(state, aggregate):
    return [aggregate["total"]]


def reduce_to_text(state, aggregate):
    return "done"


def reduce_to_object(state, aggregate):
    return {"when": object()}


class PlainReducer:
    """A reducer class: instantiated, then ``.reduce(state, aggregate)``."""

    def reduce(self, state, aggregate):
        return {"reduced_by": "class", "total": aggregate["total"], "base": state.get("base")}


class StepReducer(queuety.Step):
    """A reducer class the builder accepts (it resolves reducers like step handlers)."""

    def handle(self, state):
        return None

    def reduce(self, state, aggregate):
        return {"reduced_by": "step class", "failed": aggregate["failed"]}


# -- failure_record -------------------------------------------------------------------------


@pytest.mark.parametrize("error, described", [
    (RuntimeError("boom"), {"type": "RuntimeError", "message": "boom"}),
    (queuety.PermanentError("card declined"),
     {"type": "queuety.exceptions.PermanentError", "message": "card declined"}),
    (queuety.StepTimeout("late"), {"type": "queuety.exceptions.StepTimeout", "message": "late"}),
    (queuety.BudgetExceeded("max_cost_units", 3, 4, 9, "w"),
     {"type": "queuety.exceptions.BudgetExceeded",
      "message": "Run 9 of workflow 'w' exceeded its max_cost_units budget: 4 > 3.",
      "budget": "max_cost_units", "limit": 3, "used": 4}),
    (queuety.BudgetExceeded("max_iterations", 2, 3, 9, "w", message="loop ran away"),
     {"type": "queuety.exceptions.BudgetExceeded", "message": "loop ran away",
      "budget": "max_iterations", "limit": 2, "used": 3}),
])
def test_failure_record__shape(error, described):
    record = flow.failure_record(error, step="charge", step_index=2, attempt=1, max_attempts=3)
    assert record == {**described, "step": "charge", "step_index": 2, "attempt": 1,
                      "max_attempts": 3}


def test_failure_record__extra_keys_and_no_location():
    record = flow.failure_record(queuety.WorkflowWaitFailed("gone"), step=None, step_index=None,
                                 attempt=None, max_attempts=None, child_run=12,
                                 wait={"matched": [], "failed": [4], "remaining": []})
    assert record == {"type": "queuety.exceptions.WorkflowWaitFailed", "message": "gone",
                      "step": None, "step_index": None, "attempt": None, "max_attempts": None,
                      "child_run": 12, "wait": {"matched": [], "failed": [4], "remaining": []}}


def test_failure_record__never_keeps_a_traceback():
    try:
        raise ValueError("raised for real")
    except ValueError as error:
        record = flow.failure_record(error, step="s", step_index=0, attempt=1, max_attempts=1)
    assert "traceback" not in record and record["message"] == "raised for real"


# -- check_budget ---------------------------------------------------------------------------

BASE = queuety.workflow("w").then(workflows.step_a)
UNSERIALISABLE = {"x": object()}


@pytest.mark.parametrize("builder, state, usage", [
    # No budget at all: nothing is measured, not even a state that is not JSON.
    (BASE, UNSERIALISABLE, Usage(10**6, 10**6, 10**6, 10**9)),
    # Budgets set, but no max_state_bytes: the state is not measured, and the usage's own
    # public_state_bytes is ignored.
    (BASE.max_transitions(5), UNSERIALISABLE, Usage(transitions=5, public_state_bytes=10**9)),
    (BASE.max_cost_units(5).max_started_workflows(2), {"x": 1},
     Usage(cost_units=5, started_workflows=2)),
    # Budgets without a usage counter are checked elsewhere.
    (BASE.max_for_each_items(1).max_step_attempts(1), UNSERIALISABLE, Usage(10**6, 10**6, 10**6)),
    # max_state_bytes measures the state, not the usage figure passed in.
    (BASE.max_state_bytes(18), {"a": "ééééé"}, Usage(public_state_bytes=10**9)),
])
def test_check_budget__within_or_not_configured(builder, state, usage):
    flow.check_budget(builder.build(), 7, state, usage)


@pytest.mark.parametrize("builder, state, usage, budget, limit, used", [
    (BASE.max_transitions(2), {}, Usage(transitions=3), "max_transitions", 2, 3),
    (BASE.max_cost_units(5), {}, Usage(cost_units=6), "max_cost_units", 5, 6),
    (BASE.max_started_workflows(1), {}, Usage(started_workflows=2), "max_started_workflows",
     1, 2),
    # '{"a":"ééééé"}' is 8 ASCII bytes and 5 two-byte characters: 18 bytes.
    (BASE.max_state_bytes(17), {"a": "ééééé"}, Usage(), "max_state_bytes", 17, 18),
    # The first budget in check order is the one named.
    (BASE.max_state_bytes(1).max_transitions(1), {"a": 1}, Usage(transitions=2),
     "max_transitions", 1, 2),
])
def test_check_budget__over_a_limit_names_it(builder, state, usage, budget, limit, used):
    with pytest.raises(queuety.BudgetExceeded,
                       match=f"^Run 7 of workflow 'w' exceeded its {budget} budget: "
                             f"{used} > {limit}.$") as breach:
        flow.check_budget(builder.build(), 7, state, usage)
    assert (breach.value.budget, breach.value.limit, breach.value.used, breach.value.run_id) == \
        (budget, limit, used, 7)


# -- repeat_decision ------------------------------------------------------------------------

LOOP = queuety.workflow("w").then(workflows.step_a)


@pytest.mark.parametrize("builder, state, again", [
    # until a state key holds the expected value (True by default), compared as JSON
    (LOOP.repeat_until("step_a", "done"), {"done": True}, False),
    (LOOP.repeat_until("step_a", "done"), {"done": False}, True),
    (LOOP.repeat_until("step_a", "done"), {}, True),
    (LOOP.repeat_until("step_a", "done"), {"done": 1}, True),
    (LOOP.repeat_until("step_a", "status", "ready"), {"status": "ready"}, False),
    (LOOP.repeat_until("step_a", "status", "ready"), {"status": "waiting"}, True),
    (LOOP.repeat_until("step_a", "count", 1), {"count": 1.0}, True),
    (LOOP.repeat_until("step_a", "tags", ["a", "b"]), {"tags": ["a", "b"]}, False),
    (LOOP.repeat_until("step_a", "missing", None), {}, False),
    # while a state key holds the expected value
    (LOOP.repeat_while("step_a", "more"), {"more": True}, True),
    (LOOP.repeat_while("step_a", "more"), {"more": False}, False),
    (LOOP.repeat_while("step_a", "more"), {}, False),
    (LOOP.repeat_while("step_a", "more"), {"more": "yes"}, False),
    # a condition function instead of a state key
    (LOOP.repeat_until("step_a", condition=workflows.counter_at_least_3), {"counter": 3}, False),
    (LOOP.repeat_until("step_a", condition=workflows.counter_at_least_3), {"counter": 1}, True),
    (LOOP.repeat_while("step_a", condition=workflows.counter_at_least_3), {"counter": 3}, True),
    (LOOP.repeat_while("step_a", condition=workflows.counter_at_least_3), {}, False),
    (LOOP.repeat_while("step_a", condition="tests.workflows.always"), {}, True),
])
def test_repeat_decision__modes_and_sources(builder, state, again):
    decided, loops = flow.repeat_decision(builder.build(), 7, 1, state, {})
    assert decided is again
    assert loops == ({"1": 1} if again else {})


def test_repeat_decision__condition_gets_a_copy_of_the_state():
    spec = LOOP.repeat_until("step_a", condition=touch_state).build()
    state = {"n": 1}
    assert flow.repeat_decision(spec, 7, 1, state, {})[0] is True
    assert state == {"n": 1}


NESTED = (queuety.workflow("w").then(workflows.step_a)
          .repeat_while("step_a", "inner", name="inner")           # index 1
          .then(workflows.step_b)
          .repeat_while("step_a", "outer", name="outer")           # index 3
          .build())


@pytest.mark.parametrize("index, state, loops, again, after", [
    # going round again counts one more iteration for this repeat step, keeping the others
    (1, {"inner": True}, {}, True, {"1": 1}),
    (1, {"inner": True}, {"1": 2}, True, {"1": 3}),
    (1, {"inner": True}, {"3": 4}, True, {"3": 4, "1": 1}),
    (3, {"outer": True}, {"1": 2}, True, {"1": 2, "3": 1}),
    # the loop is over: its counter goes, so a later pass starts it afresh
    (1, {}, {"1": 2, "3": 4}, False, {"3": 4}),
    (3, {}, {"1": 2, "3": 4}, False, {"1": 2}),
    (3, {}, {}, False, {}),
])
def test_repeat_decision__iterations_per_repeat_step(index, state, loops, again, after):
    before = dict(loops)
    assert flow.repeat_decision(NESTED, 7, index, state, loops) == (again, after)
    assert loops == before  # the counters passed in are not changed


BOUNDED = LOOP.repeat_until("step_a", "done", max_iterations=2).build()


@pytest.mark.parametrize("loops, state, result", [
    ({}, {}, (True, {"1": 1})),
    ({"1": 1}, {}, (True, {"1": 2})),
    ({"1": 2}, {"done": True}, (False, {})),   # ending at the limit is fine
])
def test_repeat_decision__within_max_iterations(loops, state, result):
    assert flow.repeat_decision(BOUNDED, 7, 1, state, loops) == result


def test_repeat_decision__past_max_iterations_is_a_budget_breach():
    with pytest.raises(queuety.BudgetExceeded,
                       match="^Repeat step 'repeat_until_1' of run 7 exceeded its "
                             "max_iterations of 2.$") as breach:
        flow.repeat_decision(BOUNDED, 7, 1, {"done": False}, {"1": 2})
    assert (breach.value.budget, breach.value.limit, breach.value.used, breach.value.run_id,
            breach.value.workflow) == ("max_iterations", 2, 3, 7, "w")


# -- for_each_items -------------------------------------------------------------------------


def for_each_spec(mode="all", quorum=None, limit=None):
    builder = queuety.workflow("w").then(workflows.step_a).for_each(
        "items", workflows.run_task, mode=mode, quorum=quorum)
    if limit is not None:
        builder = builder.max_for_each_items(limit)
    spec = builder.build()
    return spec, spec.steps[1]


@pytest.mark.parametrize("state, got", [
    ({}, "NoneType"),
    ({"items": None}, "NoneType"),
    ({"items": "abc"}, "str"),
    ({"items": {"a": 1}}, "dict"),
    ({"items": 3}, "int"),
    ({"items": (1, 2)}, "tuple"),
])
def test_for_each_items__not_a_list(state, got):
    spec, step = for_each_spec()
    with pytest.raises(queuety.InvalidStepOutput,
                       match=f"^For-each step 'items_for_each' of run 7 expected state key "
                             f"'items' to hold a list \\(got {got}\\).$"):
        flow.for_each_items(spec, 7, step, state)


@pytest.mark.parametrize("mode, quorum, limit, items", [
    ("all", None, None, [1, 2, 3]),
    ("all", None, 3, [1, 2, 3]),                     # at the limit
    ("all", None, 1, []),                            # nothing to fan out to: settles at once
    ("first_success", None, 2, [{"id": 1}]),
    ("quorum", 2, None, ["a", "b"]),
])
def test_for_each_items__returns_the_list(mode, quorum, limit, items):
    spec, step = for_each_spec(mode, quorum, limit)
    assert flow.for_each_items(spec, 7, step, {"items": items, "other": 1}) is items


def test_for_each_items__over_max_for_each_items():
    spec, step = for_each_spec(limit=2)
    with pytest.raises(queuety.BudgetExceeded,
                       match="^For-each step 'items_for_each' of run 7 planned 3 items, over "
                             "its max_for_each_items budget of 2.$") as breach:
        flow.for_each_items(spec, 7, step, {"items": [1, 2, 3]})
    assert (breach.value.budget, breach.value.limit, breach.value.used) == \
        ("max_for_each_items", 2, 3)


@pytest.mark.parametrize("mode, quorum", [("first_success", None), ("quorum", 1)])
def test_for_each_items__empty_list_cannot_satisfy_a_success_mode(mode, quorum):
    spec, step = for_each_spec(mode, quorum)
    with pytest.raises(queuety.InvalidStepOutput,
                       match=f"^For-each step 'items_for_each' of run 7 has no items, so mode "
                             f"'{mode}' can never be satisfied.$"):
        flow.for_each_items(spec, 7, step, {"items": []})


# -- join_output ----------------------------------------------------------------------------

PARALLEL = (queuety.workflow("w").then(workflows.step_a)
            .parallel([workflows.step_b, workflows.step_c, workflows.StepB]).build().steps[1])
BRANCHES = [
    {"index": 0, "status": "completed", "output": {"x": 0, "first": True, "_next_step": "b"}},
    {"index": 1, "status": "completed", "output": None},
    {"index": 2, "status": "completed", "output": {"x": 2, "_private": 1, "last": True}},
]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_join_output__parallel_merges_in_branch_order(order):
    rows = [BRANCHES[i] for i in order]
    assert flow.join_output(PARALLEL, {"x": "state", "base": 1}, rows, run_id=7) == \
        {"x": 2, "first": True, "last": True}


def test_join_output__parallel_without_rows():
    assert flow.join_output(PARALLEL, {"base": 1}, [], run_id=7) == {}


def item_row(index, item, status, output=None, error=None, finished_at=1.0):
    return {"index": index, "item": item, "status": status, "output": output, "error": error,
            "finished_at": finished_at}


ITEM_ROWS = [
    item_row(2, "c", "completed", {"v": 3}, finished_at=1.0),
    item_row(0, "a", "failed", error={"type": "ValueError", "message": "no"}, finished_at=0.5),
    item_row(1, "b", "completed", {"v": 2}, finished_at=2.0),
]
AGGREGATE = {
    "mode": "all", "quorum": None, "total": 3, "succeeded": 2, "failed": 1, "settled": True,
    "winner": {"index": 2, "item": "c", "output": {"v": 3}},
    "results": [{"index": 1, "item": "b", "output": {"v": 2}},
                {"index": 2, "item": "c", "output": {"v": 3}}],
    "failures": [{"index": 0, "item": "a", "error": {"type": "ValueError", "message": "no"}}],
}
EMPTY_AGGREGATE = {"mode": "all", "quorum": None, "total": 0, "succeeded": 0, "failed": 0,
                   "settled": True, "winner": None, "results": [], "failures": []}


def for_each_step(**options):
    return (queuety.workflow("w").then(workflows.step_a)
            .for_each("items", workflows.run_task, **options).build().steps[1])


@pytest.mark.parametrize("options, rows, expected", [
    ({}, ITEM_ROWS, {"items_for_each_results": AGGREGATE}),
    ({"result_key": "r"}, ITEM_ROWS, {"r": AGGREGATE}),
    ({"result_key": "r"}, [], {"r": EMPTY_AGGREGATE}),
    ({"result_key": "r", "reducer": tally}, ITEM_ROWS,
     {"r": AGGREGATE, "tally": 2, "saw_result": True, "base": 5}),
    ({"result_key": "r", "reducer": "tests.unit.test_flow.tally"}, [],
     {"r": EMPTY_AGGREGATE, "tally": 0, "saw_result": True, "base": 5}),
    ({"result_key": "r", "reducer": StepReducer}, ITEM_ROWS,
     {"r": AGGREGATE, "reduced_by": "step class", "failed": 1}),
    ({"result_key": "r", "reducer": reduce_to_nothing}, ITEM_ROWS, {"r": AGGREGATE}),
])
def test_join_output__for_each_aggregate_and_reducer(options, rows, expected):
    assert flow.join_output(for_each_step(**options), {"base": 5}, rows, run_id=7) == expected


def test_join_output__reducer_class_with_only_reduce():
    # Set on the spec directly: the builder resolves reducers like step handlers.
    step = for_each_step(result_key="r")
    step = replace(step, fanout=replace(step.fanout, reducer="tests.unit.test_flow.PlainReducer"))
    assert flow.join_output(step, {"base": 5}, ITEM_ROWS, run_id=7) == \
        {"r": AGGREGATE, "reduced_by": "class", "total": 3, "base": 5}


@pytest.mark.parametrize("reducer, message", [
    (reduce_to_list, "returned list; a step must return a dict"),
    (reduce_to_text, "returned str; a step must return a dict"),
    (reduce_to_object, "returned output that is not JSON"),
])
def test_join_output__reducer_must_return_a_json_dict(reducer, message):
    step = for_each_step(result_key="r", reducer=reducer)
    with pytest.raises(queuety.InvalidStepOutput, match=f"^Step 'items_for_each' of run 7 .*{message}"):
        flow.join_output(step, {}, ITEM_ROWS, run_id=7)


# -- child_restart_delay --------------------------------------------------------------------

CHILD = queuety.workflow("c").then(workflows.step_a)
POLICY = queuety.RetryPolicy(max_attempts=3, initial_delay=2, backoff_factor=3, jitter=0)
RESTARTED = queuety.workflow("p").run_workflow("child", CHILD, retry=POLICY).build().steps[0]
NOT_RESTARTED = queuety.workflow("p").run_workflow("child", CHILD).build().steps[0]
FAILED_CHILD = queuety.ChildRunFailed("child failed")
FINAL = [queuety.BudgetExceeded, queuety.PermanentError, queuety.WorkflowDefinitionError,
         queuety.InvalidStepOutput, queuety.UnknownStep, queuety.UnmatchedRoute]


def test_child_restart_delay__final_errors_are_the_unfixable_ones():
    assert flow.FINAL_CHILD_ERRORS == {f"{cls.__module__}.{cls.__qualname__}" for cls in FINAL}


@pytest.mark.parametrize("step, status, error", [
    (NOT_RESTARTED, "failed", {"type": "RuntimeError", "message": "boom"}),
    (NOT_RESTARTED, "failed", None),
    (RESTARTED, "cancelled", None),
    (RESTARTED, "cancelled", {"type": "RuntimeError", "message": "boom"}),
    *[(RESTARTED, "failed", {"type": f"{cls.__module__}.{cls.__qualname__}", "message": "x"})
      for cls in FINAL],
])
def test_child_restart_delay__not_restarted(step, status, error):
    assert flow.child_restart_delay(step, status, error, 1, FAILED_CHILD) is None


@pytest.mark.parametrize("error", [
    None,
    {},
    {"type": "RuntimeError", "message": "boom"},
    {"type": "queuety.exceptions.StepTimeout", "message": "late"},
    {"type": "queuety.exceptions.ChildRunFailed", "message": "grandchild failed"},
    {"type": "queuety.exceptions.WorkerLost", "message": "gone"},
])
@pytest.mark.parametrize("attempt, delay", [(1, 2.0), (2, 6.0), (3, None)])
def test_child_restart_delay__by_the_step_policy(error, attempt, delay):
    assert flow.child_restart_delay(RESTARTED, "failed", error, attempt, FAILED_CHILD) == delay


@pytest.mark.parametrize("retry_on, failure, delay", [
    (None, FAILED_CHILD, 2.0),
    ([queuety.ChildRunFailed], FAILED_CHILD, 2.0),
    (["queuety.exceptions.QueuetyError"], FAILED_CHILD, 2.0),
    ([ConnectionError], FAILED_CHILD, None),
    ([], FAILED_CHILD, None),
    (None, queuety.PermanentError("never retried"), None),
])
def test_child_restart_delay__policy_scope_matches_the_failure(retry_on, failure, delay):
    policy = queuety.RetryPolicy(max_attempts=2, initial_delay=2, jitter=0, retry_on=retry_on)
    step = queuety.workflow("p").run_workflow("child", CHILD, retry=policy).build().steps[0]
    assert flow.child_restart_delay(step, "failed", {"type": "RuntimeError"}, 1, failure) == delay
