"""Bulk actions by filter (``queuety.bulk()``): a durable operation a real worker processes in
chunks against PostgreSQL, through the Python API, the REST API and the CLI."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety import bulk_actions
from queuety.models import BulkOperation, Event, WorkflowRun
from queuety.runtime import sweeper
from tests import workflows
from tests.integration.test_api import make_user
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker


#: Each flow's workflow name, by the builder's id.
NAMES: dict[int, str] = {}


def named(name: str, *steps):
    """Workflow ``name`` of ``steps`` (builders, each step a copy: its name kept aside)."""
    flow = queuety.workflow(name)
    for step in steps:
        flow = step(flow)
    NAMES[id(flow)] = name
    return flow


def approval_flow(token: str, name: str = "a"):
    """Waits for an approval at once: a dispatched run stays live with no worker step."""
    return named(f"bulk_{name}_{token}", lambda flow: flow.wait_for_approval(),
                 lambda flow: flow.then(workflows.step_a))


def wait_for(predicate, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def name_of(flow) -> str:
    return NAMES[id(flow)]


def statuses(run_ids) -> list[str]:
    found = dict(WorkflowRun.objects.filter(pk__in=run_ids).values_list("pk", "status"))
    return [found[pk] for pk in run_ids]


def finished(op_id: int) -> BulkOperation:
    wait_for(lambda: BulkOperation.objects.get(pk=op_id).status in ("done", "cancelled",
                                                                    "failed"),
             timeout=30)
    return BulkOperation.objects.get(pk=op_id)


@pytest.fixture(autouse=True)
def cancel_leftovers(token):
    yield
    for run_id in (WorkflowRun.objects.filter(name__contains=token).exclude(
            status__in=["completed", "failed", "cancelled"]).values_list("pk", flat=True)):
        try:
            queuety.cancel(run_id)
        except queuety.InvalidTransition:
            pass


def test_dry_run_counts_the_matching_runs_and_changes_nothing(worker, token):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(3)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 3)

    progress = queuety.bulk("cancel", workflow=name_of(flow), dry_run=True)

    assert (progress.dry_run, progress.status, progress.matched) == (True, "done", 3)
    assert statuses(runs) == ["waiting_for_signal"] * 3
    assert not Event.objects.filter(run_id__in=runs, kind="workflow_cancelled").exists()


def test_cancel_by_workflow_and_status_acts_on_matching_runs_only(worker, token):
    flow, other = approval_flow(token), approval_flow(token, "other")
    waiting = [flow.dispatch({"token": token}) for _ in range(3)]
    paused = flow.dispatch({"token": token})
    elsewhere = other.dispatch({"token": token})
    wait_for(lambda: statuses([*waiting, paused, elsewhere]) == ["waiting_for_signal"] * 5)
    queuety.pause(paused)

    progress = queuety.bulk("cancel", workflow=name_of(flow), status="waiting_for_signal",
                            actor="test")
    op = finished(progress.id)

    assert (op.status, op.matched, op.acted, op.skipped) == ("done", 3, 3, 0)
    assert statuses(waiting) == ["cancelled"] * 3
    assert statuses([paused, elsewhere]) == ["paused", "waiting_for_signal"]
    # The audit: each run's timeline names the operation.
    assert sorted(Event.objects.filter(run_id__in=waiting, kind="workflow_cancelled")
                  .values_list("data__by", flat=True)) == [f"bulk operation {op.pk} (test)"] * 3

    # Pausing all the workflow's runs: the cancelled and the paused ones are skipped, by
    # reason.
    again = finished(queuety.bulk("pause", workflow=name_of(flow)).id)
    assert (again.acted, again.skipped) == (0, 4)
    assert again.skipped_reasons == {"it is cancelled, not running or waiting": 3,
                                     "it is paused, not running or waiting": 1}


def test_retry_of_failed_runs_filtered_by_error_type(worker, token):
    flow = named(f"bulk_fail_{token}", lambda flow: flow.then(workflows.flaky))
    value = [flow.dispatch({"token": f"{token}-v{i}", "raise": "builtins.ValueError",
                            "fail_times": 1}) for i in range(2)]
    key = flow.dispatch({"token": f"{token}-k", "raise": "builtins.KeyError", "fail_times": 1})
    wait_for(lambda: statuses([*value, key]) == ["failed"] * 3, timeout=30)

    listed = APIClient()
    listed.force_authenticate(make_user("view_workflowrun"))
    page = listed.get("/queuety/api/runs/", {"workflow": name_of(flow), "error_type": "ValueError"})
    assert sorted(run["id"] for run in page.json()["results"]) == sorted(value)

    op = finished(queuety.bulk("retry", workflow=name_of(flow), status="failed",
                               error_type="ValueError").id)

    assert (op.matched, op.acted, op.skipped) == (2, 2, 0)
    wait_for(lambda: statuses(value) == ["completed"] * 2, timeout=30)
    assert statuses([key]) == ["failed"]


def test_a_processor_that_dies_after_one_chunk_is_resumed_by_the_sweeper_without_acting_twice(
        worker, token, no_sweeps):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(5)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 5)
    with override_settings(QUEUETY={**TEST_QUEUETY, "BULK_CHUNK_SIZE": 2}):
        # Recorded, then taken by this process before the worker's message is handled: the
        # worker finds the lease held and leaves it.
        op_id = BulkOperation.objects.create(
            action="cancel", filter={"workflow": name_of(flow)}, max_run_id=max(runs),
            matched=5).pk
        left = bulk_actions.process(op_id, max_chunks=1, release=False)  # "dies" holding it
    op = BulkOperation.objects.get(pk=op_id)
    assert (left, op.status, op.acted, op.cursor) == ("running", "running", 2, sorted(runs)[1])

    # Its lease lapses; the sweeper sends the task again and the worker resumes at the cursor.
    BulkOperation.objects.filter(pk=op_id).update(
        heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert sweeper.sweep()["bulk"] == 1
    op = finished(op_id)

    assert (op.status, op.acted, op.skipped) == ("done", 5, 0)
    assert statuses(runs) == ["cancelled"] * 5
    assert Event.objects.filter(run_id__in=runs, kind="workflow_cancelled").count() == 5


def test_a_cancelled_operation_acts_on_no_more_runs(worker, token):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(4)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 4)
    with override_settings(QUEUETY={**TEST_QUEUETY, "BULK_CHUNK_SIZE": 1}):
        op_id = BulkOperation.objects.create(
            action="pause", filter={"workflow": name_of(flow)}, max_run_id=max(runs), matched=4).pk
        bulk_actions.process(op_id, max_chunks=1)
        stopped = queuety.cancel_bulk(op_id)
        assert bulk_actions.process(op_id) == "cancelled"  # a late message does nothing

    assert (stopped.status, stopped.acted) == ("cancelled", 1)
    assert sorted(statuses(runs)) == ["paused", *["waiting_for_signal"] * 3]


def test_runs_dispatched_after_the_start_are_left_alone(worker, token):
    flow = approval_flow(token)
    before = flow.dispatch({"token": token})
    wait_for(lambda: statuses([before]) == ["waiting_for_signal"])
    op_id = BulkOperation.objects.create(action="cancel", filter={"workflow": name_of(flow)},
                                         max_run_id=before, matched=1).pk
    after = flow.dispatch({"token": token})
    wait_for(lambda: statuses([after]) == ["waiting_for_signal"])
    bulk_actions.process(op_id)
    assert statuses([before, after]) == ["cancelled", "waiting_for_signal"]


def test_rewind_takes_its_step_and_skips_runs_where_it_never_completed(worker, token):
    flow = approval_flow(token)
    done, waiting = flow.dispatch({"token": token}), flow.dispatch({"token": token})
    wait_for(lambda: statuses([done, waiting]) == ["waiting_for_signal"] * 2)
    queuety.approve(done)
    wait_for(lambda: statuses([done]) == ["completed"])

    op = finished(queuety.bulk("rewind", workflow=name_of(flow), step=0).id)

    assert (op.acted, op.skipped, op.arguments) == (1, 1, {"step": 0})
    assert len(op.skipped_reasons) == 1 and list(op.skipped_reasons.values()) == [1]
    assert Event.objects.filter(run_id=done, kind="workflow_rewound").count() == 1
    assert not Event.objects.filter(run_id=waiting, kind="workflow_rewound").exists()
    wait_for(lambda: statuses([done]) == ["completed"])  # step_a ran again


def test_bad_input_records_nothing(token):
    count = BulkOperation.objects.count()
    with pytest.raises(ValueError, match="Unknown bulk action 'delete'"):
        queuety.bulk("delete", workflow="x")
    with pytest.raises(ValueError, match="rewind needs step="):
        queuety.bulk("rewind", workflow="x")
    with pytest.raises(ValueError, match="migrate needs the workflow filter"):
        queuety.bulk("migrate", status="running")
    with pytest.raises(ValueError, match="needs at least one filter key"):
        queuety.bulk("cancel")
    with pytest.raises(ValueError, match="Unknown status"):
        queuety.bulk("cancel", status="sleeping")
    assert BulkOperation.objects.count() == count


# -- REST ---------------------------------------------------------------------------------------

def test_rest_bulk_needs_the_change_permission_and_reports_progress(worker, token):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(2)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 2)
    body = {"action": "cancel", "filter": {"workflow": name_of(flow)}, "dry_run": False}

    viewer = APIClient()
    viewer.force_authenticate(make_user("view_workflowrun"))
    refused = viewer.post("/queuety/api/runs/bulk/", body, format="json")
    assert refused.status_code == 403
    assert statuses(runs) == ["waiting_for_signal"] * 2

    operator = APIClient()
    operator.force_authenticate(make_user("view_workflowrun", "change_workflowrun"))
    dry = operator.post("/queuety/api/runs/bulk/", {**body, "dry_run": True}, format="json")
    assert (dry.status_code, dry.json()["matched"]) == (200, 2)
    assert statuses(runs) == ["waiting_for_signal"] * 2

    started = operator.post("/queuety/api/runs/bulk/", body, format="json")
    assert started.status_code == 202, started.content
    op_id = started.json()["id"]
    finished(op_id)
    shown = operator.get(f"/queuety/api/runs/bulk/{op_id}/").json()
    assert (shown["status"], shown["acted"], shown["filter"]) == (
        "done", 2, {"workflow": name_of(flow)})
    assert shown["requested_by"].startswith("api:user:")
    assert statuses(runs) == ["cancelled"] * 2

    bad = operator.post("/queuety/api/runs/bulk/",
                        {"action": "cancel", "filter": {"older_than": "soon"}}, format="json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_request")
    assert "older_than 'soon' is not an age" in bad.json()["detail"]
    assert operator.get("/queuety/api/runs/bulk/999999999/").status_code == 404


# -- CLI ----------------------------------------------------------------------------------------

def test_cli_bulk_dry_run_then_cancel_and_status(worker, token):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(2)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 2)

    out = StringIO()
    call_command("queuety", "workflow", "bulk", "cancel", "--workflow", name_of(flow),
                 "--older-than", "0s", "--dry-run", stdout=out)
    assert "Dry run: 2 run(s) match" in out.getvalue()
    assert statuses(runs) == ["waiting_for_signal"] * 2

    out = StringIO()
    call_command("queuety", "workflow", "bulk", "cancel", "--workflow", name_of(flow),
                 "--json", stdout=out)
    op_id = json.loads(out.getvalue())["id"]
    finished(op_id)
    out = StringIO()
    call_command("queuety", "workflow", "bulk-status", str(op_id), "--json", stdout=out)
    assert json.loads(out.getvalue())["acted"] == 2
    assert statuses(runs) == ["cancelled"] * 2


def test_a_tag_filter_acts_only_on_runs_carrying_every_tag(worker, token):
    flow = approval_flow(token)
    both = [flow.dispatch({"token": token}, tags={"customer": "42", "plan": "pro"})
            for _ in range(2)]
    one = flow.dispatch({"token": token}, tags={"customer": "42", "plan": "free"})
    none = flow.dispatch({"token": token})
    wait_for(lambda: statuses([*both, one, none]) == ["waiting_for_signal"] * 4)

    assert queuety.bulk("cancel", workflow=name_of(flow), tags={"customer": "42"},
                        dry_run=True).matched == 3
    out = StringIO()
    call_command("queuety", "workflow", "bulk", "cancel", "--workflow", name_of(flow),
                 "--tag", "customer=42", "--tag", "plan=pro", "--dry-run", stdout=out)
    assert "Dry run: 2 run(s) match" in out.getvalue()

    user = make_user("change_workflowrun", "view_workflowrun")
    client = APIClient()
    client.force_authenticate(user)
    answer = client.post("/queuety/api/runs/bulk/", {
        "action": "cancel", "dry_run": False,
        "filter": {"workflow": name_of(flow), "tag": ["customer:42", "plan:pro"]}},
        format="json")
    assert answer.status_code == 202, answer.content
    op = finished(answer.json()["id"])

    assert (op.matched, op.acted) == (2, 2)
    assert statuses([*both, one, none]) == ["cancelled", "cancelled", "waiting_for_signal",
                                            "waiting_for_signal"]


# -- admin --------------------------------------------------------------------------------------

def test_admin_select_all_matching_starts_a_bulk_operation_over_the_changelists_filter(
        worker, token, admin_client):
    flow, other = approval_flow(token), approval_flow(token, "other")
    runs = [flow.dispatch({"token": token}) for _ in range(3)]
    elsewhere = other.dispatch({"token": token})
    wait_for(lambda: statuses([*runs, elsewhere]) == ["waiting_for_signal"] * 4)

    changelist = f"/admin/queuety/workflowrun/?workflow={name_of(flow)}"
    answer = admin_client.post(changelist, {"action": "cancel_selected", "select_across": "1",
                                            "index": "0", "_selected_action": [runs[0]]})

    assert answer.status_code == 302
    op = BulkOperation.objects.get(pk=int(answer["Location"].rstrip("/").split("/")[-2]))
    assert (op.action, op.filter, op.actor) == (
        "cancel", {"workflow": name_of(flow)}, f"admin:{op.requested_by.get_username()}")
    op = finished(op.pk)
    assert (op.acted, statuses(runs), statuses([elsewhere])) == (
        3, ["cancelled"] * 3, ["waiting_for_signal"])
    page = admin_client.get(f"/admin/queuety/bulkoperation/{op.pk}/change/")
    assert b"3 of 3 processed: 3 acted on, 0 skipped" in page.content

    # A search is not a filter the runs list has: refused, nothing started.
    count = BulkOperation.objects.count()
    refused = admin_client.post(f"{changelist}&q=x", {
        "action": "pause_selected", "select_across": "1", "index": "0",
        "_selected_action": [elsewhere]}, follow=True)
    assert b"filtered by q" in refused.content
    assert BulkOperation.objects.count() == count
