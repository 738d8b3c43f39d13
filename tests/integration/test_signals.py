"""Waits and signals through the Python API, with a real worker (reference §8.2, H1-H7)."""

from __future__ import annotations

import threading
import time
from typing import Literal

import pytest
from django.db import connection

import queuety
from queuety.models import Event, Signal, StepRun
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

WAITING = ("waiting_for_signal", "completed", "failed")


def test_wait__parks_without_a_worker_and_a_signal_resumes_it(worker, token):
    run_id = (queuety.workflow("approval_flow").then(workflows.fetch_user)
              .wait_for_signal("approval").then(workflows.seen_keys)
              .dispatch({"token": token, "user_id": 3}))

    parked = wait_for(run_id, WAITING, worker=worker)
    assert (parked.status, parked.current_step, parked.current_step_name) == \
        ("waiting_for_signal", 1, "wait_for_approval")
    assert not StepRun.objects.filter(run_id=run_id, status__in=("pending", "processing"))
    assert (parked.wait_type, parked.waiting_for, parked.wait_mode) == \
        ("signal", ["approval"], "all")
    assert parked.wait_details["matched"] == [] and parked.wait_details["remaining"] == [
        "approval"]

    receipt = queuety.signal(run_id, "approval", {"approval_status": "approved",
                                                  "approved_by": "admin"})
    assert receipt.settled and receipt.status == "running"
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert status.state["approval_status"] == "approved"
    assert {"approval_status", "approved_by", "user_name"} <= set(status.state["seen"])
    assert Signal.objects.get(pk=receipt.signal_id).consumed_by_step == "wait_for_approval"


def test_signal__sent_before_the_wait_is_kept_and_used_when_it_is_reached(worker, token):
    run_id = (queuety.workflow("early").then(workflows.slow).wait_for_signal("go")
              .then(workflows.step_a).dispatch({"token": token, "sleep": 0.5}))
    receipt = queuety.signal(run_id, "go", {"early_data": True})
    assert not receipt.settled and receipt.status == "running"

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed" and status.state["early_data"] is True
    assert Event.objects.filter(run_id=run_id, kind="workflow_waiting").count() == 0


def test_signal__no_wait_listens_for_it__refused_and_nothing_stored(worker, token):
    run_id = (queuety.workflow("picky").wait_for_signal("approval").then(workflows.step_a)
              .dispatch({"token": token}))
    with pytest.raises(queuety.RunNotWaiting, match="No wait of workflow 'picky' .* listens "
                                                     "for signal 'approvel'.*'approval'"):
        queuety.signal(run_id, "approvel", {})
    assert not Signal.objects.filter(run_id=run_id).exists()
    assert queuety.workflow_status(run_id).status == "waiting_for_signal"


def test_signal__unknown_or_finished_run_is_refused(worker, token):
    with pytest.raises(queuety.RunNotFound, match="Workflow run 99999999 does not exist."):
        queuety.signal(99999999, "approval", {})
    run_id = queuety.workflow("done").then(workflows.step_a).wait_for_signal("late") \
        .dispatch({"token": token})
    queuety.signal(run_id, "late")
    wait_for(run_id, worker=worker)
    with pytest.raises(queuety.RunNotWaiting, match=f"Run {run_id} of workflow 'done' is "
                                                     "completed; it takes no more signals."):
        queuety.signal(run_id, "late")


def test_waits__first_last_and_sequential(worker, token):
    run_id = (queuety.workflow("gates").wait_for_signal("start")
              .then(workflows.step_a).wait_for_signal("first_approval")
              .wait_for_signal("second_approval").dispatch({"token": token}))
    assert queuety.workflow_status(run_id).status == "waiting_for_signal"  # at dispatch
    queuety.signal(run_id, "start", {"started": True})
    assert wait_for(run_id, WAITING, worker=worker).current_step_name == \
        "wait_for_first_approval"
    queuety.signal(run_id, "first_approval", {"one": 1})
    status = queuety.workflow_status(run_id)
    assert status.current_step_name == "wait_for_second_approval"
    receipt = queuety.signal(run_id, "second_approval", {"two": 2})
    assert receipt.status == "completed"
    final = queuety.workflow_status(run_id)
    assert final.state == {"token": token, "started": True, "log": ["a"], "done_a": True,
                           "one": 1, "two": 2}


