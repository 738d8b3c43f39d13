"""State machines on PostgreSQL with the real worker: a session moves between states on
events sent with queuety.signal() and over REST, a guard refuses, a per-state timeout fires,
an action's retry and a SIGKILL mid-action leave exactly one transition, and the state and
history read back the same through the API, the CLI, the admin and an export's replay."""

from __future__ import annotations

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety import export
from queuety.models import Signal, StepRun, WorkflowRun
from tests import machine_steps
from tests.integration.test_api import API, make_user, post
from tests.testapp.models import Counter

pytestmark = pytest.mark.worker

PARKED = ("waiting_for_signal",)


@pytest.fixture(autouse=True)
def cancel_left_runs():
    """Cancel the runs a test left live (sessions parked with a timeout), so a later test
    file's sweep of due timeouts does not find them."""
    from queuety.core.status import FINISHED

    newest = WorkflowRun.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    yield
    for run_id in (WorkflowRun.objects.filter(pk__gt=newest).exclude(status__in=FINISHED)
                   .values_list("pk", flat=True)):
        try:
            queuety.cancel(run_id)
        except queuety.InvalidTransition:  # it finished meanwhile
            pass


def settle(run_id, state, worker, timeout=30.0):
    """Wait until the machine is parked in ``state`` (or finished)."""
    deadline = time.monotonic() + timeout
    while True:
        status = queuety.machine_status(run_id)
        if status.state == state and status.status in (*PARKED, "completed"):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"Machine run {run_id} is {status.status!r} in "
                                 f"{status.state!r}, not parked in {state!r}.\n"
                                 + worker.log()[-3000:])
        time.sleep(0.05)


def test_session__moves_on_events_guard_refuses_and_closes(worker, token):
    run_id = machine_steps.session("session_basic").start({"user": 7}, key=f"s:{token}")
    first = settle(run_id, "idle", worker)
    assert first.history == () and first.data == {"user": 7}
    assert set(first.events) == {"message", "close"}

    queuety.signal(run_id, "message", {"text": "hello"})
    active = settle(run_id, "active", worker)
    assert active.data["replies"] == 1 and active.data["last_reply"] == "re: hello"
    assert active.data["entered_active"] == 1 and "timeout" in active.events
    for n in (2, 3):
        queuety.signal(run_id, "message", {"text": f"m{n}"})
        deadline = time.monotonic() + 30
        while queuety.machine_status(run_id).data.get("replies") != n:
            assert time.monotonic() < deadline, worker.log()[-3000:]
            time.sleep(0.05)
    # The guard allows LIMIT replies: the fourth message is taken but moves nothing.
    queuety.signal(run_id, "message", {"text": "too many"})
    deadline = time.monotonic() + 30
    while StepRun.objects.filter(run_id=run_id, step_name="active.route",
                                 status="completed").count() < 3:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)
    stayed = settle(run_id, "active", worker)
    assert stayed.data["replies"] == 3 and len(stayed.history) == 3
    assert stayed.data["text"] == "m3"  # a refused event's payload is not merged

    queuety.signal(run_id, "close", {"reason": "done"})
    done = settle(run_id, "closed", worker)
    assert done.status == "completed" and done.final
    assert [(h["from"], h["to"], h["event"]) for h in done.history] == [
        ("idle", "active", "message"), ("active", "active", "message"),
        ("active", "active", "message"), ("active", "closed", "close")]
    assert done.data["exits"] == 3 and done.data["reason"] == "done"
    assert done.transitions == 4
    assert done.definition_version == "session.v1"
    assert done.definition_hash == machine_steps.session("session_basic").definition_hash
    with pytest.raises(queuety.RunNotWaiting):
        queuety.signal(run_id, "message", {"text": "late"})


def test_timeout__moves_active_back_to_idle(worker):
    machine = machine_steps.session("session_timeout", timeout=timedelta(seconds=1))
    run_id = machine.start({})
    settle(run_id, "idle", worker)
    queuety.signal(run_id, "message", {"text": "hi"})
    settle(run_id, "active", worker)
    back = settle(run_id, "idle", worker, timeout=40)
    assert [(h["from"], h["to"], h["event"]) for h in back.history] == [
        ("idle", "active", "message"), ("active", "idle", "timeout")]
    assert back.data["exits"] == 1


def test_action_retry__runs_the_action_twice_and_transitions_once(worker, token):
    Counter.objects.create(name=token)
    machine = machine_steps.session("session_flaky", action=machine_steps.reply_flaky)
    run_id = machine.start({"counter": token})
    queuety.signal(run_id, "message", {"text": "hello"})
    active = settle(run_id, "active", worker)
    assert Counter.objects.get(name=token).value == 2  # the action ran twice
    assert active.data["replies"] == 1 and len(active.history) == 1
    route = StepRun.objects.get(run_id=run_id, step_name="idle.route", status="completed")
    assert route.attempt == 2


