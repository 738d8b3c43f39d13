"""Edit and rerun with a real worker: ``edit_state()`` on a paused or failed run, and
``retry(from_step=)``; through Python, the REST API, the CLI and the admin."""

from __future__ import annotations

import json
import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety import publish
from queuety.models import Event, StepRun, WorkflowRun
from queuety.runtime import claim
from queuety.store import rows
from tests import edit_steps, workflows
from tests.integration.conftest import wait_for
from tests.integration.test_api import make_user
from tests.integration.test_operations import wait_until
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker


def checkout():
    return (queuety.workflow("edit_checkout").then(edit_steps.fetch).then(edit_steps.price)
            .then(edit_steps.charge))


def ledger(token):
    return [line.split(" ", 1)[1] for line in workflows.marks(f"{token}-ledger")]


def failed_checkout(worker, token, **payload):
    run_id = checkout().dispatch({"token": token, **payload})
    assert wait_for(run_id, worker=worker).status == "failed"
    assert ledger(token) == ["fetch", "price", "charge"]
    return run_id


def edits(run_id):
    return list(Event.objects.filter(run_id=run_id, kind="state_edited").order_by("pk")
                .values_list("data", flat=True))


def test_edit_a_failed_runs_state_then_retry_completes_with_the_edited_value(worker, token):
    run_id = failed_checkout(worker, token, note="keep", stale=1)

    changes = queuety.edit_state(run_id, {"card": "visa-42", "stale": None},
                                 reason="customer gave a card", actor="ops:ann")

    assert changes == [{"path": "/card", "after": "visa-42"},
                       {"path": "/stale", "before": 1}]
    assert queuety.workflow_status(run_id).status == "failed"  # an edit moves nothing
    [event] = edits(run_id)
    assert event["by"] == "ops:ann" and event["reason"] == "customer gave a card"
    assert event["changes"] == changes and event["patch"] == {"card": "visa-42", "stale": None}
    assert event["state"]["card"] == "visa-42" and "stale" not in event["state"]
    queuety.retry(run_id)
    final = wait_for(run_id, worker=worker)
    assert final.status == "completed" and final.state["charged"] == "10 on visa-42"
    assert final.state["note"] == "keep" and "stale" not in final.state
    assert ledger(token) == ["fetch", "price", "charge", "charge"]


def test_edit_refused_on_completed_and_running_runs_and_bad_patches_change_nothing(
        worker, token):
    done = queuety.workflow("edit_done").then(edit_steps.fetch).dispatch({"token": token})
    assert wait_for(done, worker=worker).status == "completed"
    with pytest.raises(queuety.InvalidTransition,
                       match=f"Cannot edit the state of workflow run {done}: it is completed"):
        queuety.edit_state(done, {"x": 1}, reason="why not")

    busy = (queuety.workflow("edit_busy").then(edit_steps.nap).then(edit_steps.fetch)
            .dispatch({"token": token, "sleep": 3}))
    wait_for(busy, ("running",), worker=worker)
    napping = StepRun.objects.filter(run_id=busy, status="processing")
    wait_until(napping.exists, message="the nap step to be claimed")
    with pytest.raises(queuety.InvalidTransition, match=f"{busy}: it is running"):
        queuety.edit_state(busy, {"x": 1}, reason="too early")
    queuety.pause(busy)  # the nap in flight finishes; its run stays paused
    with pytest.raises(queuety.InvalidTransition,
                       match=f"{busy}: its step 'nap' is still running"):
        queuety.edit_state(busy, {"x": 1}, reason="still too early")
    assert edits(busy) == [] and wait_for(busy, ("paused",), worker=worker)
    wait_until(lambda: not napping.exists(), message="the nap to finish")
    queuety.edit_state(busy, {"sleep": 0, "fetched": 41}, reason="fix before resuming")
    queuety.resume(busy)
    assert wait_for(busy, worker=worker).state["fetched"] == 42

    failed = failed_checkout(worker, f"{token}-f")  # a ledger of its own
    before = queuety.workflow_status(failed).state
    for patch, reason, words in (([1], "r", "must be a JSON object"),
                                 ({"_next_step": "x"}, "r", "reserved"),
                                 ({"card": "v"}, "  ", "needs a reason"),
                                 ({"fetched": 1}, "r", "changes nothing")):
        with pytest.raises(queuety.InvalidStateEdit, match=words):
            queuety.edit_state(failed, patch, reason=reason)
    assert queuety.workflow_status(failed).state == before and edits(failed) == []


