"""The cross-run event log on real runs: ``manage.py queuety log`` (table, ``--json``,
filters, ``--since``, ``--follow``), ``GET events/`` (filters, cursor pages, errors), the
admin's events list, and ``RUN_SCOPE`` in each (a user never sees another tenant's events)."""

from __future__ import annotations

import base64
import json
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from rest_framework.test import APIClient

import queuety
from queuety.models import Event
from tests import event_log_steps
from tests.integration.conftest import ROOT, wait_for
from tests.integration.test_api import make_user
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker

API = "/queuety/api"
BOOM = "tests.event_log_steps.LogBoom"
SCOPED = {**TEST_QUEUETY, "RUN_SCOPE": "tests.workflows.tenant_scope"}
RETRY_ONCE = queuety.RetryPolicy(max_attempts=2, initial_delay=0.05, jitter=0)


def log(*args: str) -> str:
    out = StringIO()
    call_command("queuety", "log", *args, stdout=out)
    return out.getvalue()


def json_lines(*args: str) -> list[dict]:
    return [json.loads(line) for line in log(*args, "--json").splitlines()]


@pytest.fixture(scope="module")
def runs(worker):
    """Two workflows of their own: ``ok`` (two runs, tenants a and b) and ``failing`` (one
    run, tenant a: a retried attempt, then a failed one, then the run fails)."""
    tag = uuid.uuid4().hex[:6]
    ok, failing = f"evl_ok_{tag}", f"evl_fail_{tag}"
    done = [queuety.workflow(ok).then(event_log_steps.fine)
            .then(event_log_steps.fine, name="fine_again").dispatch({"tenant": tenant, "token": tag}) for tenant in ("a", "b")]
    failed = (queuety.workflow(failing).then(event_log_steps.fails, retry=RETRY_ONCE)
              .dispatch({"tenant": "a", "token": tag}))
    for run_id in (*done, failed):
        wait_for(run_id, worker=worker)
    return {"ok": ok, "failing": failing, "done": done, "failed": failed}


def test_cli__table_lists_a_workflow_s_events_oldest_first(runs):
    lines = log("--workflow", runs["ok"]).splitlines()

    assert lines[0].split() == ["ID", "Run", "Workflow", "Step", "Event", "Attempt",
                                "Duration_ms", "Error", "Created_at"]
    expected = list(Event.objects.filter(run__name=runs["ok"]).order_by("created_at", "id"))
    assert [int(line.split()[0]) for line in lines[1:]] == [e.pk for e in expected]
    assert {line.split()[2] for line in lines[1:]} == {runs["ok"]}
    assert any("step_completed" in line for line in lines)


def test_cli__json_lines_and_each_filter(runs):
    every = json_lines("--workflow", runs["failing"])
    kinds = [row["kind"] for row in every]
    assert "step_retried" in kinds and "step_failed" in kinds and "workflow_failed" in kinds
    assert {row["run_id"] for row in every} == {runs["failed"]}

    failed = json_lines("--workflow", runs["failing"], "--event", "step_failed")
    assert [row["kind"] for row in failed] == ["step_failed"]
    assert failed[0]["error_type"] == BOOM and failed[0]["attempt"] == 2
    assert "log boom" in failed[0]["data"]["error"]["message"]

    by_type = json_lines("--error-type", BOOM, "--since", "1h")
    assert {row["run_id"] for row in by_type} == {runs["failed"]}
    assert {"step_retried", "step_failed"} <= {row["kind"] for row in by_type}

    one_run = json_lines("--run", str(runs["done"][1]))
    assert one_run and {row["run_id"] for row in one_run} == {runs["done"][1]}
    newest = json_lines("--workflow", runs["ok"], "--limit", "2")
    assert [row["id"] for row in newest] == [row["id"] for row in json_lines(
        "--workflow", runs["ok"])][-2:]


def test_cli__since_an_age_or_a_date_and_bad_values(runs):
    assert json_lines("--workflow", runs["ok"], "--since", "15m")
    assert log("--workflow", runs["ok"], "--since", "2999-01-01") == "No events found.\n"
    assert json_lines("--workflow", runs["ok"], "--since", "2000-01-01T00:00:00Z")
    with pytest.raises(CommandError, match="neither an age"):
        log("--since", "yesterday")
    with pytest.raises(CommandError, match="is not a run id"):
        log("--run", "abc")


def test_cli__as_user_sees_only_their_tenant_s_events(runs):
    user = make_user("view_workflowrun")
    user.last_name = "b"
    user.save()
    with override_settings(QUEUETY=SCOPED):
        seen = json_lines("--as-user", user.username, "--workflow", runs["ok"])
        assert seen and {row["run_id"] for row in seen} == {runs["done"][1]}
        assert json_lines("--as-user", user.username, "--workflow", runs["failing"]) == []