def test_sigkill_mid_action__finishes_the_transition_once(worker, token):
    Counter.objects.create(name=token)
    machine = machine_steps.session("session_killed", action=machine_steps.reply_killed)
    run_id = machine.start({"counter": token})
    queuety.signal(run_id, "message", {"text": "hello"})
    active = settle(run_id, "active", worker, timeout=60)
    assert Counter.objects.get(name=token).value == 2  # killed attempt, then the retry
    assert active.data["replies"] == 1
    assert [(h["from"], h["to"]) for h in active.history] == [("idle", "active")]
    rows = StepRun.objects.filter(run_id=run_id, step_name="idle.route")
    assert sorted(rows.values_list("status", flat=True)) == ["completed"]
    assert rows.get().attempt == 2


def test_rest_cli_admin_and_export__show_the_state_and_its_history(worker, admin_client):
    run_id = machine_steps.session("session_views").start({"user": 1})
    settle(run_id, "idle", worker)
    client = APIClient()
    client.force_authenticate(make_user("view_workflowrun", "signal_workflowrun"))
    assert post(client, f"/runs/{run_id}/signals/message/", {"text": "via rest"}).status_code \
        in (200, 202)
    settle(run_id, "active", worker)
    body = client.get(f"{API}/runs/{run_id}/").json()
    assert body["machine"]["state"] == "active"
    assert body["machine"]["history"][0]["event"] == "message"
    plain = queuety.workflow("not_a_machine").wait_for_signal("go").dispatch({})
    assert client.get(f"{API}/runs/{plain}/").json()["machine"] is None
    with pytest.raises(queuety.NotAMachine):
        queuety.machine_status(plain)

    out = io.StringIO()
    call_command("queuety", "machine", "status", str(run_id), "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["state"] == "active" and shown["history"][0]["to"] == "active"
    listed = io.StringIO()
    call_command("queuety", "machine", "list", "--name", "session_views", stdout=listed)
    assert f"{run_id}" in listed.getvalue() and "active" in listed.getvalue()

    page = admin_client.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode()
    assert "Machine state" in page and "idle → active" in page
    assert "<th>Transitions</th><td>1</td>" in page
    definition = WorkflowRun.objects.get(pk=run_id).definition_id
    shown_definition = admin_client.get(
        f"/admin/queuety/workflowdefinition/{definition}/change/")
    assert shown_definition.status_code == 200
    assert "active.route" in shown_definition.content.decode()

    document = export.export(run_id)
    copy = export.replay(json.loads(json.dumps(document)))
    replayed = settle(copy, "active", worker)
    assert replayed.history == queuety.machine_status(run_id).history
    queuety.signal(copy, "close", {})
    assert settle(copy, "closed", worker).status == "completed"
    assert queuety.machine_status(run_id).state == "active"  # the original is untouched
    queuety.cancel(plain)


def test_events__one_no_state_accepts_is_refused_one_a_later_state_accepts_is_kept(worker):
    from queuety import registry

    machine = (queuety.machine("machine_mailbox").state("a").on("go", to="b")
               .state("b").on("stop", to="z").final("z"))
    queuety.register("machine_mailbox", machine)
    try:
        run_id = queuety.start("machine_mailbox", {"n": 1})  # by name: no bookkeeping yet
        assert settle(run_id, "a", worker).events == ("go",)
        with pytest.raises(queuety.RunNotWaiting, match="go"):
            queuety.signal(run_id, "nope", {})
        kept = queuety.signal(run_id, "stop", {"early": True})  # b's event: kept for later
        assert not kept.settled and kept.status == "waiting_for_signal"
        assert Signal.objects.get(pk=kept.signal_id).consumed_at is None
        assert queuety.machine_status(run_id).state == "a"
        queuety.signal(run_id, "go", {})
        done = settle(run_id, "z", worker)
        assert [(h["from"], h["to"]) for h in done.history] == [("a", "b"), ("b", "z")]
        assert done.status == "completed" and done.data["early"] is True
    finally:
        registry.unregister("machine_mailbox")


def reviewed(name):
    """``active`` times out to ``review``, declared after it; ``review`` goes back on resume."""
    return (queuety.machine(name)
            .state("active", timeout=timedelta(seconds=1))
            .on("message", to="active", action=machine_steps.reply)
            .on("close", to="closed")
            .on("timeout", to="review")
            .state("review").on("resume", to="active").on("close", to="closed")
            .final("closed"))


def test_timeout_to_a_later_state__keeps_an_event_an_earlier_state_accepts(worker):
    run_id = reviewed("machine_review").start({})
    settle(run_id, "review", worker, timeout=40)
    kept = queuety.signal(run_id, "message", {"text": "while in review"})  # was WaitExpired
    assert not kept.settled
    queuety.signal(run_id, "resume", {})
    deadline = time.monotonic() + 30
    while queuety.machine_status(run_id).data.get("replies") != 1:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)
    status = queuety.machine_status(run_id)
    assert [(h["from"], h["to"], h["event"]) for h in status.history[:3]] == [
        ("active", "review", "timeout"), ("review", "active", "resume"),
        ("active", "active", "message")]
    assert status.data["last_reply"] == "re: while in review"
    queuety.signal(run_id, "close", {})
    assert settle(run_id, "closed", worker).status == "completed"