def test_edit_within_max_state_bytes_only(worker, token):
    run_id = (queuety.workflow("edit_budget").max_state_bytes(300).then(edit_steps.fetch)
              .then(edit_steps.charge).dispatch({"token": token}))
    assert wait_for(run_id, worker=worker).status == "failed"
    with pytest.raises(queuety.InvalidStateEdit, match="over its workflow's max_state_bytes "
                                                       "budget of 300; nothing was changed"):
        queuety.edit_state(run_id, {"card": "x" * 400}, reason="too big")
    assert "card" not in queuety.workflow_status(run_id).state


def test_retry_from_step_reruns_it_and_later_steps_and_discards_their_state(worker, token):
    run_id = failed_checkout(worker, token)
    assert queuety.workflow_status(run_id).state["price_runs"] == 1
    queuety.edit_state(run_id, {"card": "amex-7"}, reason="card found")

    queuety.retry(run_id, from_step="price", actor="ops:bob")

    # fetch did not run again; price and charge did, from the state after fetch: what price
    # merged is gone (price_runs counts from scratch), and so is the edit made after it, so
    # charge has no card and fails again.
    again = wait_for(run_id, worker=worker)
    assert ledger(token) == ["fetch", "price", "charge", "price", "charge"]
    assert again.status == "failed" and "card" not in again.state
    assert again.state["price_runs"] == 1 and again.state["log"] == ["fetch", "price"]
    retried = Event.objects.filter(run_id=run_id, kind="workflow_retried").get().data
    assert retried["by"] == "ops:bob" and retried["from_step"] == "price"
    assert retried["failed_step"] == "charge" and retried["state"]["log"] == ["fetch"]

    # An edit amends what the step the run stands at starts from: retrying from that step
    # (here by index) keeps it.
    queuety.edit_state(run_id, {"card": "amex-7"}, reason="card found again")
    queuety.retry(run_id, from_step=2)
    final = wait_for(run_id, worker=worker)
    assert final.status == "completed" and final.state["charged"] == "10 on amex-7"
    assert ledger(token)[5:] == ["charge"]
    assert queuety.workflow_state_at(run_id, "price")["price_runs"] == 1


def test_a_retry_from_a_step_discards_an_edit_made_after_it_from_the_timeline(worker, token):
    run_id = failed_checkout(worker, token)
    queuety.edit_state(run_id, {"card": "visa"}, reason="card found")
    queuety.retry(run_id, from_step="price")
    assert wait_for(run_id, worker=worker).status == "failed"
    assert ledger(token) == ["fetch", "price", "charge", "price", "charge"]

    # The discarded edit is gone from the rebuilt states too, and so from a rewind.
    assert "card" not in queuety.workflow_state_at(run_id, "price")
    queuety.rewind(run_id, "price")
    again = wait_for(run_id, worker=worker)
    assert again.status == "failed" and "card" not in again.state


def hops(name, token, **payload):
    return (queuety.workflow(name).then(edit_steps.hop_a).then(edit_steps.hop_b)
            .then(edit_steps.hop_c).then(edit_steps.hop_d).dispatch({"token": token, **payload}))


def test_retry_from_a_step_reached_by_a_loop_starts_from_its_latest_visit(worker, token):
    # hop_a (n=1), hop_b, hop_c jumps back to hop_a, hop_a (n=2) jumps to hop_c, hop_d fails.
    run_id = hops("edit_loop", token, loop=True)
    assert wait_for(run_id, worker=worker).status == "failed"
    assert ledger(token) == ["hop_a", "hop_b", "hop_c", "hop_a", "hop_c", "hop_d"]

    queuety.retry(run_id, from_step="hop_c")

    retried = Event.objects.filter(run_id=run_id, kind="workflow_retried").get().data
    assert {k: retried["state"].get(k) for k in ("n", "b_seen", "c_runs")} == {
        "n": 2, "b_seen": 1, "c_runs": 1}
    again = wait_for(run_id, worker=worker)
    assert again.status == "failed" and again.state["c_runs"] == 2 and again.state["n"] == 2
    assert ledger(token)[6:] == ["hop_c", "hop_d"]


