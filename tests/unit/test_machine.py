"""State machine builder: its checks, its table and the workflow it compiles to."""

from __future__ import annotations

from datetime import timedelta

import pytest

import queuety
from queuety.core.definition import WorkflowSpec
from queuety.core.machine import END_STEP, EVENT_KEY, MACHINE_KEY
from tests import machine_steps

Error = queuety.WorkflowDefinitionError


def test_session__compiles_to_a_workflow_with_a_step_per_part_of_each_state():
    spec = machine_steps.session().build()
    assert [s.name for s in spec.steps] == [
        "idle.wait", "idle.route", "active", "active.wait", "active.route", "active.timeout",
        END_STEP]
    wait = spec.steps[3].wait
    assert wait is not None and wait.signals == ("close", "message") and wait.mode == "any"
    assert wait.result_key == EVENT_KEY and wait.timeout_target == "active.timeout"
    assert set(spec.steps[1].routes) == {"active", END_STEP, "idle.wait"}
    assert spec.machine is not None and spec.machine["initial"] == "idle"
    assert spec.machine["states"]["active"]["transitions"][0] == {
        "event": "message", "to": "active", "guard": "tests.machine_steps.under_limit",
        "action": "tests.machine_steps.reply"}


def test_hash__covers_guards_and_actions_and_survives_the_json_round_trip():
    spec = machine_steps.session().build()
    other = machine_steps.session(action=machine_steps.reply_flaky).build()
    assert spec.definition_hash != other.definition_hash
    again = WorkflowSpec.from_dict(spec.to_dict())
    assert again.definition_hash == spec.definition_hash and again.machine == spec.machine
    assert spec.version == "session.v1"


@pytest.mark.parametrize(("build", "words"), [
    (lambda m: m.state("a").on("go", to="nowhere").final("z"),
     ["'nowhere', which is not a state", "'a'", "'z'"]),
    (lambda m: m.state("a").on("go", to="a"), ["has no final state", ".final(name)"]),
    (lambda m: m.state("a").on("go", to="z").on("go", to="a").final("z"),
     ["two transitions on 'go'", "first has no guard"]),
    (lambda m: m.state("a").on("go", to="z").state("b").on("go", to="z").final("z"),
     ["no transition leads to", "'b'"]),
    (lambda m: m.state("a").on("timeout", to="z").final("z"),
     ["'timeout' transition but no timeout"]),
    (lambda m: m.state("a", timeout=5).on("go", to="z").final("z"),
     ["has a timeout but no 'timeout'"]),
    (lambda m: m.state("a").state("b").on("go", to="z").final("z"), ["'a' has no events"]),
    (lambda m: m, ["has no states"]),
])
def test_build__refuses_a_bad_machine_with_a_message_naming_the_fix(build, words):
    with pytest.raises(Error) as raised:
        build(queuety.machine("m")).build()
    for word in words:
        assert word in str(raised.value)


def test_declaring__refuses_at_the_call_what_cannot_be_right():
    with pytest.raises(Error, match="needs a state before it"):
        queuety.machine("m").on("go", to="z")
    with pytest.raises(Error, match="declares state 'a' twice"):
        queuety.machine("m").state("a").state("a")
    with pytest.raises(Error, match="final state 'z' cannot have transitions"):
        queuety.machine("m").final("z").on("go", to="z")
    with pytest.raises(Error, match="state names are"):
        queuety.machine("m").state("a.wait")
    with pytest.raises(Error, match="positive"):
        queuety.machine("m").state("a", timeout=timedelta(0))
    with pytest.raises(Error, match="the guard is refused: .* cannot import it"):
        queuety.machine("m").state("a").on("go", to="z", guard=lambda s, p: True)


def test_guarded_transitions_of_one_event__are_allowed_in_order():
    spec = (queuety.machine("m").state("a")
            .on("go", to="b", guard=machine_steps.under_limit).on("go", to="z")
            .state("b").on("go", to="z").final("z")).build()
    assert [t["to"] for t in spec.machine["states"]["a"]["transitions"]] == ["b", "z"]


def test_start_payload__may_not_use_the_machine_keys():
    from queuety.core.machine import initial_state

    assert initial_state("m", "a", {"x": 1}) == {
        "x": 1, MACHINE_KEY: {"state": "a", "history": [], "transitions": 0}}
    for key in (MACHINE_KEY, EVENT_KEY):
        with pytest.raises(queuety.InvalidPayload,
                           match=f"machine 'm' uses '{key}'.*Nothing was started"):
            initial_state("m", "a", {key: 1})


def test_exit_and_transition_actions__refuse_what_the_route_step_could_not_honour():
    with pytest.raises(Error, match="exit action of state 'a'.*is a generator.*on_enter"):
        queuety.machine("m").state("a", on_exit=machine_steps.streaming_exit)
    with pytest.raises(Error, match="transition of state 'a' on 'go'.*RetriedAction.*sets "
                                    "retry.*could not honour"):
        queuety.machine("m").state("a").on("go", to="z", action=machine_steps.RetriedAction)
    # As an entry action, a step of its own, both are fine.
    queuety.machine("m").state("a", on_enter=machine_steps.RetriedAction).on("go", to="z")


