"""Bulk actions by filter (``queuety.bulk()``): a durable operation a real worker processes in
chunks against PostgreSQL, through the Python API, the REST API and the CLI."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
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
        # Recorded directly (no task message is sent: the worker never sees it) and processed
        # here, one chunk, then left holding the lease as a worker that died would.
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


def test_admin_acts_on_exactly_the_runs_the_changelist_counts(worker, token, admin_client):
    approvals = approval_flow(token)
    signals = named(f"bulk_s_{token}", lambda flow: flow.wait_for_signal("go"),
                    lambda flow: flow.then(workflows.step_a))
    tags = {"t": token}
    waiting = [approvals.dispatch({"token": token}, tags=tags) for _ in range(2)]
    plain = [signals.dispatch({"token": token}, tags=tags) for _ in range(3)]
    wait_for(lambda: statuses([*waiting, *plain]) == ["waiting_for_signal"] * 5)
    changelist = "/admin/queuety/workflowrun/"

    for choice in ("approval", "person"):
        query = {"waiting": choice, "tag": f"t:{token}"}
        shown = admin_client.get(changelist, query).context["cl"].result_count
        url = f"{changelist}?waiting={choice}&tag=t:{token}"
        answer = admin_client.post(url, {"action": "pause_selected", "select_across": "1",
                                         "index": "0", "_selected_action": [waiting[0]]})
        assert answer.status_code == 302, answer.content
        op = BulkOperation.objects.order_by("-pk").first()
        assert (op.filter, op.matched, shown) == ({"waiting": choice, "tags": tags}, shown, 2)
        finished(op.pk)
        queuety.bulk("resume", workflow=name_of(approvals))
        wait_for(lambda: statuses(waiting) == ["waiting_for_signal"] * 2)
    assert statuses(plain) == ["waiting_for_signal"] * 3  # never reached

    # "a signal" (a plain signal wait) and "no version label" have no exact bulk filter:
    # refused with the reason, nothing started.
    count = BulkOperation.objects.count()
    for query, said in (("waiting=signal", b"a plain signal wait"),
                        ("version=(none)", b"no version label")):
        refused = admin_client.post(f"{changelist}?{query}&workflow={name_of(signals)}", {
            "action": "cancel_selected", "select_across": "1", "index": "0",
            "_selected_action": [plain[0]]}, follow=True)
        assert said in refused.content and b"nothing was started" in refused.content
    assert BulkOperation.objects.count() == count
    assert statuses(plain) == ["waiting_for_signal"] * 3


def test_skip_reasons_count_runs_of_one_reason_under_one_key(worker, token):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(4)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 4)

    op = finished(queuety.bulk("rewind", workflow=name_of(flow), step=0).id)

    # Step 0 completed in none of them: four runs of four ids, one reason without an id.
    assert (op.acted, op.skipped, list(op.skipped_reasons.values())) == (0, 4, [4])
    (reason,) = op.skipped_reasons
    assert not any(str(run_id) in reason for run_id in runs), reason


def test_distinct_skip_reasons_are_capped_the_rest_count_as_other():
    counts = bulk_actions._Counts(0, 0, {})  # noqa: SLF001 - the cap is the tally's own logic
    for n in range(bulk_actions.MAX_REASONS + 5):
        counts.add(f"reason number {n}")
    counts.add("Run 12 is already on that definition.")
    counts.add("Run 13 is already on that definition.")
    assert len(counts.reasons) == bulk_actions.MAX_REASONS + 1
    assert counts.reasons["other"] == 7 and counts.skipped == bulk_actions.MAX_REASONS + 7
    assert bulk_actions.reason_key("No visit of step 0 of workflow run 7 completed") == \
        "No visit of step 0 of the run completed"


def failing_access(user, run):
    """RUN_ACCESS that raises for a run whose payload asks it to (an unexpected error)."""
    if (run.state or {}).get("boom"):
        raise RuntimeError(f"access check broke on run {run.pk}")
    return True


def failing_scope(user, runs):
    raise RuntimeError("the scope function broke")


def test_one_run_that_raises_is_skipped_with_its_error_class_and_the_rest_go_on(worker, token):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token, "boom": i == 1}) for i in range(3)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 3)
    user = make_user("change_workflowrun", "view_workflowrun")
    op = BulkOperation.objects.create(action="pause", filter={"workflow": name_of(flow)},
                                      requested_by=user, for_user=True, max_run_id=max(runs))
    access = "tests.integration.test_bulk_actions.failing_access"
    with override_settings(QUEUETY={**TEST_QUEUETY, "RUN_ACCESS": access}):
        assert bulk_actions.process(op.pk) == "done"
    op.refresh_from_db()
    assert (op.acted, op.skipped, op.skipped_reasons) == (
        2, 1, {"an unexpected error (RuntimeError)": 1})
    assert statuses(runs) == ["paused", "waiting_for_signal", "paused"]


def test_an_operation_that_stalls_is_marked_failed_with_the_error(worker, token, no_sweeps):
    flow = approval_flow(token)
    run = flow.dispatch({"token": token})
    wait_for(lambda: statuses([run]) == ["waiting_for_signal"])
    user = make_user("change_workflowrun", "view_workflowrun")
    op = BulkOperation.objects.create(action="cancel", filter={"workflow": name_of(flow)},
                                      requested_by=user, for_user=True, max_run_id=run)
    scoped = {**TEST_QUEUETY, "RUN_SCOPE": "tests.integration.test_bulk_actions.failing_scope"}
    with override_settings(QUEUETY=scoped):
        for _ in range(bulk_actions.MAX_STALLS):  # the first claim, then MAX_STALLS - 1 stalls
            with pytest.raises(RuntimeError, match="the scope function broke"):
                bulk_actions.process(op.pk)
            BulkOperation.objects.filter(pk=op.pk).update(  # its lease lapses
                heartbeat_at=timezone.now() - timedelta(minutes=5))
        assert bulk_actions.process(op.pk) == "failed"
    op.refresh_from_db()
    assert op.status == "failed" and op.stalls == bulk_actions.MAX_STALLS
    assert f"Bulk operation {op.pk} failed" in op.error
    assert "RuntimeError: the scope function broke" in op.error
    assert statuses([run]) == ["waiting_for_signal"]


def test_a_takeover_mid_operation_acts_on_no_run_twice(worker, token, no_sweeps):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(6)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 6)
    with override_settings(QUEUETY={**TEST_QUEUETY, "BULK_CHUNK_SIZE": 2}):
        op_id = BulkOperation.objects.create(
            action="cancel", filter={"workflow": name_of(flow)}, max_run_id=max(runs),
            matched=6).pk
        assert bulk_actions.process(op_id, max_chunks=1, release=False) == "running"
        held = BulkOperation.objects.get(pk=op_id).lease_token
        # A live lease is not taken over.
        assert bulk_actions.process(op_id, max_chunks=1, release=False) == "running"
        assert BulkOperation.objects.get(pk=op_id).acted == 2
        BulkOperation.objects.filter(pk=op_id).update(
            heartbeat_at=timezone.now() - timedelta(minutes=5))
        # Another processor takes the lapsed lease over (one stall) and goes on at the cursor.
        assert bulk_actions.process(op_id, max_chunks=1, release=False) == "running"
        op = BulkOperation.objects.get(pk=op_id)
        assert (op.acted, op.stalls) == (4, 0) and op.lease_token != held
        assert bulk_actions.process(op_id) == "running"  # its lease is live: left to it
        BulkOperation.objects.filter(pk=op_id).update(
            heartbeat_at=timezone.now() - timedelta(minutes=5))
        assert bulk_actions.process(op_id) == "done"
    op = BulkOperation.objects.get(pk=op_id)
    assert (op.acted, op.skipped) == (6, 0)
    assert statuses(runs) == ["cancelled"] * 6
    assert Event.objects.filter(run_id__in=runs, kind="workflow_cancelled").count() == 6


def slow_access(user, run):
    """RUN_ACCESS that takes 1.5 s over a run whose payload asks it to (a slow run)."""
    if (run.state or {}).get("slow"):
        time.sleep(1.5)
    return True


def test_a_run_that_outlasts_the_lease_is_not_taken_over_from_under_it(worker, token,
                                                                        no_sweeps):
    import threading

    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token, "slow": i == 0}) for i in range(3)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 3)
    user = make_user("change_workflowrun", "view_workflowrun")
    op = BulkOperation.objects.create(action="pause", filter={"workflow": name_of(flow)},
                                      requested_by=user, for_user=True, max_run_id=max(runs),
                                      matched=3)
    left: dict[str, str] = {}

    def first() -> None:
        left["first"] = bulk_actions.process(op.pk)
        connection.close()

    slow = {**TEST_QUEUETY, "RUN_ACCESS": "tests.integration.test_bulk_actions.slow_access",
            "BULK_LEASE": 0.5}
    with override_settings(QUEUETY=slow):
        processor = threading.Thread(target=first)
        processor.start()
        time.sleep(0.8)  # the first run's transaction is past the lease by now
        # A second processor (the sweeper's resend) waits for that transaction, then finds
        # the heartbeat it left fresh: it leaves the operation to the first.
        left["second"] = bulk_actions.process(op.pk)
        processor.join(20)
    op.refresh_from_db()
    assert left == {"first": "done", "second": "running"}
    assert (op.acted, op.skipped, op.stalls) == (3, 0, 0)
    assert statuses(runs) == ["paused"] * 3
    assert Event.objects.filter(run_id__in=runs, kind="workflow_paused").count() == 3


def test_migrate_resolves_latest_once_at_the_start(worker, token):
    first = named(f"bulk_mig_{token}", lambda flow: flow.wait_for_approval(),
                  lambda flow: flow.then(workflows.step_a))
    queuety.register(name_of(first), first)
    run = first.dispatch({"token": token})
    wait_for(lambda: statuses([run]) == ["waiting_for_signal"])
    latest = WorkflowRun.objects.get(pk=run).definition_id

    progress = queuety.bulk("migrate", workflow=name_of(first), dry_run=True)
    assert progress.arguments == {"to": "latest", "definition_id": latest}

    # A deploy after the start: a new latest. The operation still moves onto the one it
    # resolved (its runs are on it already: skipped so, not moved to the new one).
    second = named(name_of(first), lambda flow: flow.wait_for_approval(),
                   lambda flow: flow.then(workflows.step_a), lambda flow: flow.then(workflows.step_b))
    op = BulkOperation.objects.create(
        action="migrate", filter={"workflow": name_of(first)}, max_run_id=run, matched=1,
        arguments=progress.arguments)
    queuety.registry.unregister(name_of(first))
    queuety.register(name_of(first), second)
    assert bulk_actions.process(op.pk) == "done"
    op.refresh_from_db()
    assert (op.acted, op.skipped_reasons) == (0, {"it is on the target definition already": 1})
    assert WorkflowRun.objects.get(pk=run).definition_id == latest
    queuety.registry.unregister(name_of(first))


def test_unknown_definition_filter_is_a_400_invalid_filter(token):
    client = APIClient()
    client.force_authenticate(make_user("view_workflowrun", "change_workflowrun"))
    answer = client.post("/queuety/api/runs/bulk/", {
        "action": "cancel", "filter": {"definition": "feedfacefeedface"}, "dry_run": True},
        format="json")
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_filter")
    assert "feedfacefeedface" in answer.json()["detail"]


def test_cli_bulk_list_and_as_user_finds_the_users_own_api_operations(token):
    user = make_user("view_workflowrun", "change_workflowrun")
    client = APIClient()
    client.force_authenticate(user)
    made = client.post("/queuety/api/runs/bulk/", {
        "action": "cancel", "filter": {"workflow": f"bulk_none_{token}"}, "dry_run": True},
        format="json").json()["id"]
    out = StringIO()
    call_command("queuety", "workflow", "bulk-status", str(made), "--as-user",
                 user.get_username(), "--json", stdout=out)
    assert json.loads(out.getvalue())["id"] == made
    out = StringIO()
    call_command("queuety", "workflow", "bulk-list", "--as-user", user.get_username(),
                 "--json", stdout=out)
    assert [each["id"] for each in json.loads(out.getvalue())] == [made]
    out = StringIO()
    call_command("queuety", "workflow", "bulk-list", "--limit", "1", stdout=out)
    assert out.getvalue().startswith(f"{made}  cancel done (dry run)")


def chunk_plan(filler_from: int | None = None, **filters) -> str:
    """The chunk query's plan; with ``filler_from`` (a run id), over 20,000 more runs copied
    from it under other names and analysed (rolled back after), so that the planner sees a
    table where the workflow is rare, not the near-empty one a test has."""
    runs = bulk_actions.chunk_of(filters, None, timezone.now(), cursor=0, high=2**62)
    sql, params = runs.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        if filler_from is not None:
            columns = [field.column for field in WorkflowRun._meta.concrete_fields
                       if field.column not in ("id", "key")]
            copied = ", ".join("'bulk_plan_filler_' || g" if column == "name" else f'r."{column}"'
                               for column in columns)
            cursor.execute(
                f"INSERT INTO queuety_workflowrun ({', '.join(f'{c!r}'.replace(chr(39), chr(34)) for c in columns)}) "
                f"SELECT {copied} FROM queuety_workflowrun r, generate_series(1, 20000) g "
                "WHERE r.id = %s", [filler_from])
            cursor.execute("ANALYZE queuety_workflowrun")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


@pytest.mark.parametrize("filters", [{"status": "failed"}, {}], ids=["and status", "alone"])
def test_a_chunk_by_workflow_reads_an_index_in_id_order(filters, token):
    source = approval_flow(token).dispatch({"token": token})
    plan = chunk_plan(source, workflow="bulk_plan", error_type="ValueError", **filters)
    # Read through an index of the workflow (or the status), never the whole table in id order
    # with the workflow as a filter (each chunk would then read every run: O(n^2) in all).
    assert "queuety_workflowrun_pkey" not in plan, plan
    assert re.search(r"Index Cond: \(+\((name|status)\)::text = '(bulk_plan|failed)'", plan), plan


def test_a_chunk_by_definition_reads_an_index_in_id_order(token):
    flow = approval_flow(token)
    run = flow.dispatch({"token": token})
    definition = WorkflowRun.objects.get(pk=run).definition_id
    plan = chunk_plan(definition=str(definition))
    assert "Sort" not in plan and "queuety_run_definition_id" in plan, plan


def test_a_worker_lets_the_operation_go_after_its_time_slice_and_sends_it_on(worker, token,
                                                                             no_sweeps):
    flow = approval_flow(token)
    runs = [flow.dispatch({"token": token}) for _ in range(4)]
    wait_for(lambda: statuses(runs) == ["waiting_for_signal"] * 4)
    with override_settings(QUEUETY={**TEST_QUEUETY, "BULK_CHUNK_SIZE": 2}):
        op_id = BulkOperation.objects.create(
            action="cancel", filter={"workflow": name_of(flow)}, max_run_id=max(runs),
            matched=4).pk
        # Out of time after its first chunk: the lease let go, the task sent again.
        assert bulk_actions.process(op_id, time_slice=0) == "running"
    assert BulkOperation.objects.get(pk=op_id).acted == 2
    op = finished(op_id)  # the session worker took the task and went on at the cursor
    assert (op.status, op.acted, op.stalls) == ("done", 4, 0)
    assert Event.objects.filter(run_id__in=runs, kind="workflow_cancelled").count() == 4