def test_retry_from_a_step_whose_previous_step_was_skipped(worker, token):
    # hop_a jumps over hop_b (n starts at 1): hop_b never ran, hop_c did.
    run_id = hops("edit_skip", token, n=1)
    assert wait_for(run_id, worker=worker).status == "failed"
    assert ledger(token) == ["hop_a", "hop_c", "hop_d"]

    with pytest.raises(queuety.InvalidTransition) as refused:
        queuety.retry(run_id, from_step="hop_b")
    assert str(refused.value) == (
        f"Cannot retry workflow run {run_id} from step 'hop_b': No visit of step 1 of "
        f"workflow run {run_id} completed, so nothing records the state it started from. "
        "Retry from a step that ran, or without from_step.")
    assert queuety.workflow_status(run_id).status == "failed"  # nothing changed

    queuety.retry(run_id, from_step="hop_c")
    again = wait_for(run_id, worker=worker)
    # It started from the state after hop_a: what hop_c merged before is gone.
    assert again.status == "failed" and again.state["c_runs"] == 1 and "b_seen" not in again.state
    assert ledger(token)[3:] == ["hop_c", "hop_d"]


def test_retry_from_a_step_reached_by_a_route(worker, token):
    run_id = (queuety.workflow("edit_route")
              .route(workflows.classify, {"skip": "hop_c", "go": "hop_b"})
              .then(edit_steps.hop_b).then(edit_steps.hop_c).then(edit_steps.hop_d)
              .dispatch({"token": token, "label": "skip"}))
    assert wait_for(run_id, worker=worker).status == "failed"
    assert ledger(token) == ["hop_c", "hop_d"]
    queuety.edit_state(run_id, {"ok": True}, reason="fixed upstream")

    queuety.retry(run_id, from_step="hop_c")  # hop_b, the step before, never ran

    final = wait_for(run_id, worker=worker)
    assert final.status == "failed" and final.state["c_runs"] == 1  # the edit was discarded
    assert "ok" not in final.state and ledger(token)[2:] == ["hop_c", "hop_d"]


def test_retry_from_the_first_step_starts_from_the_first_state(worker, token):
    run_id = failed_checkout(worker, token)
    queuety.retry(run_id, from_step="fetch")
    again = wait_for(run_id, worker=worker)
    assert again.status == "failed" and again.state["fetched"] == 1
    assert ledger(token) == ["fetch", "price", "charge"] * 2


def test_a_rewind_to_the_step_before_keeps_the_edit(worker, token):
    run_id = failed_checkout(worker, token)
    queuety.edit_state(run_id, {"card": "jcb-5"}, reason="card found")
    assert queuety.workflow_state_at(run_id, "price")["card"] == "jcb-5"

    queuety.rewind(run_id, "price")  # back to just after price: charge next, with the edit

    final = wait_for(run_id, worker=worker)
    assert final.status == "completed" and final.state["charged"] == "10 on jcb-5"
    assert ledger(token) == ["fetch", "price", "charge", "charge"]


def test_retry_from_step_refusals(worker, token):
    run_id = failed_checkout(worker, token)
    with pytest.raises(queuety.UnknownStep, match="no step named 'nope'"):
        queuety.retry(run_id, from_step="nope")
    done = queuety.workflow("edit_done2").then(edit_steps.fetch).then(edit_steps.price) \
        .dispatch({"token": token})
    assert wait_for(done, worker=worker).status == "completed"
    with pytest.raises(queuety.InvalidTransition, match="it is completed, not failed"):
        queuety.retry(done, from_step="fetch")


