"""Edit and rerun with a real worker: ``edit_state()`` on a paused or failed run, and
``retry(from_step=)``; through Python, the REST API, the CLI and the admin."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import override_settings
from rest_framework.test import APIClient

import queuety
from queuety.models import Event, StepRun
from tests import edit_steps, workflows
from tests.integration.conftest import wait_for
from tests.integration.test_operations import wait_until

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


def test_retry_from_the_first_step_starts_from_the_first_state(worker, token):
    run_id = failed_checkout(worker, token)
    queuety.retry(run_id, from_step="fetch")
    again = wait_for(run_id, worker=worker)
    assert again.status == "failed" and again.state["fetched"] == 1
    assert ledger(token) == ["fetch", "price", "charge"] * 2


def test_retry_from_step_refusals(worker, token):
    run_id = failed_checkout(worker, token)
    with pytest.raises(queuety.UnknownStep, match="no step named 'nope'"):
        queuety.retry(run_id, from_step="nope")
    done = queuety.workflow("edit_done2").then(edit_steps.fetch).then(edit_steps.price) \
        .dispatch({"token": token})
    assert wait_for(done, worker=worker).status == "completed"
    with pytest.raises(queuety.InvalidTransition, match="it is completed, not failed"):
        queuety.retry(done, from_step="fetch")
