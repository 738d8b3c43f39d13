"""Waits that time out, on PostgreSQL with a real worker that sweeps each second.

The timeout is fired by the sweeper from the database; a reply and the timeout settle a wait
exactly once, and a reply after the timeout is refused (409 ``wait_expired`` over the API).
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety.models import Event, WorkflowRun
from queuety.runtime import expiry
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

PARKED = ("waiting_for_signal",)


def kinds(run_id: int) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind", flat=True))


def api_client() -> APIClient:
    user = User.objects.create_user(f"t{uuid.uuid4().hex[:10]}")
    for codename in ("view_workflowrun", "signal_workflowrun"):
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


def test_timeout_fail__sweeper_fails_the_run_and_a_late_reply_is_409_wait_expired(worker, token):
    before = timezone.now()
    run_id = (queuety.workflow("timed_fail").then(workflows.step_a)
              .wait_for_approval(timeout=timedelta(seconds=1.5)).then(workflows.step_b)
              .dispatch({"token": token}))
    parked = wait_for(run_id, PARKED, worker=worker)
    details = parked.wait_details
    expires = timezone.datetime.fromisoformat(details["expires_at"])
    assert before + timedelta(seconds=1.5) <= expires <= timezone.now() + timedelta(seconds=1.5)
    assert (details["timeout_seconds"], details["on_timeout"]) == (1.5, "fail")
    assert WorkflowRun.objects.get(pk=run_id).wait_expires_at == expires

    failed = wait_for(run_id, ("failed",), timeout=20, worker=worker)
    assert failed.error["type"] == "queuety.exceptions.WaitExpired"
    assert failed.error["step"] == "wait_for_approval" and failed.error["on_timeout"] == "fail"
    assert timezone.now() >= expires
    assert kinds(run_id)[-2:] == ["wait_timed_out", "workflow_failed"]
    assert workflows.marks(f"{token}-b") == []

    with pytest.raises(queuety.WaitExpired, match=f"Run {run_id} failed because its wait "
                                                  "'wait_for_approval' timed out"):
        queuety.approve(run_id, {"by": "late"})
    with pytest.raises(queuety.WaitExpired):
        queuety.signal(run_id, "approval", {})
    response = api_client().post(f"/queuety/api/runs/{run_id}/approve/", data="{}",
                                 content_type="application/json")
    assert response.status_code == 409 and response.json()["code"] == "wait_expired"
    assert kinds(run_id).count("wait_timed_out") == 1
    assert "signal_received" not in kinds(run_id)


def test_timeout_continue__decision_records_timed_out_and_the_run_goes_on(worker, token):
    run_id = (queuety.workflow("timed_continue")
              .wait_for_decision(timeout=timedelta(seconds=1), on_timeout="continue")
              .then(workflows.seen_keys).dispatch({"token": token}))
    status = wait_for(run_id, ("completed", "failed"), timeout=20, worker=worker)
    assert status.status == "completed"
    assert status.state["decision"] == {"outcome": "timed_out", "signal": None, "data": None}
    timed_out = Event.objects.get(run_id=run_id, kind="wait_timed_out")
    assert timed_out.data["output"] == {"decision": status.state["decision"]}
    assert queuety.workflow_state_at(run_id, "wait_for_decision")["decision"]["outcome"] == "timed_out"
    with pytest.raises(queuety.WaitExpired, match=r"timed out at .* \(on_timeout 'continue'\)"):
        queuety.reject(run_id, {"by": "late"})


def test_timeout_jump__skips_the_steps_between(worker, token):
    run_id = (queuety.workflow("timed_skip")
              .wait_for_input(timeout=1, on_timeout="escalate", name="review")
              .then(workflows.step_a, name="normal")
              .then(workflows.step_b, name="escalate").dispatch({"token": token}))
    status = wait_for(run_id, ("completed", "failed"), timeout=20, worker=worker)
    assert status.status == "completed" and status.state["log"] == ["b"]
    assert status.state["input"] is None
    assert workflows.marks(f"{token}-a") == []


def test_reply_before_the_timeout__settles_once_and_clears_the_expiry(worker, token):
    run_id = (queuety.workflow("timed_answered").wait_for_approval(timeout=60)
              .then(workflows.step_a).dispatch({"token": token}))
    assert WorkflowRun.objects.get(pk=run_id).wait_expires_at is not None
    receipt = queuety.approve(run_id, {"by": "editor"})
    assert receipt.settled
    assert wait_for(run_id, worker=worker).status == "completed"
    assert WorkflowRun.objects.get(pk=run_id).wait_expires_at is None
    assert "wait_timed_out" not in kinds(run_id)
    assert expiry.expire_due(timezone.now() + timedelta(hours=1)) == 0


def test_expiry__a_signal_that_does_not_settle_keeps_the_deadline(worker, token):
    run_id = (queuety.workflow("timed_all").wait_for_signals(["a", "b"], timeout=30)
              .then(workflows.step_a).dispatch({"token": token}))
    first = WorkflowRun.objects.get(pk=run_id).wait_expires_at
    time.sleep(0.2)
    assert not queuety.signal(run_id, "a", {}).settled
    assert WorkflowRun.objects.get(pk=run_id).wait_expires_at == first
    queuety.cancel(run_id)


def test_expiry__lives_in_the_database_and_the_sweeper_phase_fires_it(worker, token):
    """No process holds the timeout: an expiry written in the row is fired by any sweep."""
    run_id = (queuety.workflow("timed_durable").wait_for_approval(timeout=3600)
              .then(workflows.step_a).dispatch({"token": token}))
    WorkflowRun.objects.filter(pk=run_id).update(
        wait_expires_at=timezone.now() - timedelta(seconds=1))
    status = wait_for(run_id, ("failed",), timeout=20, worker=worker)
    assert status.error["type"] == "queuety.exceptions.WaitExpired"
    assert kinds(run_id).count("wait_timed_out") == 1


def test_timeout__fires_when_the_sweeper_comes_back_after_the_expiry(worker, token):
    run_id = (queuety.workflow("timed_restart").wait_for_approval(timeout=1)
              .then(workflows.step_a).dispatch({"token": token}))
    worker.stop()  # no worker, no beat, no sweeper: nothing can fire the timeout
    try:
        time.sleep(2.5)
        assert queuety.workflow_status(run_id).status == "waiting_for_signal"
        assert "wait_timed_out" not in kinds(run_id)
    finally:
        worker.start()
    status = wait_for(run_id, ("failed",), timeout=30, worker=worker)
    assert status.error["type"] == "queuety.exceptions.WaitExpired"
    assert kinds(run_id).count("wait_timed_out") == 1


def test_expiry_scan__uses_the_partial_index():
    # The sweeper's own query (both timed waits, one IN-list), as Django writes it.
    scan = WorkflowRun.objects.filter(
        status__in=expiry.TIMED_STATUSES, wait_expires_at__lte=timezone.now()
    ).order_by("wait_expires_at").values_list("pk", flat=True)[:100]
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        sql, params = scan.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "queuety_run_timed_expiry" in plan, plan


def test_admin_and_cli__show_the_expiry(worker, token):
    superuser = User.objects.create_user(f"s{uuid.uuid4().hex[:10]}", is_staff=True,
                                         is_superuser=True)
    run_id = (queuety.workflow("timed_shown").wait_for_approval(timeout=600)
              .then(workflows.step_a).dispatch({"token": token}))
    client = Client()
    client.force_login(superuser)
    html = client.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode()
    assert 'id="wait-expiry"' in html and "timeout 600.0s" in html and "Expires:" in html
    from io import StringIO

    from django.core.management import call_command
    out = StringIO()
    call_command("queuety", "workflow", "status", str(run_id), stdout=out)
    assert "Expires:  " in out.getvalue() and "(on timeout: fail)" in out.getvalue()
    expires = WorkflowRun.objects.get(pk=run_id).wait_expires_at
    api = api_client()
    listed = [w for w in api.get("/queuety/api/waits/").json() if w["id"] == run_id]
    assert [timezone.datetime.fromisoformat(w["expires_at"].replace("Z", "+00:00"))
            for w in listed] == [expires]
    details = api.get(f"/queuety/api/runs/{run_id}/").json()["wait_details"]
    assert timezone.datetime.fromisoformat(details["expires_at"]) == expires
    assert details["on_timeout"] == "fail" and details["timeout_seconds"] == 600.0
    queuety.cancel(run_id)


def test_reply_racing_the_timeout__exactly_one_outcome_per_run(worker, token, semantics):
    runs = [queuety.workflow("timed_race").wait_for_approval(timeout=2.0)
            .then(workflows.step_a).dispatch({"token": f"{token}-{i}"}) for i in range(30)]
    expires = {pk: at for pk, at in WorkflowRun.objects.filter(pk__in=runs)
               .values_list("pk", "wait_expires_at")}
    outcomes: dict[int, str] = {}

    def answer(run_id: int) -> None:
        # Aim around the expiry, from 0.5 s before it to 0.1 s after: the early replies
        # should win, the late ones lose, and those near it race the sweepers.
        delay = (expires[run_id] - timezone.now()).total_seconds() + (run_id % 7 - 5) * 0.1
        time.sleep(max(0.0, delay))
        try:
            queuety.approve(run_id, {"by": "racer"})
            outcomes[run_id] = "reply"
        except queuety.WaitExpired:
            outcomes[run_id] = "expired"
        finally:
            connection.close()

    def sweep_hard() -> None:
        end = time.monotonic() + 3
        while time.monotonic() < end:
            expiry.expire_due(timezone.now())
        connection.close()

    threads = [threading.Thread(target=answer, args=(pk,)) for pk in runs]
    threads += [threading.Thread(target=sweep_hard) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    for run_id in runs:
        status = wait_for(run_id, ("completed", "failed"), timeout=30, worker=worker)
        events = kinds(run_id)
        settled, timed_out = events.count("wait_settled"), events.count("wait_timed_out")
        assert settled + timed_out == 1, (run_id, events)
        if outcomes[run_id] == "reply":
            assert settled == 1 and status.status == "completed"
        else:
            assert timed_out == 1 and status.status == "failed"
            assert "signal_received" not in events
    counts = {kind: list(outcomes.values()).count(kind) for kind in ("reply", "expired")}
    semantics.record("a reply racing a wait's timeout (30 runs, 2 sweepers + the beat)",
                     "each wait settled exactly once, by the reply or by the timeout",
                     f"replies won {counts['reply']}, timeouts won {counts['expired']}; "
                     "no run had both")
    assert sum(counts.values()) == 30
    assert counts["reply"] >= 1 and counts["expired"] >= 1  # both sides of the race were run


def test_pause__holds_the_timeout_and_resume_keeps_the_deadline(worker, token):
    run_id = (queuety.workflow("timed_paused").wait_for_approval(timeout=1.5)
              .then(workflows.step_a).dispatch({"token": token}))
    expires = WorkflowRun.objects.get(pk=run_id).wait_expires_at
    queuety.pause(run_id)
    time.sleep(3)  # past the expiry: sweeps skip a paused run
    assert queuety.workflow_status(run_id).status == "paused"
    assert "wait_timed_out" not in kinds(run_id)
    queuety.resume(run_id)
    assert WorkflowRun.objects.get(pk=run_id).wait_expires_at == expires
    status = wait_for(run_id, ("failed",), timeout=20, worker=worker)
    assert status.error["type"] == "queuety.exceptions.WaitExpired"


def test_signal_for_the_next_wait__past_due_wait_times_out_first_and_it_is_delivered(worker,
                                                                                     token):
    run_id = (queuety.workflow("timed_then_next")
              .wait_for_signal("first", timeout=3600, on_timeout="continue")
              .wait_for_signal("second", result_key="second").then(workflows.step_a)
              .dispatch({"token": token}))
    WorkflowRun.objects.filter(pk=run_id).update(
        wait_expires_at=timezone.now() - timedelta(seconds=1))
    queuety.signal(run_id, "second", {"n": 2})  # whether the sweeper got there first or not
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed" and status.state["second"] == {"n": 2}
    assert kinds(run_id).count("wait_timed_out") == 1


def test_retry_after_a_timeout__waits_its_whole_timeout_again(worker, token):
    run_id = (queuety.workflow("timed_retry").then(workflows.step_a)
              .wait_for_approval(timeout=timedelta(seconds=1)).then(workflows.step_b)
              .dispatch({"token": token}))
    assert wait_for(run_id, ("failed",), timeout=20, worker=worker).error["type"] == \
        "queuety.exceptions.WaitExpired"
    retried_at = timezone.now()
    queuety.retry(run_id)
    parked = wait_for(run_id, PARKED, worker=worker)
    expires = timezone.datetime.fromisoformat(parked.wait_details["expires_at"])
    assert expires >= retried_at + timedelta(seconds=1)  # a new deadline, not the past one
    queuety.approve(run_id, {"by": "ada"})  # accepted: the retried wait has not expired
    assert wait_for(run_id, ("completed",), worker=worker).status == "completed"
    assert len(workflows.marks(f"{token}-b")) == 1


def test_a_timeout_whose_next_step_cannot_start__fails_the_run_once(worker, token):
    # on_timeout="continue" leads to a for_each whose items the timeout did not provide: the
    # run fails at the wait (once) instead of the sweeper retrying it every sweep.
    run_id = (queuety.workflow("timed_dead_end")
              .wait_for_signal("items", result_key="payload", timeout=timedelta(seconds=1),
                               on_timeout="continue")
              .for_each("missing_items", workflows.run_task)
              .dispatch({"token": token}))
    failed = wait_for(run_id, ("failed",), timeout=20, worker=worker)
    assert "missing_items" in failed.error["message"]
    time.sleep(2.5)  # two more sweeps: nothing more happens to the run
    assert kinds(run_id).count("wait_timed_out") == 1
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