def test_a_claim_waiting_on_an_edits_locks_claims_nothing(token, no_sweeps):
    # A claim statement that read the run as running, then waited on the step row's lock
    # while the run was paused and edited, re-checks only the step row when the lock goes:
    # the edit writes that row, so the claim finds it not due and takes nothing.
    with publish.captured():  # nobody else gets a message for the row
        run_id = checkout().dispatch({"token": token})
    row = StepRun.objects.get(run_id=run_id)
    began = timezone.now()  # the claim's clock: its statement began before the pause
    claimed = {}

    def claimer():
        claimed["claim"] = claim.claim(row.pk, began)
        connection.close()

    thread = threading.Thread(target=claimer)
    with transaction.atomic():
        rows.lock_run(run_id, steps_first=True)  # the lock edit_state takes, held from here
        thread.start()
        waiting_on_me = """SELECT count(*) FROM pg_locks WHERE NOT granted AND
            locktype = 'transactionid' AND transactionid::text::bigint = txid_current()
            % 4294967296"""
        deadline = time.monotonic() + 10
        with connection.cursor() as cursor:
            while not (cursor.execute(waiting_on_me), cursor.fetchone()[0])[1]:
                assert time.monotonic() < deadline, "the claim never waited on the lock"
                time.sleep(0.02)
        queuety.pause(run_id)
        queuety.edit_state(run_id, {"card": "visa"}, reason="card found")
    thread.join(10)
    assert claimed == {"claim": None}
    assert StepRun.objects.get(pk=row.pk).status == "pending"
    with publish.captured() as sent:
        queuety.resume(run_id)  # a resume makes the row due at once again
    assert [m.step_run_id for m in sent] == [row.pk]
    assert StepRun.objects.get(pk=row.pk).available_at <= timezone.now()
    queuety.cancel(run_id)


# -- the REST API -----------------------------------------------------------------------------

API = "/queuety/api"


def api_as(*perms):
    from tests.integration.test_api import make_user

    client = APIClient()
    client.force_authenticate(make_user(*perms))
    return client


def post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


def test_rest_edit_state_and_retry_from_step(worker, token):
    run_id = failed_checkout(worker, token)
    viewer = api_as("view_workflowrun")
    operator = api_as("view_workflowrun", "change_workflowrun")
    edit = f"{API}/runs/{run_id}/edit-state/"

    refused = post(viewer, edit, {"patch": {"card": "x"}, "reason": "r"})
    assert refused.status_code == 403 and edits(run_id) == []
    assert post(viewer, f"{API}/runs/{run_id}/retry/", {"from_step": "price"}
                ).status_code == 403
    assert post(operator, f"{API}/runs/999999999/edit-state/",
                {"patch": {}, "reason": "r"}).status_code == 404
    bad = post(operator, edit, {"patch": {"card": "x"}})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_state_edit"
    assert "needs a reason" in bad.json()["detail"]
    assert post(operator, edit, {"patch": [1], "reason": "r"}).status_code == 400
    assert post(operator, edit, {"state": {}, "reason": "r"}).json()["code"] == \
        "invalid_request"

    with override_settings(QUEUETY={**TEST_QUEUETY, "SECRET_KEYS": ["card"]}):
        done = post(operator, edit, {"patch": {"card": "visa-1"}, "reason": "on file"})
        assert done.status_code == 200, done.content
        # The whole answer is masked (its replay too); the timeline keeps the real values,
        # masked when read.
        assert done.json()["changes"] == [{"path": "/card", "after": "********"}]
        assert done.json()["run"]["status"] == "failed"
        assert done.json()["run"]["state"]["card"] == "********"
        events = operator.get(f"{API}/events/?run={run_id}")
        assert events.status_code == 200, events.content
        [shown] = [e for e in events.json()["results"] if e["kind"] == "state_edited"]
        assert shown["data"]["changes"] == [{"path": "/card", "after": "********"}]
        assert "visa-1" not in events.content.decode()
    [event] = edits(run_id)
    assert event["by"].startswith("api:user:") and event["reason"] == "on file"
    assert event["changes"] == [{"path": "/card", "after": "visa-1"}]
    for empty in ([], 0, ""):
        wrong = post(operator, f"{API}/runs/{run_id}/retry/", empty)
        assert wrong.status_code == 400 and wrong.json()["code"] == "invalid_request"

    unknown = post(operator, f"{API}/runs/{run_id}/retry/", {"from_step": "nope"})
    assert unknown.status_code == 400 and "no step named 'nope'" in unknown.json()["detail"]
    retried = post(operator, f"{API}/runs/{run_id}/retry/", {"from_step": "charge"})
    assert retried.status_code == 200
    assert wait_for(run_id, worker=worker).state["charged"] == "10 on visa-1"
    again = post(operator, edit, {"patch": {"card": "x"}, "reason": "late"})
    assert again.status_code == 409 and again.json()["code"] == "invalid_transition"
    assert f"Cannot edit the state of workflow run {run_id}: it is completed" in \
        again.json()["detail"]


# -- the CLI ----------------------------------------------------------------------------------