def test_cli__follow_prints_an_event_written_after_it_started(worker):
    name = f"evl_follow_{uuid.uuid4().hex[:6]}"
    flow = queuety.workflow(name).then(event_log_steps.fine)
    first = flow.dispatch({"token": name})
    wait_for(first, worker=worker)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "queuety", "log", "--workflow", name, "--follow",
         "--limit", "1", "--interval", "0.1", "--json"],
        cwd=ROOT, env=worker.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout],
                     daemon=True).start()
    try:
        # The newest event of the first run: the command has started and now polls.
        shown = json.loads(lines.get(timeout=30))
        assert (shown["run_id"], shown["kind"]) == (first, "workflow_completed")
        second = flow.dispatch({"token": name})
        wait_for(second, worker=worker)
        seen = []
        deadline = time.monotonic() + 20
        while not any(row["kind"] == "workflow_completed" for row in seen):
            assert time.monotonic() < deadline, seen
            try:
                seen.append(json.loads(lines.get(timeout=0.5)))
            except queue.Empty:
                pass
        assert {row["run_id"] for row in seen} == {second}
        expected = list(Event.objects.filter(run_id=second).order_by("created_at", "id")
                        .values_list("pk", flat=True))
        assert [row["id"] for row in seen] == expected  # each once, in order
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=10)
        errors = process.stderr.read()
        process.stderr.close()
        process.stdout.close()
    assert process.returncode == 0, errors


def api_client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_api__filters_and_cursor_pages_newest_first(runs):
    api = api_client(make_user("view_workflowrun"))
    everything = api.get(f"{API}/events/", {"workflow": runs["ok"]}).json()["results"]
    expected = list(Event.objects.filter(run__name=runs["ok"])
                    .order_by("-created_at", "-id").values_list("pk", flat=True))
    assert [row["id"] for row in everything] == expected
    assert everything[0]["run_url"].endswith(f"/queuety/api/runs/{everything[0]['run_id']}/")

    pages, url = [], f"{API}/events/?workflow={runs['ok']}&page_size=3"
    while url:
        answer = api.get(url).json()
        pages.append([row["id"] for row in answer["results"]])
        url = answer["next"]
    assert all(len(page) == 3 for page in pages[:-1]) and len(pages) > 1
    assert [pk for page in pages for pk in page] == expected

    failed = api.get(f"{API}/events/", {"error_type": BOOM, "event": "step_failed",
                                        "since": "1d"}).json()["results"]
    assert [(row["run_id"], row["kind"], row["error_type"]) for row in failed] == [
        (runs["failed"], "step_failed", BOOM)]
    assert api.get(f"{API}/events/", {"run": runs["done"][0], "workflow": runs["failing"]}
                   ).json()["results"] == []


def test_api__bad_filters_and_cursors_are_client_errors(runs):
    api = api_client(make_user("view_workflowrun"))
    for query, code in (({"since": "soon"}, "invalid_filter"), ({"run": "0"}, "invalid_filter"),
                        ({"workflow": "a\x00b"}, "invalid_filter")):
        response = api.get(f"{API}/events/", query)
        assert (response.status_code, response.json()["code"]) == (400, code), query
    assert api.get(f"{API}/events/", {"cursor": "not base64!"}).status_code == 404
    # A well-formed cursor whose position is no time: refused as a cursor, not a 500.
    forged = base64.b64encode(b"p=yesterday").decode()
    assert api.get(f"{API}/events/", {"cursor": forged}).status_code == 404
    assert APIClient().get(f"{API}/events/").status_code in (401, 403)
    assert api_client(make_user()).get(f"{API}/events/").status_code == 403


def test_api__scope_shows_a_user_their_tenant_s_events_only(runs):
    user = make_user("view_workflowrun")
    user.last_name = "a"
    user.save()
    with override_settings(QUEUETY=SCOPED):
        api = api_client(user)
        shown = {row["run_id"] for name in ("ok", "failing")
                 for row in api.get(f"{API}/events/", {"workflow": runs[name]}
                                    ).json()["results"]}
        assert shown == {runs["done"][0], runs["failed"]}
        assert api.get(f"{API}/events/", {"run": runs["done"][1]}).json()["results"] == []


def test_admin__events_list_filters_links_and_scope(runs):
    staff = make_user("view_workflowrun", staff=True)
    staff.last_name = "b"
    staff.save()
    browser = Client()
    browser.force_login(staff)
    page = browser.get("/admin/queuety/event/", {"workflow": runs["ok"],
                                                 "kind": "step_completed"})
    assert page.status_code == 200
    shown = list(page.context["cl"].result_list)
    assert shown and {(e.run.name, e.kind) for e in shown} == {(runs["ok"], "step_completed")}
    assert f'href="/admin/queuety/workflowrun/{runs["done"][0]}/change/"' in page.content.decode()

    found = browser.get("/admin/queuety/event/", {"q": f"#{runs['failed']}"}).context["cl"]
    assert {e.run_id for e in found.result_list} == {runs["failed"]}
    found = browser.get("/admin/queuety/event/", {"q": BOOM}).context["cl"]
    assert {e.kind for e in found.result_list} >= {"step_retried", "step_failed"}
    event = shown[0]
    detail = browser.get(f"/admin/queuety/event/{event.pk}/change/")
    assert detail.status_code == 200 and runs["ok"] in detail.content.decode()

    with override_settings(QUEUETY=SCOPED):
        page = browser.get("/admin/queuety/event/", {"workflow": runs["ok"]})
        assert {e.run_id for e in page.context["cl"].result_list} == {runs["done"][1]}
        other = Event.objects.filter(run_id=runs["failed"]).first()
        answer = browser.get(f"/admin/queuety/event/{other.pk}/change/", follow=True)
        # As for an event that does not exist: back to the index, "perhaps it was deleted".
        assert answer.redirect_chain and "Perhaps it was deleted" in answer.content.decode()