def test_register__takes_a_machine_builder():
    from queuety import registry

    try:
        queuety.register("unit_session", machine_steps.session("unit_session"))
        assert registry.get("unit_session").spec.machine is not None
    finally:
        registry.unregister("unit_session")


def test_handler_refs__name_every_action_and_guard_for_the_deploy_check():
    from queuety.core.handler_refs import Need, handler_refs

    refs = handler_refs(machine_steps.session().build())
    machine_refs = {(r.path, r.need) for r in refs if "state" in r.where}
    assert machine_refs == {
        ("tests.machine_steps.leave", Need.STEP),
        ("tests.machine_steps.under_limit", Need.GUARD),
        ("tests.machine_steps.reply", Need.STEP)}
    # The entry action is the step "active": listed once, with the steps.
    assert [r.path for r in refs].count("tests.machine_steps.greet") == 1
    assert any(r.where == "The guard of the transition of state 'active' on 'message'"
               for r in refs)


def _context(spec, step_name):
    from queuety.core.budget import BudgetView, Usage

    return queuety.StepContext(1, spec.name, step_name, 1, BudgetView(spec.budget, Usage()),
                               definition=spec)


def test_transition__guard_order_merges_payload_and_actions_with_the_state_change():
    from queuety.core.machine_steps import transition

    spec = machine_steps.session().build()
    state = {"replies": 1, EVENT_KEY: {"message": {"text": "hi", MACHINE_KEY: "spoof"}},
             MACHINE_KEY: {"state": "active", "history": [{"from": "idle", "to": "active"}]}}
    route = transition(state, _context(spec, "active.route"))
    assert route.label == "active"  # back into active: its entry action runs again
    assert route.output["replies"] == 2 and route.output["last_reply"] == "re: hi"
    assert route.output["exits"] == 1 and route.output["text"] == "hi"
    book = route.output[MACHINE_KEY]
    assert book["state"] == "active" and len(book["history"]) == 2
    assert book["history"][-1]["event"] == "message"
    assert book["event"]["name"] == "message"

    refused = transition({**state, "replies": machine_steps.LIMIT},
                         _context(spec, "active.route"))
    assert refused.label == "active.wait" and not refused.output

    closing = transition({**state, EVENT_KEY: {"close": None}}, _context(spec, "active.route"))
    assert closing.label == END_STEP and closing.output[MACHINE_KEY]["state"] == "closed"
    timed = transition(state, _context(spec, "active.timeout"))
    assert timed.label == "idle.wait" and timed.output[MACHINE_KEY]["state"] == "idle"


def test_transition__outside_a_machine_definition_says_so():
    from queuety.core.machine_steps import transition

    plain = queuety.workflow("plain").then(machine_steps.greet).build()
    with pytest.raises(Error, match="has no machine table"):
        transition({}, _context(plain, "x.route"))


def test_transition__actions_see_the_event_being_taken_not_the_one_before():
    from queuety.core.machine_steps import transition

    spec = (queuety.machine("m").state("a").on("go", to="b", action=machine_steps.seen_event)
            .state("b").on("stop", to="z", action=machine_steps.seen_event).final("z")).build()
    state = {EVENT_KEY: {"n": 2},  # b waits for one event: its wait stores the payload
             MACHINE_KEY: {"state": "b", "history": [], "event": {"name": "go", "data": 1}}}
    route = transition(state, _context(spec, "b.route"))
    assert route.output["seen"] == {"name": "stop", "data": {"n": 2}}
    assert route.output[MACHINE_KEY]["event"] == {"name": "stop", "data": {"n": 2}}


def test_transition__history_keeps_the_newest_transitions_and_counts_them_all():
    from queuety.core.machine import HISTORY_KEPT
    from queuety.core.machine_steps import transition

    spec = machine_steps.session().build()
    old = [{"from": "active", "to": "active", "event": "message", "n": n}
           for n in range(HISTORY_KEPT)]
    state = {EVENT_KEY: {"close": None},
             MACHINE_KEY: {"state": "active", "history": old, "transitions": 120}}
    book = transition(state, _context(spec, "active.route")).output[MACHINE_KEY]
    assert len(book["history"]) == HISTORY_KEPT and book["transitions"] == 121
    assert book["history"][0]["n"] == 1 and book["history"][-1]["to"] == "closed"
    # A run started before the count was kept: the count starts from its history's length.
    legacy = {**state, MACHINE_KEY: {"state": "active", "history": old[:3]}}
    book = transition(legacy, _context(spec, "active.route")).output[MACHINE_KEY]
    assert book["transitions"] == 4 and len(book["history"]) == 4


def test_transition__a_garbled_event_names_the_run_and_step():
    from queuety.core.machine_steps import transition

    spec = machine_steps.session().build()
    with pytest.raises(queuety.InvalidStepOutput, match="Step 'active.route' of run 1 found"):
        transition({EVENT_KEY: "junk"}, _context(spec, "active.route"))
