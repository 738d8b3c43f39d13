"""Starting registered workflows from anywhere: ``queuety.start()``, the REST API (``POST
runs/``, ``GET runs/``, lifecycle actions, ``GET workflows/``), the CLI and the admin's "Start
a run" page, against PostgreSQL and a real worker. The workflows are registered by
tests/testapp/workflows.py, an installed app, found at start-up as a site's would be."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

import queuety
from queuety import queries
from queuety.models import ApiReply, DispatchKey, Event, WorkflowRun
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

API = "/queuety/api"


def make_user(*perms: str, staff: bool = False) -> User:
    user = User.objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)


def client_with(*perms: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user(*perms))
    return client


@pytest.fixture
def starter():
    return client_with("view_workflowrun", "add_workflowrun", "change_workflowrun")


def post(client, path, body=None, **headers):
    return client.post(f"{API}{path}", data=json.dumps(body) if body is not None else "",
                       content_type="application/json", headers=headers)


def count_runs() -> int:
    return WorkflowRun.objects.count()


# -- the registry ------------------------------------------------------------------------------

def test_start__runs_a_workflow_registered_by_an_installed_app_on_the_worker(worker, token):
    run_id = queuety.start("reg_letters", {"token": token})
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed" and status.state["log"] == ["a", "b", "c"]
    assert status.definition_version == "v2"
    assert status.definition_hash == {e.name: e for e in queuety.registered()}[
        "reg_letters"].definition_hash


def test_start__an_idempotency_key_starts_one_run(worker, token):
    key = f"key-{token}"
    first = queuety.start("reg_letters", {"token": token}, idempotency_key=key)
    assert queuety.start("reg_letters", {"token": token}, idempotency_key=key) == first
    assert WorkflowRun.objects.filter(idempotency_key=key).count() == 1


@pytest.mark.parametrize(("name", "payload", "error"), [
    ("reg_nope", {}, queuety.UnknownWorkflow),
    ("reg_letters", ["not", "an", "object"], queuety.InvalidPayload),
    ("reg_letters", {"_reserved": 1}, queuety.InvalidPayload),
    ("reg_small", {"blob": "x" * 500}, queuety.BudgetExceeded),
])
def test_start__bad_input_is_a_clear_error_and_writes_nothing(name, payload, error):
    before = count_runs(), DispatchKey.objects.count()
    with pytest.raises(error) as raised:
        queuety.start(name, payload, idempotency_key=f"bad-{uuid.uuid4().hex}")
    assert (count_runs(), DispatchKey.objects.count()) == before
    if error is queuety.UnknownWorkflow:
        assert "'reg_letters'" in str(raised.value)


# -- POST runs/ --------------------------------------------------------------------------------

def test_post_runs__201_with_the_run_then_200_created_false_for_its_key(starter, worker, token):
    body = {"workflow": "reg_letters", "payload": {"token": token},
            "idempotency_key": f"api-{token}"}
    response = post(starter, "/runs/", body)
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["created"] is True and created["run"]["name"] == "reg_letters"
    assert created["run"]["idempotency_key"] == f"api-{token}"
    again = post(starter, "/runs/", body)
    assert again.status_code == 200 and again.json()["created"] is False
    assert again.json()["run"]["id"] == created["run"]["id"]
    assert wait_for(created["run"]["id"], worker=worker).state["log"] == ["a", "b", "c"]


def test_post_runs__a_key_of_another_workflow_or_payload_is_409_and_tells_nothing(starter,
                                                                                  token):
    # A caller who guesses a key (a schedule's, a site's "order-7") must not get that run's
    # status, nor write into its timeline.
    key = f"taken-{token}"
    first = post(starter, "/runs/", {"workflow": "reg_letters", "payload": {"token": token},
                                     "idempotency_key": key})
    assert first.status_code == 201
    run_id = first.json()["run"]["id"]
    for other in ({"workflow": "reg_approval", "payload": {"token": token}},
                  {"workflow": "reg_letters", "payload": {"token": token, "x": 1}}):
        refused = post(starter, "/runs/", {**other, "idempotency_key": key})
        assert refused.status_code == 409, refused.content
        assert refused.json()["code"] == "idempotency_conflict"
        assert "state" not in refused.json() and "run" not in refused.json()
    assert not Event.objects.filter(run_id=run_id, kind="idempotency_conflict").exists()


def test_post_runs__an_idempotency_key_header_replays_the_first_answer(starter, token):
    header = f"hdr-{token}"
    first = post(starter, "/runs/", {"workflow": "reg_letters", "payload": {"token": token}},
                 **{"Idempotency-Key": header})
    replay = post(starter, "/runs/", {"workflow": "reg_letters", "payload": {"token": token}},
                  **{"Idempotency-Key": header})
    assert first.status_code == replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["run"]["id"] == first.json()["run"]["id"]
    assert WorkflowRun.objects.filter(name="reg_letters",
                                      state__token=token).count() == 1
    assert ApiReply.objects.filter(key=header).count() == 1


@pytest.mark.parametrize(("body", "code"), [
    ({"workflow": "reg_nope", "payload": {}}, "unknown_workflow"),
    ({"workflow": "reg_letters", "payload": [1]}, "invalid_payload"),
    ({"workflow": "reg_letters", "payload": "text"}, "invalid_payload"),
    ({"workflow": "reg_small", "payload": {"blob": "x" * 500}}, "budget_exceeded"),
    ({"payload": {}}, "invalid_request"),
    ({"workflow": "reg_letters", "colour": "red"}, "invalid_request"),
])
def test_post_runs__bad_input_is_400_naming_what_is_wrong_and_writes_nothing(starter, body,
                                                                             code):
    before = count_runs()
    response = post(starter, "/runs/", body)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code and response.json()["detail"].endswith(".")
    assert count_runs() == before
    if code == "unknown_workflow":
        assert "reg_letters" in response.json()["known"]


def test_post_runs__a_body_over_max_signal_bytes_is_413_and_writes_nothing(starter):
    before = count_runs()
    response = post(starter, "/runs/", {"workflow": "reg_letters",
                                        "payload": {"blob": "x" * 70_000}})
    assert response.status_code == 413 and response.json()["code"] == "payload_too_large"
    assert count_runs() == before


def test_post_runs__needs_the_add_permission(token):
    reader = client_with("view_workflowrun", "signal_workflowrun")
    before = count_runs()
    response = post(reader, "/runs/", {"workflow": "reg_letters", "payload": {"token": token}})
    assert response.status_code == 403 and count_runs() == before


# -- lifecycle actions -------------------------------------------------------------------------

def test_actions__pause_resume_cancel_with_the_cli_state_rules(starter, worker, token):
    run_id = queuety.start("reg_approval", {"token": token})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    paused = post(starter, f"/runs/{run_id}/pause/")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert post(starter, f"/runs/{run_id}/pause/").status_code == 409
    resumed = post(starter, f"/runs/{run_id}/resume/")
    assert resumed.status_code == 200 and resumed.json()["status"] == "waiting_for_signal"
    retry = post(starter, f"/runs/{run_id}/retry/")
    assert retry.status_code == 409 and retry.json()["code"] == "invalid_transition"
    cancelled = post(starter, f"/runs/{run_id}/cancel/", **{"Idempotency-Key": f"c-{token}"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    replay = post(starter, f"/runs/{run_id}/cancel/", **{"Idempotency-Key": f"c-{token}"})
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert post(starter, f"/runs/{run_id}/cancel/").status_code == 409
    kinds = [e["kind"] for e in queuety.workflow_timeline(run_id)]
    assert kinds.count("workflow_cancelled") == 1


def test_actions__retry_runs_a_failed_run_again(starter, worker, token):
    run_id = queuety.start("reg_flaky", {"token": token, "raise": "queuety.PermanentError",
                                         "fail_times": 1})
    assert wait_for(run_id, worker=worker).status == "failed"
    retried = post(starter, f"/runs/{run_id}/retry/")
    assert retried.status_code == 200, retried.content
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed" and status.state["succeeded_on"] == 2
    assert post(starter, f"/runs/{run_id}/retry/").status_code == 409  # completed now


def test_actions__need_the_change_permission(worker, token):
    run_id = queuety.start("reg_approval", {"token": token})
    reader = client_with("view_workflowrun", "add_workflowrun")
    assert post(reader, f"/runs/{run_id}/cancel/").status_code == 403
    assert queuety.workflow_status(run_id).status != "cancelled"


# -- GET runs/ and GET workflows/ --------------------------------------------------------------

def test_get_runs__filters_and_cursor_pages_newest_first(starter, worker, token):
    ids = [queuety.start("reg_letters", {"token": token}) for _ in range(3)]
    waiting = queuety.start("reg_approval", {"token": token})
    for run_id in ids:
        wait_for(run_id, worker=worker)
    wait_for(waiting, ("waiting_for_signal",), worker=worker)

    page = starter.get(f"{API}/runs/", {"workflow": "reg_letters", "status": "completed",
                                        "page_size": 2})
    assert page.status_code == 200
    first = page.json()
    assert [run["id"] for run in first["results"]] == sorted(ids, reverse=True)[:2]
    assert all(run["name"] == "reg_letters" and run["status"] == "completed"
               and run["definition_version"] == "v2" for run in first["results"])
    assert "state" not in first["results"][0] and first["next"]
    second = starter.get(first["next"]).json()
    assert second["results"][0]["id"] < first["results"][-1]["id"]

    # Other workflows may carry a "v2" label too (the admin's tests do): each run listed has it,
    # and this test's runs are among them.
    version = starter.get(f"{API}/runs/", {"version": "v2", "page_size": 500}).json()
    assert all(run["definition_version"] == "v2" for run in version["results"])
    assert set(ids) <= {run["id"] for run in version["results"]}
    approvals = starter.get(f"{API}/runs/", {"waiting": "approval", "page_size": 500}).json()
    assert waiting in [run["id"] for run in approvals["results"]]
    assert all(run["status"] == "waiting_for_signal" for run in approvals["results"])
    not_waiting = starter.get(f"{API}/runs/", {"waiting": "false", "page_size": 500}).json()
    assert waiting not in [run["id"] for run in not_waiting["results"]]


@pytest.mark.parametrize("query", [{"status": "sleeping"}, {"waiting": "forever"}])
def test_get_runs__an_unknown_filter_value_is_400(starter, query):
    response = starter.get(f"{API}/runs/", query)
    assert response.status_code == 400 and response.json()["code"] == "invalid_filter"


def test_get_workflows__lists_the_registry(starter):
    response = starter.get(f"{API}/workflows/")
    assert response.status_code == 200
    found = {entry["name"]: entry for entry in response.json()}
    assert found["reg_letters"]["version"] == "v2"
    assert found["reg_letters"]["steps"] == ["step_a", "step_b", "step_c"]
    assert found["reg_letters"]["description"] == "Appends a, b and c to the log."


@pytest.fixture
def many_runs(token):
    """30,000 runs (5 workflows, 1 in 50 waiting, the rest completed), inserted and analysed
    inside a transaction that is rolled back: enough for the planner to choose as it would at
    1,000,000 rows, without writing them."""
    from django.db import transaction

    template = queuety.start("reg_letters", {"token": token})
    queuety.start("reg_approval", {"token": token})  # a definition with an approval wait
    columns = [f.column for f in WorkflowRun._meta.concrete_fields if f.column != "id"]
    chosen = {"name": "'scale_' || (g %% 5)",
              "status": "CASE WHEN g %% 50 = 0 THEN 'waiting_for_signal' ELSE 'completed' END",
              "idempotency_key": "NULL"}
    select = ", ".join(chosen.get(column, f'r."{column}"') for column in columns)
    quoted = ", ".join(f'"{column}"' for column in columns)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO queuety_workflowrun ({quoted}) "
                           f"SELECT {select} FROM generate_series(1, 30000) g, "
                           f"queuety_workflowrun r WHERE r.id = %s", [template])
            cursor.execute("ANALYZE queuety_workflowrun")
        yield
        transaction.set_rollback(True)


def plan(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS OFF) {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.parametrize("filters", [
    {}, {"status": "waiting_for_signal"}, {"status": "completed"}, {"workflow": "scale_3"},
    {"workflow": "scale_3", "status": "waiting_for_signal"}, {"waiting": "signal"},
    {"waiting": "false"}, {"waiting": "approval"}, {"version": "v2"},
])
def test_get_runs__a_page_is_an_index_scan_at_scale(many_runs, filters):
    text = plan(queries.runs_matching(**filters)[:51])
    assert "Seq Scan" not in text and "Index" in text, text
    # A page reads at most a few hundred rows, not the whole table sorted.
    assert "Sort Method" not in text or "Sort Key" not in text.splitlines()[1], text


# -- the CLI -----------------------------------------------------------------------------------

def cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


def test_cli_dispatch__prints_the_run_and_it_completes(worker, token, tmp_path):
    line = cli("workflow", "dispatch", "reg_letters", "--payload", json.dumps({"token": token}))
    assert line.startswith("Success: dispatched workflow #")
    run_id = int(line.split("#")[1].split(".")[0].split()[0])
    assert wait_for(run_id, worker=worker).state["log"] == ["a", "b", "c"]

    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"token": token}))
    keyed = cli("workflow", "dispatch", "reg_letters", "--payload-file", str(payload),
                "--key", f"cli-{token}")
    again = cli("workflow", "dispatch", "reg_letters", "--payload-file", str(payload),
                "--key", f"cli-{token}")
    assert keyed.split()[3].rstrip(".") == again.split()[3]
    assert "had already started it" in again


@pytest.mark.parametrize(("args", "message"), [
    (["reg_nope"], "No workflow is registered as 'reg_nope'"),
    (["reg_letters", "--payload", "[1]"], "must be a JSON object"),
    (["reg_letters", "--payload", "{oops"], "not valid JSON"),
    (["reg_letters", "--payload-file", "/nonexistent/p.json"], "Unable to read"),
    (["reg_small", "--payload", json.dumps({"blob": "x" * 500})], "max_state_bytes"),
])
def test_cli_dispatch__bad_input_is_an_error_and_writes_nothing(args, message):
    before = count_runs()
    with pytest.raises(CommandError, match=message):
        cli("workflow", "dispatch", *args)
    assert count_runs() == before


def test_cli_definitions__table_and_json():
    table = cli("workflow", "definitions")
    assert table.splitlines()[0].split() == ["Name", "Version", "Hash", "Steps", "Description"]
    row = next(line for line in table.splitlines() if line.startswith("reg_letters"))
    assert row.split()[:4] == ["reg_letters", "v2",
                               queuety.registry.get("reg_letters").definition_hash[:12], "3"]
    listed = json.loads(cli("workflow", "definitions", "--format", "json"))
    assert {"name": "reg_small", "version": None, "steps": ["step_a"], "description": "",
            "definition_hash": queuety.registry.get("reg_small").definition_hash} in listed


# -- the admin ---------------------------------------------------------------------------------

def admin_client(*perms: str) -> Client:
    client = Client()
    client.force_login(make_user("view_workflowrun", *perms, staff=True))
    return client


START = "/admin/queuety/workflowrun/start/"


def test_admin_start__lists_workflows_and_starts_a_run_from_the_form(worker, token):
    client = admin_client("add_workflowrun")
    index = client.get(START)
    assert index.status_code == 200 and b'id="workflow-reg_letters"' in index.content
    assert b"Start a run" in client.get("/admin/queuety/workflowrun/").content
    form = client.get(f"{START}reg_letters/")
    assert form.status_code == 200 and b"step_a" in form.content
    response = client.post(f"{START}reg_letters/", {"payload": json.dumps({"token": token}),
                                                    "idempotency_key": ""})
    assert response.status_code == 302
    run_id = int(response["Location"].rstrip("/").split("/")[-2])
    assert response["Location"].endswith(f"/{run_id}/change/")
    assert wait_for(run_id, worker=worker).state["log"] == ["a", "b", "c"]


@pytest.mark.parametrize(("payload", "message"), [
    ("[1, 2]", b"must be a JSON object"),
    ("{not json", b"not valid JSON"),
    (json.dumps({"_x": 1}), b"reserved"),
])
def test_admin_start__an_invalid_payload_shows_the_form_again_and_writes_nothing(payload,
                                                                                message):
    client = admin_client("add_workflowrun")
    before = count_runs()
    response = client.post(f"{START}reg_letters/", {"payload": payload})
    assert response.status_code == 400 and message in response.content
    assert count_runs() == before


def test_admin_start__needs_the_add_permission_and_a_registered_name():
    reader = admin_client()
    assert reader.get(START).status_code == 403
    assert reader.post(f"{START}reg_letters/", {"payload": "{}"}).status_code == 403
    assert b"Start a run" not in reader.get("/admin/queuety/workflowrun/").content
    assert admin_client("add_workflowrun").get(f"{START}reg_nope/").status_code == 404


def test_dispatch__after_a_rolled_back_dispatch_of_a_new_definition_still_works(token):
    # A view under ATOMIC_REQUESTS that fails after dispatching rolls back the definition row
    # its dispatch created; the process must not remember that row's id.
    from django.db import transaction

    from tests import workflows as steps

    builder = queuety.workflow(f"rolled_back_{token}").then(steps.step_a)
    with pytest.raises(RuntimeError), transaction.atomic():
        builder.dispatch({"token": token})
        raise RuntimeError("the view failed after dispatching")
    assert not WorkflowRun.objects.filter(name=f"rolled_back_{token}").exists()
    run_id = builder.dispatch({"token": token})
    assert WorkflowRun.objects.filter(pk=run_id, name=f"rolled_back_{token}").exists()