def test_event_racing_the_timeout__one_transition_settles_the_wait_and_the_event_is_kept(
        worker, no_sweeps):
    run_id = reviewed("machine_race").start({})
    settle(run_id, "active", worker)
    while WorkflowRun.objects.get(pk=run_id).wait_expires_at > timezone.now():
        time.sleep(0.05)
    # Past due, no sweep yet: the signal settles the timeout first, then keeps the event.
    receipt = queuety.signal(run_id, "message", {"text": "at the deadline"})
    assert not receipt.settled
    parked = settle(run_id, "review", worker)
    assert [(h["from"], h["to"], h["event"]) for h in parked.history] == [
        ("active", "review", "timeout")]
    assert "replies" not in parked.data
    assert StepRun.objects.filter(run_id=run_id, step_name="active.route").count() == 0
    queuety.signal(run_id, "resume", {})
    deadline = time.monotonic() + 30
    while queuety.machine_status(run_id).data.get("replies") != 1:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)
    assert Signal.objects.filter(run_id=run_id, name="message",
                                 consumed_at__isnull=False).count() == 1
    queuety.cancel(run_id)


def test_event_sent_during_the_entry_action__is_taken_when_the_state_waits(worker):
    machine = (queuety.machine("machine_slow_entry")
               .state("a", on_enter=machine_steps.slow_enter).on("go", to="z").final("z"))
    run_id = machine.start({})
    deadline = time.monotonic() + 30
    while not StepRun.objects.filter(run_id=run_id, step_name="a", status="processing").exists():
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.02)
    receipt = queuety.signal(run_id, "go", {"during": "entry"})
    assert not receipt.settled  # the entry action was still running
    done = settle(run_id, "z", worker)
    assert done.status == "completed" and done.data["entered"] == 1
    assert [(h["from"], h["to"], h["event"]) for h in done.history] == [("a", "z", "go")]
    assert done.data["during"] == "entry"


def test_start_with_a_key__one_live_machine_per_key(worker, token):
    machine = machine_steps.session("session_keyed")
    first = machine.start({"user": 1}, key=f"k1:{token}")
    assert machine.start({"user": 2}, key=f"k1:{token}") == first  # the live one
    other = machine.start({"user": 3}, key=f"k2:{token}")
    assert other != first
    assert WorkflowRun.objects.filter(name="session_keyed", key=f"k1:{token}").count() == 1
    assert queuety.machine_status(first).data == {"user": 1}
    queuety.signal(first, "close", {})
    settle(first, "closed", worker)
    again = machine.start({"user": 4}, key=f"k1:{token}")  # the first has finished
    assert again not in (first, other)
    queuety.cancel(other)
    queuety.cancel(again)


def test_start_by_name__cannot_forge_the_machine_state(worker, token):
    from queuety import registry

    queuety.register("machine_forged", machine_steps.session("machine_forged"))
    forged = {"queuety_machine": {"state": "closed", "history": [{"from": "x", "to": "y"}]}}
    before = WorkflowRun.objects.filter(name="machine_forged").count()
    try:
        with pytest.raises(queuety.InvalidPayload,
                           match="machine 'machine_forged' uses 'queuety_machine'"):
            queuety.start("machine_forged", forged)
        client = APIClient()
        client.force_authenticate(make_user("view_workflowrun", "add_workflowrun",
                                            "change_workflowrun"))
        refused = post(client, "/runs/", {"workflow": "machine_forged", "payload": forged})
        assert refused.status_code == 400, refused.content
        assert refused.json()["code"] == "invalid_payload"
        assert "queuety_machine" in refused.json()["detail"]
        assert WorkflowRun.objects.filter(name="machine_forged").count() == before
        run_id = queuety.start("machine_forged", {"token": token})
        status = settle(run_id, "idle", worker)
        assert status.history == () and status.transitions == 0
        assert WorkflowRun.objects.get(pk=run_id).state["queuety_machine"]["state"] == "idle"
        queuety.cancel(run_id)
    finally:
        registry.unregister("machine_forged")
