"""Progress heartbeats and prune_state_after, on PostgreSQL with a real worker."""

from __future__ import annotations

import time
import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

import queuety
from queuety.models import Event, StepRun, WorkflowRun
from tests import long_steps, workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def superuser() -> User:
    return User.objects.create_user(f"s{uuid.uuid4().hex[:10]}", is_staff=True,
                                    is_superuser=True)


def wait_progress(run_id: int, text: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = queuety.workflow_status(run_id)
        if status.progress and status.progress["text"].startswith(text):
            return status
        time.sleep(0.05)
    raise AssertionError(f"Run {run_id} never reported {text!r}: {status.progress!r}")


def test_progress__shown_by_status_api_cli_and_admin_while_the_step_runs(worker, token,
                                                                         semantics):
    run_id = (queuety.workflow("progress").then(long_steps.report_progress)
              .dispatch({"token": token, "total": 1000}))

    status = wait_progress(run_id, "1000/1000")
    assert status.progress["data"] == {"done": 1000, "total": 1000, "stage": "embedding"}
    assert status.progress["text"] == "1000/1000 (100%) stage=embedding"
    assert status.progress["step_name"] == "report_progress" and status.progress["reported_at"]

    api = APIClient()
    api.force_authenticate(superuser())
    body = api.get(f"/queuety/api/runs/{run_id}/").json()
    assert body["progress"]["text"] == "1000/1000 (100%) stage=embedding"
    out = StringIO()
    call_command("queuety", "workflow", "status", str(run_id), stdout=out)
    assert "Progress: 1000/1000 (100%) stage=embedding (step 'report_progress'" in out.getvalue()
    admin = Client()
    admin.force_login(superuser())
    html = admin.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode()
    assert 'id="progress"' in html and "1000/1000 (100%)" in html
    assert 'aria-valuenow="100"' in html

    workflows.mark(f"{token}-release")
    done = wait_for(run_id, worker=worker)
    assert done.status == "completed" and done.progress is None
    semantics.record("progress: 1,000 context.heartbeat(progress=...) calls in a tight loop",
                     "cheap in the handler; the heartbeat thread writes the latest",
                     f"{done.state['per_call_us']} us a call in the handler")
    assert done.state["per_call_us"] < 1000
    # 1,000 reports in a tight loop were coalesced into a few writes; the last is kept.
    assert StepRun.objects.get(run_id=run_id).progress["done"] == 1000


def test_progress__a_report_that_is_not_json_is_refused_in_the_step(worker, token):
    run_id = queuety.workflow("bad_progress").then(long_steps.bad_progress) \
        .dispatch({"token": token})
    status = wait_for(run_id, worker=worker)
    assert status.state["refused"] == "InvalidProgress"
    assert f"Step 'bad_progress' of run {run_id} reported progress that is not JSON" in \
        status.state["message"]


def test_prune_state_after__drops_keys_two_steps_later_unless_rewritten(worker, token):
    run_id = (queuety.workflow("pruned").then(long_steps.p_one).then(long_steps.p_two)
              .then(long_steps.p_three).then(long_steps.p_four).then(long_steps.p_five)
              .prune_state_after(2).dispatch({"token": token}))
    status = wait_for(run_id, worker=worker)

    assert status.status == "completed"
    assert status.state == {"token": token, "four": 4, "five": 5}
    pruned = {e.step_name: e.data.get("pruned") for e in
              Event.objects.filter(run_id=run_id, kind="step_completed").order_by("pk")}
    assert pruned == {"p_one": None, "p_two": None, "p_three": None, "p_four": ["two"],
                      "p_five": ["one", "three"]}
    # The timeline keeps what was pruned: the state after each step is rebuilt as it was.
    assert queuety.workflow_state_at(run_id, "p_two") == {"token": token, "one": 1, "two": 2}
    assert queuety.workflow_state_at(run_id, "p_four") == {
        "token": token, "one": "again", "three": 3, "four": 4}
    assert WorkflowRun.objects.get(pk=run_id).state_writes == {"four": 4, "five": 5}


def test_prune_state_after__keeps_a_long_run_under_max_state_bytes(worker, token):
    def build(name):
        return (queuety.workflow(name).then(long_steps.big_chunk).then(workflows.step_a)
                .max_state_bytes(1500))

    unpruned = build("chunks_kept").dispatch({"token": token})
    pruned = build("chunks_pruned").prune_state_after(2).dispatch({"token": token})

    assert wait_for(unpruned, worker=worker).error["budget"] == "max_state_bytes"
    status = wait_for(pruned, worker=worker)
    assert status.status == "completed"
    assert sorted(k for k in status.state if k.startswith("chunk")) == ["chunk7"]
    assert status.state["n"] == 8
    assert status.budget["public_state_bytes"] < 1500


def test_prune_state_after__prunes_at_a_wait_settled_by_a_signal(worker, token):
    run_id = (queuety.workflow("pruned_wait").then(long_steps.p_one)
              .wait_for_signal("go", result_key="go").then(long_steps.p_two)
              .prune_state_after(2).dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.signal(run_id, "go", {"ok": True})
    status = wait_for(run_id, worker=worker)
    assert status.state == {"token": token, "go": {"ok": True}, "two": 2}
    assert Event.objects.get(run_id=run_id, kind="step_completed",
                             step_name="p_two").data["pruned"] == ["one"]


def test_prune_state_after__transition_cost_is_pinned(token):
    """Measured in this process: a pruned workflow's step takes the locked path (its
    transition needs state_writes); a plain one keeps the one-statement transition."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queuety import publish
    from queuety.runtime import attempt

    def statements(builder):
        with publish.captured() as sent:
            builder.dispatch({"token": token})
            with CaptureQueriesContext(connection) as step:
                attempt.execute_step(sent[0].step_run_id, inline=False)
        return [q["sql"].split()[0] for q in step.captured_queries]

    plain = queuety.workflow("cost_plain").then(long_steps.p_one).then(long_steps.p_two)
    pruned = plain.prune_state_after(1)
    assert statements(plain) == ["UPDATE", "WITH"]
    assert statements(pruned) == ["UPDATE", "BEGIN", "UPDATE", "SELECT", "UPDATE", "INSERT",
                                  "INSERT", "COMMIT"]


def test_prune_state_after__counts_a_child_runs_merged_keys(worker, token):
    child = queuety.workflow("pruned_child_inner").then(long_steps.p_two)
    run_id = (queuety.workflow("pruned_child").run_workflow("inner", child)
              .then(long_steps.p_four).then(long_steps.p_five)
              .prune_state_after(2).dispatch({"token": token}))
    status = wait_for(run_id, worker=worker)
    # "two" came with the child's state at transition 1 and left two transitions later.
    assert status.status == "completed"
    assert status.state == {"token": token, "four": 4, "five": 5}
    assert Event.objects.get(run_id=run_id, kind="step_completed",
                             step_name="p_five").data["pruned"] == ["two"]