def cli(*args):
    out = StringIO()
    call_command("queuety", "workflow", *args, stdout=out)
    return out.getvalue()


def test_cli_edit_state_and_retry_from_step(worker, token, tmp_path):
    run_id = failed_checkout(worker, token)
    with pytest.raises(CommandError, match="--patch is not valid JSON"):
        cli("edit-state", str(run_id), "--patch", "{card:", "--reason", "r")
    with pytest.raises(CommandError, match="needs a reason"):
        cli("edit-state", str(run_id), "--patch", '{"card": "x"}', "--reason", " ")
    said = cli("edit-state", str(run_id), "--patch", '{"card": "mc-3", "log": null}',
               "--reason", "from the ticket")
    assert f"Workflow #{run_id}'s state edited (2 change(s))" in said
    assert '/card: (absent) -> "mc-3"' in said and "/log:" in said
    assert edits(run_id)[-1]["by"] == "manage.py"
    viewer = make_user("view_workflowrun")
    with pytest.raises(CommandError, match=(
            f"User '{viewer.username}' may not change workflow #{run_id}: it needs the "
            "queuety.change_workflowrun permission. Nothing was changed.")):
        cli("edit-state", str(run_id), "--patch", '{"card": "x"}', "--reason", "r",
            "--as-user", viewer.username)
    with pytest.raises(CommandError, match="needs the queuety.change_workflowrun"):
        cli("retry", str(run_id), "--from-step", "price", "--as-user", viewer.username)
    operator = make_user("view_workflowrun", "change_workflowrun")
    cli("edit-state", str(run_id), "--patch", '{"card": "mc-2"}', "--reason", "as a user",
        "--as-user", operator.username)
    assert edits(run_id)[-1]["by"] == f"manage.py:as-user:{operator.username}"
    patch = tmp_path / "patch.json"
    patch.write_text('{"card": "mc-4"}')
    shown = json.loads(cli("edit-state", str(run_id), "--patch-file", str(patch), "--reason",
                           "newer card", "--format", "json"))
    assert shown["changes"] == [{"path": "/card", "before": "mc-2", "after": "mc-4"}]

    assert "scheduled for retry from step price" in cli("retry", str(run_id), "--from-step",
                                                        "price")
    final = wait_for(run_id, worker=worker)
    # From price: the state after fetch, so the card edits (made at charge) are gone.
    assert final.status == "failed" and "card" not in final.state
    with pytest.raises(CommandError, match="no step named 'nope'"):
        cli("retry", str(run_id), "--from-step", "nope")


# -- the admin --------------------------------------------------------------------------------

def test_admin_edit_state_previews_the_diff_then_saves(worker, token, admin_client):
    run_id = failed_checkout(worker, token, api_key="s3cret")
    page_url = f"/admin/queuety/workflowrun/{run_id}/edit-state/"
    with override_settings(QUEUETY={**TEST_QUEUETY, "SECRET_KEYS": ["api_key"]}):
        run_page = admin_client.get(f"/admin/queuety/workflowrun/{run_id}/change/")
        assert page_url in run_page.content.decode()  # the "Edit state" link
        assert 'id="retry-from-form"' in run_page.content.decode()
        page = admin_client.get(page_url)
        text = page.content.decode()
        assert page.status_code == 200 and "s3cret" not in text and "********" in text
        state = json.loads(page.context["text"])
        revision = page.context["revision"]
        state["card"] = "visa-9"
        state.pop("log")

        bad = admin_client.post(page_url, {"state": "{not json", "reason": "r",
                                           "revision": revision, "preview": "1"})
        assert bad.status_code == 400 and "not valid JSON" in bad.content.decode()
        preview = admin_client.post(page_url, {"state": json.dumps(state), "reason": "ticket 9",
                                               "revision": revision, "preview": "1"})
        shown = preview.content.decode()
        assert preview.status_code == 200 and 'id="edit-state-diff"' in shown
        assert preview.context["changes"] == [  # the values shown as JSON
            {"path": "/card", "after": '"visa-9"'},
            {"path": "/log", "before": '["fetch", "price"]'}]
        assert "<code>[&quot;fetch&quot;, &quot;price&quot;]</code>" in shown
        missing = admin_client.post(page_url, {"state": json.dumps(state), "reason": "r",
                                               "preview": "1"})
        assert missing.status_code == 400 and (
            f"The form holds no valid revision of workflow run {run_id}, so nothing was "
            "saved; reload the Edit state page and try again.") in missing.content.decode()
        assert 'id="edit-save"' in shown and edits(run_id) == []  # nothing saved yet

        saved = admin_client.post(page_url, {"state": json.dumps(state), "reason": "ticket 9",
                                             "revision": revision, "save": "1"}, follow=True)
    assert saved.redirect_chain and "state was edited (2 change(s))" in saved.content.decode()
    final_state = queuety.workflow_status(run_id).state
    assert final_state["card"] == "visa-9" and "log" not in final_state
    assert final_state["api_key"] == "s3cret"  # left masked: kept as it was
    [event] = edits(run_id)
    assert event["by"].startswith("admin:") and event["reason"] == "ticket 9"
    # A second save from the same (now stale) page is refused, and saves nothing.
    stale = admin_client.post(page_url, {"state": "{}", "reason": "again",
                                         "revision": revision, "save": "1"})
    assert stale.status_code == 400 and "changed since this page was loaded" in \
        stale.content.decode() and len(edits(run_id)) == 1

    run_page = admin_client.get(f"/admin/queuety/workflowrun/{run_id}/change/")
    retried = admin_client.post(f"/admin/queuety/workflowrun/{run_id}/act/retry_from/", {
        "revision": run_page.context["run"].revision, "from_step": "charge"}, follow=True)
    assert [str(m) for m in retried.context["messages"]] == [
        f"Run {run_id} was scheduled for retry from step 'charge': it and the later steps run "
        "again."]
    assert wait_for(run_id, worker=worker).state["charged"] == "10 on visa-9"