def test_signals__each_wait_consumes_one_and_a_loop_waits_for_a_new_one(worker, token):
    run_id = (queuety.workflow("rounds").wait_for_signal("round", "last_round", name="gate")
              .then(workflows.loop_until_three).dispatch({"token": token}))
    queuety.signal(run_id, "round", {"n": 1})
    queuety.signal(run_id, "round", {"n": 2})   # stored for the next pass
    deadline = time.monotonic() + 20
    while queuety.workflow_status(run_id).state.get("rounds", 0) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    parked = wait_for(run_id, WAITING, worker=worker)
    # Round 2 used the stored second signal; round 3 needs a new one (not the old ones again).
    assert parked.status == "waiting_for_signal" and parked.state["last_round"] == {"n": 2}
    queuety.signal(run_id, "round", {"n": 3})
    status = wait_for(run_id, worker=worker)
    assert status.state["rounds"] == 3 and status.state["last_round"] == {"n": 3}
    assert Signal.objects.filter(run_id=run_id, consumed_at__isnull=True).count() == 0


def test_wait_for_signals__all_reports_progress_and_merges_by_name(worker, token):
    run_id = (queuety.workflow("all_gate").wait_for_signals(["approved", "reviewed"], "all",
                                                            "gate")
              .then(workflows.step_a).dispatch({"token": token}))
    queuety.signal(run_id, "approved", {"decision": "approved"})
    status = queuety.workflow_status(run_id)
    assert status.status == "waiting_for_signal" and status.wait_mode == "all"
    assert status.wait_details["matched"] == ["approved"]
    assert status.wait_details["remaining"] == ["reviewed"]
    queuety.signal(run_id, "reviewed", {"reviewer": "ops"})
    final = wait_for(run_id, worker=worker)
    assert final.state["gate"] == {"approved": {"decision": "approved"},
                                   "reviewed": {"reviewer": "ops"}}


def test_wait_for_signals__any_takes_the_first(worker, token):
    run_id = (queuety.workflow("any_gate").wait_for_signals(["approve", "reject"], "any",
                                                            "decision")
              .then(workflows.step_a).dispatch({"token": token}))
    queuety.signal(run_id, "reject", {"reason": "invalid"})
    final = wait_for(run_id, worker=worker)
    assert final.state["decision"] == {"reject": {"reason": "invalid"}}


def test_correlation_key__only_the_matching_signal_counts(worker, token):
    run_id = (queuety.workflow("correlated")
              .wait_for_signal("review_ready", "review", correlation_key="task_id",
                               name="wait_for_review")
              .dispatch({"token": token, "task_id": "task-42"}))
    status = queuety.workflow_status(run_id)
    assert status.current_step_name == "wait_for_review"
    assert status.wait_details["correlation_key"] == "task_id"
    assert status.wait_details["correlation_value"] == "task-42"
    queuety.signal(run_id, "review_ready", {"task_id": "task-99", "result": "no"})
    assert queuety.workflow_status(run_id).wait_details["matched"] == []
    queuety.signal(run_id, "review_ready", {"task_id": "task-42", "result": "ship"})
    assert queuety.workflow_status(run_id).state["review"] == {"task_id": "task-42",
                                                               "result": "ship"}


def test_match_payload__compares_json_types_exactly(worker, token):
    run_id = (queuety.workflow("matched").wait_for_signal("vote", "vote",
                                                          match_payload={"level": 1})
              .dispatch({"token": token}))
    for near_miss in ({"level": "1"}, {"level": True}, {"level": 1.0}, {"other": 1}):
        queuety.signal(run_id, "vote", near_miss)
        assert queuety.workflow_status(run_id).status == "waiting_for_signal", near_miss
    queuety.signal(run_id, "vote", {"level": 1, "by": "x"})
    assert queuety.workflow_status(run_id).state["vote"] == {"level": 1, "by": "x"}


def test_approve_and_input__the_original_sequence(worker, token):
    run_id = (queuety.workflow("human").wait_for_approval().wait_for_input()
              .then(workflows.step_a).dispatch({"token": token}))
    queuety.approve(run_id, {"approved": True, "by": "admin"})
    queuety.submit_input(run_id, {"text": "ship it"})
    final = wait_for(run_id, worker=worker)
    assert final.state["approval"] == {"approved": True, "by": "admin"}
    assert final.state["input"] == {"text": "ship it"}


@pytest.mark.parametrize("reply, outcome", [("approve", "approved"), ("reject", "rejected")])
def test_decision__approve_and_reject_both_answer_it(worker, token, reply, outcome):
    run_id = (queuety.workflow("decided").wait_for_decision(result_key="review")
              .then(workflows.step_a).dispatch({"token": token}))
    status = queuety.workflow_status(run_id)
    assert status.wait_mode == "any" and status.waiting_for == ["approval", "rejection"]
    getattr(queuety, reply)(run_id, {"reason": "missing citations"})
    final = wait_for(run_id, worker=worker)
    assert final.state["review"] == {"outcome": outcome, "signal": status.waiting_for[
        0 if reply == "approve" else 1], "data": {"reason": "missing citations"}}


def test_replies__only_while_waiting_and_once(worker, token):
    run_id = (queuety.workflow("once").wait_for_approval().then(workflows.step_a)
              .dispatch({"token": token}))
    with pytest.raises(queuety.RunNotWaiting, match="is not waiting for a rejection"):
        queuety.reject(run_id, {})
    queuety.approve(run_id, {"by": "first"})
    with pytest.raises(queuety.AlreadyAnswered, match="the wait was already answered"):
        queuety.approve(run_id, {"by": "second"})
    final = wait_for(run_id, worker=worker)
    assert final.state["approval"] == {"by": "first"}
    assert len(workflows.marks(f"{token}-a")) == 1


def test_budget_breach_on_signal__raises_to_the_caller_and_keeps_the_run_waiting(worker, token):
    run_id = (queuety.workflow("tight").max_state_bytes(200).wait_for_signal("data", "data")
              .then(workflows.step_a).dispatch({"token": token}))
    with pytest.raises(queuety.BudgetExceeded, match="max_state_bytes budget"):
        queuety.signal(run_id, "data", {"blob": "x" * 300})
    status = queuety.workflow_status(run_id)
    assert status.status == "waiting_for_signal" and "data" not in status.state
    assert not Signal.objects.filter(run_id=run_id).exists()
    assert not Event.objects.filter(run_id=run_id, kind="signal_received").exists()
    queuety.signal(run_id, "data", {"blob": "small"})
    assert wait_for(run_id, worker=worker).status == "completed"


def test_budget_breach_by_a_stored_signal__fails_the_run_on_the_worker_path(worker, token):
    run_id = (queuety.workflow("tight_early").max_transitions(1).then(workflows.step_a)
              .wait_for_signal("go").then(workflows.step_b).dispatch({"token": token}))
    queuety.signal(run_id, "go", {})  # stored; settling it later is transition 2 of 1
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and status.error["budget"] == "max_transitions"
    assert status.state == {"token": token, "log": ["a"], "done_a": True}


SCHEMA = {"type": "object", "required": ["decision", "amount"],
          "properties": {"decision": {"enum": ["approve", "reject"]},
                         "amount": {"type": "integer", "minimum": 0, "maximum": 1000}}}