def test_admin_edit_state_keeps_a_masked_secret_inside_a_list(worker, token, admin_client):
    cards = [{"number": "4111", "label": "x"}, {"number": "5500", "label": "y"}]
    run_id = failed_checkout(worker, token, cards=cards)
    page_url = f"/admin/queuety/workflowrun/{run_id}/edit-state/"
    with override_settings(QUEUETY={**TEST_QUEUETY, "SECRET_KEYS": ["number"]}):
        page = admin_client.get(page_url)
        state = json.loads(page.context["text"])
        assert state["cards"][0] == {"number": "********", "label": "x"}
        state["cards"][0]["label"] = "work"
        form = {"state": json.dumps(state), "reason": "relabel",
                "revision": page.context["revision"]}
        preview = admin_client.post(page_url, {**form, "preview": "1"})
        [change] = preview.context["changes"]
        assert change["path"] == "/cards" and json.loads(change["after"]) == [
            {"number": "********", "label": "work"}, {"number": "********", "label": "y"}]
        dropped = admin_client.post(page_url, {**form, "state": json.dumps(
            {**state, "cards": state["cards"][1:]}), "save": "1"})
        assert dropped.status_code == 400 and "The list at /cards holds masked secret " \
            "values and now has 1 items instead of 2" in dropped.content.decode()
        saved = admin_client.post(page_url, {**form, "save": "1"})
    assert saved.status_code == 302, saved.content.decode()
    assert queuety.workflow_status(run_id).state["cards"] == [
        {"number": "4111", "label": "work"}, {"number": "5500", "label": "y"}]


def test_admin_offers_no_edit_once_compensations_ran(worker, token, admin_client):
    run_id = failed_checkout(worker, token)
    WorkflowRun.objects.filter(pk=run_id).update(cleanup={"cause": "failure", "done": True})
    run_page = admin_client.get(f"/admin/queuety/workflowrun/{run_id}/change/")
    assert 'id="edit-state-link"' not in run_page.content.decode()
    page = admin_client.get(f"/admin/queuety/workflowrun/{run_id}/edit-state/")
    assert page.context["editable"] is False


def test_admin_edit_state_needs_the_change_permission(worker, token):
    from django.test import Client

    from tests.integration.test_api import make_user

    run_id = failed_checkout(worker, token)
    viewer = make_user("view_workflowrun", staff=True)
    browser = Client()
    browser.force_login(viewer)
    page_url = f"/admin/queuety/workflowrun/{run_id}/edit-state/"
    assert browser.get(page_url).status_code == 403
    assert page_url not in browser.get(f"/admin/queuety/workflowrun/{run_id}/change/"
                                       ).content.decode()