def test_H1_H2_replies_arrive_exactly_as_sent(worker, token, semantics):
    text_schema = {"type": "object", "properties": {"value": {"type": "string"}}}
    identical = 0
    texts = ["42", "true", "042", "null", "NaN", "-Infinity", '"quoted"', '["a"]']
    for text in texts:
        run_id = (queuety.workflow("echo").wait_for_input(schema=text_schema)
                  .dispatch({"token": token}))
        queuety.submit_input(run_id, {"value": text})
        identical += queuety.workflow_status(run_id).state["input"] == {"value": text}
    refused = 0
    for schema, reply in (
            (text_schema, {"value": 42}),
            ({"properties": {"n": {"type": "integer"}}}, {"n": "42.0"}),
            ({"properties": {"ok": {"type": "boolean"}}}, {"ok": "yes"})):
        run_id = queuety.workflow("typed").wait_for_input(schema=schema).dispatch({})
        with pytest.raises(queuety.InvalidSignalData):
            queuety.submit_input(run_id, reply)
        refused += queuety.workflow_status(run_id).status == "waiting_for_signal"
    semantics.record("H1 text replies for a string field", "8/8 byte-identical",
                     f"{identical}/{len(texts)} byte-identical")
    semantics.record("H2 42 for a string, \"42.0\" for an integer, \"yes\" for a boolean",
                     "3/3 refused", f"{refused}/3 refused")
    assert identical == len(texts) and refused == 3


def test_H3_H4_invalid_input_lists_every_path_and_records_nothing(worker, token, semantics):
    run_id = (queuety.workflow("form").wait_for_input(schema=SCHEMA).then(workflows.step_a)
              .dispatch({"token": token}))
    events_before = Event.objects.filter(run_id=run_id).count()
    state_before = queuety.workflow_status(run_id).state
    with pytest.raises(queuety.InvalidSignalData) as refused:
        queuety.submit_input(run_id, {"decision": "maybe", "amount": -5})
    paths = [e["path"] for e in refused.value.errors]
    with pytest.raises(queuety.InvalidSignalData) as missing:
        queuety.submit_input(run_id, {"decision": "approve"})
    status = queuety.workflow_status(run_id)
    semantics.record("H3 {decision: maybe, amount: -5}; then amount missing",
                     "2 errors naming /decision and /amount; then 'amount' named",
                     f"{len(paths)} errors {paths}; then {missing.value.errors[0]['message']}")
    assert paths == ["/amount", "/decision"]
    assert "'amount' is a required property" in missing.value.errors[0]["message"]
    assert status.status == "waiting_for_signal" and "input" not in status.state
    assert not Signal.objects.filter(run_id=run_id).exists()
    assert not Event.objects.filter(run_id=run_id, kind="signal_received").exists()
    new_events = Event.objects.filter(run_id=run_id).count() - events_before
    queuety.submit_input(run_id, {"decision": "approve", "amount": 10})
    final = wait_for(run_id, worker=worker)
    downstream = len(workflows.marks(f"{token}-a"))
    semantics.record("H4 two refused replies, then a valid one",
                     "still waiting, no event, no state change; the valid reply resumes it; "
                     "downstream runs once",
                     f"after the refused replies: {status.status}, {new_events} new events, "
                     f"state {'unchanged' if status.state == state_before else 'CHANGED'}; "
                     f"valid reply: {final.status}, downstream ran {downstream} time(s)")
    assert new_events == 0 and status.state == state_before
    assert final.state["input"] == {"decision": "approve", "amount": 10}
    assert downstream == 1


def test_H6_invalid_schemas_fail_the_build(semantics):
    refused = []
    bad = ({"type": "strng"}, {"properties": []}, {"pattern": "("}, ["not", "a", "dict"],
           Literal["approve", "reject"], str)
    for schema in bad:
        with pytest.raises(queuety.WorkflowDefinitionError, match="schema") as error:
            queuety.workflow("bad_schema").wait_for_input(schema=schema)
        refused.append(str(error.value))
    # Every schema the build accepts pauses, and refuses or delivers a reply without crashing.
    good = {"enum": ({"type": "object", "properties": {"d": {"enum": ["approve", "reject"]}}},
                     {"d": "approve"}, {"d": "maybe"}),
            "range": (SCHEMA, {"decision": "reject", "amount": 0},
                      {"decision": "reject", "amount": 1001}),
            "local $ref": ({"type": "object", "$defs": {"d": {"enum": ["approve"]}},
                            "properties": {"d": {"$ref": "#/$defs/d"}}},
                           {"d": "approve"}, {"d": "no"})}
    worked = []
    for name, (schema, valid, invalid) in good.items():
        paused = queuety.workflow("good_schema").wait_for_input(schema=schema).dispatch({})
        assert queuety.workflow_status(paused).status == "waiting_for_signal", name
        with pytest.raises(queuety.InvalidSignalData):
            queuety.submit_input(paused, invalid)
        queuety.submit_input(paused, valid)
        if queuety.workflow_status(paused).state["input"] == valid:
            worked.append(name)
    semantics.record("H6 wait_for_input(schema=...): 6 bad schemas (unknown type, properties "
                     "not an object, bad regex, a list, Literal[...], str); 3 good ones",
                     "each refused at build, or it works at pause and reply time",
                     f"{len(refused)}/{len(bad)} refused at build; {len(worked)}/{len(good)} "
                     f"accepted ones paused, refused a bad reply and delivered a good one "
                     f"({', '.join(worked)})")
    assert len(refused) == len(bad) and len(worked) == len(good)
    assert "takes a JSON Schema object (a dict), got list" in refused[3]


def test_H6_a_schema_whose_ref_resolves_nowhere_is_refused_at_build(semantics):
    schema = {"type": "object", "properties": {"d": {"$ref": "#/$defs/missing"}}}
    try:
        run_id = queuety.workflow("dangling_ref").wait_for_input(schema=schema).dispatch({})
    except queuety.WorkflowDefinitionError as error:
        outcome = f"refused at build: {error}"
    else:
        try:
            queuety.submit_input(run_id, {"d": "x"})
            outcome = f"accepted at build; the reply was taken ({queuety.workflow_status(run_id).status})"
        except queuety.InvalidSignalData as error:
            outcome = f"accepted at build; the reply was refused as invalid data: {error}"
        except Exception as error:  # noqa: BLE001 - what escapes is the measurement
            outcome = (f"accepted at build; the reply raised {type(error).__name__}: "
                       f"{str(error).splitlines()[0].split(' within ')[0]}")
    semantics.record("H6 a schema with a $ref that resolves nowhere", "refused at build",
                     outcome)
    assert outcome.startswith("refused at build"), outcome


def test_H7_no_reruns_when_a_reply_comes_after_a_worker_restart(worker, token, semantics):
    run_id = (queuety.workflow("restarted").then(workflows.step_a).wait_for_approval()
              .then(workflows.step_c).dispatch({"token": token}))
    wait_for(run_id, WAITING, worker=worker)
    worker.restart()
    queuety.approve(run_id, {"by": "after restart"})
    final = wait_for(run_id, worker=worker)
    counts = (len(workflows.marks(f"{token}-a")), len(workflows.marks(f"{token}-c")))
    semantics.record("H7 reply after a worker restart", "draft 1, execute 1",
                     f"before-wait step {counts[0]}, after-wait step {counts[1]}")
    assert final.status == "completed" and counts == (1, 1)


def test_concurrent_approvals__exactly_one_transition(worker, token, semantics):
    run_id = (queuety.workflow("contested").wait_for_approval().then(workflows.step_a)
              .dispatch({"token": token}))
    results: list[str] = []
    barrier = threading.Barrier(20)

    def approve(n):
        barrier.wait()
        try:
            queuety.approve(run_id, {"by": n})
            results.append("ok")
        except queuety.AlreadyAnswered:
            results.append("already")
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    final = wait_for(run_id, worker=worker)
    semantics.record("20 concurrent approvals of one wait", "1 accepted, 19 AlreadyAnswered, "
                     "1 transition", f"{results.count('ok')} accepted, "
                     f"{results.count('already')} AlreadyAnswered, "
                     f"{Event.objects.filter(run_id=run_id, kind='wait_settled').count()} "
                     "transition")
    assert sorted(results) == ["already"] * 19 + ["ok"]
    assert Event.objects.filter(run_id=run_id, kind="wait_settled").count() == 1
    assert len(workflows.marks(f"{token}-a")) == 1 and final.status == "completed"
