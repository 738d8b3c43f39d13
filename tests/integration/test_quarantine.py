"""Quarantining a definition: pausing every live run of one definition and resuming them in
bulk, through the Python API, the command line, the admin and the REST API, against
PostgreSQL and a real worker."""

from __future__ import annotations

import json
import threading
import time
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety import quarantine
from queuety.models import Event, StepRun, WorkflowDefinition, WorkflowRun
from queuety.store import rows
from queuety.store.definitions import load_spec
from tests import workflows
from tests.integration.conftest import wait_for
from tests.integration.test_api import make_user
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker

LIVE = ("running", "waiting_for_signal", "waiting_for_workflows", "paused")


def wait_until(predicate, timeout=20, message="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.05)


def statuses(run_ids) -> list[str]:
    found = dict(WorkflowRun.objects.filter(pk__in=run_ids).values_list("pk", "status"))
    return [found[pk] for pk in run_ids]


def definition_of(run_id: int) -> WorkflowDefinition:
    return WorkflowRun.objects.select_related("definition").get(pk=run_id).definition


def approval_flow(token: str, name: str = "a"):
    """A wait for an approval first, so a dispatched run waits at once (no worker needed)."""
    return queuety.workflow(f"quar_{name}_{token}").wait_for_approval().then(workflows.step_a)


def approval_signal(run_id: int) -> str:
    run = WorkflowRun.objects.get(pk=run_id)
    return load_spec(run.definition_id).steps[run.current_step].wait.signals[0]


@pytest.fixture(autouse=True)
def cancel_leftovers(token):
    """Cancel this test's unfinished runs afterwards (pages listing every waiting run, in other
    modules, stay short in the session's shared database)."""
    yield
    for run_id in (WorkflowRun.objects.filter(name__contains=token).exclude(
            status__in=["completed", "failed", "cancelled"]).values_list("pk", flat=True)):
        try:
            queuety.cancel(run_id)
        except queuety.InvalidTransition:
            pass  # finished meanwhile


# -- the Python API ---------------------------------------------------------------------------

def test_pause_definition__only_its_live_runs_again_nothing_more_resume_completes_them(
        worker, token):
    flow_a = (queuety.workflow(f"quar_a_{token}").then(workflows.slow).wait_for_approval()
              .then(workflows.step_a))
    waiting = [flow_a.dispatch({"token": token, "sleep": 0}) for _ in range(3)]
    running = [flow_a.dispatch({"token": f"{token}-r", "sleep": 2.5}) for _ in range(2)]
    done = flow_a.dispatch({"token": token, "sleep": 0})
    others = [approval_flow(token, "b").dispatch({"token": token}) for _ in range(2)]
    for run_id in [*waiting, done]:
        wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.approve(done)
    wait_for(done, worker=worker)
    wait_until(lambda: StepRun.objects.filter(run_id__in=running, status="processing")
               .count() == 2, message="the slow steps in flight")
    definition = definition_of(waiting[0])

    result = queuety.pause_definition(definition.definition_hash, actor="ops:alice")

    assert (result.action, result.definition_id, result.workflow) == (
        "pause", definition.pk, f"quar_a_{token}")
    assert (result.done, result.skipped, result.failed) == (5, {"finished": 1}, {})
    assert statuses(waiting + running) == ["paused"] * 5
    assert statuses(others) == ["waiting_for_signal"] * 2
    paused = Event.objects.filter(run_id__in=waiting + running, kind="workflow_paused")
    assert sorted((e.run_id, e.data["by"], e.data["definition"], e.data["previous_status"])
                  for e in paused) == sorted(
        [(pk, "ops:alice", definition.definition_hash, "waiting_for_signal") for pk in waiting]
        + [(pk, "ops:alice", definition.definition_hash, "running") for pk in running])

    again = queuety.pause_definition(definition.definition_hash[:10])
    assert (again.done, again.skipped, again.failed) == (
        0, {"already_paused": 5, "finished": 1}, {})
    assert Event.objects.filter(run_id__in=waiting + running,
                                kind="workflow_paused").count() == 5

    # The steps in flight finish; nothing new starts, and answers wait for the resume.
    wait_until(lambda: not StepRun.objects.filter(run_id__in=running,
                                                  status="processing").exists(),
               message="the steps in flight to finish")
    for run_id in waiting:
        with pytest.raises(queuety.RunNotWaiting):
            queuety.approve(run_id)
    for run_id in waiting + running:
        assert not queuety.signal(run_id, approval_signal(run_id), {"ok": 1}).settled
    time.sleep(1.2)  # past the sweeper's period
    assert statuses(waiting + running) == ["paused"] * 5
    assert len(workflows.marks(f"{token}-a")) == 1  # the finished run's, before the pause
    assert workflows.marks(f"{token}-r-a") == []

    resumed = queuety.resume_definition(definition.pk, actor="ops:bob")

    assert (resumed.done, resumed.skipped, resumed.failed) == (5, {"finished": 1}, {})
    for run_id in waiting + running:
        assert wait_for(run_id, worker=worker).status == "completed"
    assert statuses(others) == ["waiting_for_signal"] * 2
    events = Event.objects.filter(run_id__in=waiting + running, kind="workflow_resumed")
    assert {(e.data["by"], e.data["definition"]) for e in events} == {
        ("ops:bob", definition.definition_hash)}
    assert queuety.resume_definition(definition.pk).skipped == {"finished": 6}


def test_resume_definition__a_run_whose_resume_raises_is_reported_the_others_proceed(token):
    child = queuety.workflow(f"quar_child_{token}").then(workflows.step_a)
    flow = (queuety.workflow(f"quar_capped_{token}").max_started_workflows(1)
            .wait_for_signal("go").start_workflows("tasks", child, "child_ids"))
    breach = flow.dispatch({"token": token, "tasks": ["x", "y"]})
    fine = [flow.dispatch({"token": token, "tasks": ["x"]}) for _ in range(2)]
    definition = definition_of(breach)
    assert quarantine.pause_definition(definition.pk).done == 3
    for run_id in (breach, *fine):
        queuety.signal(run_id, "go")

    result = quarantine.resume_definition(definition.pk, chunk_size=2)

    assert result.done == 2 and list(result.failed) == [breach]
    assert "would start 2 runs" in result.failed[breach]
    assert statuses([breach]) == ["paused"]  # rolled back alone: still paused, nothing started
    assert not WorkflowRun.objects.filter(started_by_id=breach).exists()
    assert statuses(fine) == ["completed", "completed"]  # past the start step, the last
    assert WorkflowRun.objects.filter(started_by_id__in=fine).count() == 2
    assert not Event.objects.filter(run_id=breach, kind="workflow_resumed").exists()


def test_unknown_definition__raises_and_changes_nothing(token):
    run_id = approval_flow(token).dispatch({"token": token})
    before = list(WorkflowRun.objects.filter(status__in=LIVE).values_list("pk", "status",
                                                                         "revision"))
    for call in (queuety.pause_definition, queuety.resume_definition):
        with pytest.raises(queuety.UnknownDefinition, match="No workflow definition has the "
                                                            "id or hash 'ffffffffffffdead'"):
            call("ffffffffffffdead")
        with pytest.raises(queuety.UnknownDefinition, match="at least 8 characters"):
            call("abc")
    assert list(WorkflowRun.objects.filter(status__in=LIVE).values_list(
        "pk", "status", "revision")) == before
    assert statuses([run_id]) == ["waiting_for_signal"]


def _hold_row(run_id: int, taken: threading.Event, seconds: float, released: list) -> None:
    """Hold run ``run_id``'s row lock in another connection for ``seconds``."""
    try:
        with transaction.atomic():
            rows.lock_run(run_id)
            taken.set()
            time.sleep(seconds)
            released.append(timezone.now())
    finally:
        connection.close()


def test_pause_definition__in_chunks_a_held_row_last_a_finished_run_skipped_a_new_one_paused(
        token, monkeypatch):
    flow = approval_flow(token)
    run_ids = [flow.dispatch({"token": token}) for _ in range(5)]
    definition = definition_of(run_ids[0])
    taken, released = threading.Event(), []
    holder = threading.Thread(target=_hold_row, args=(run_ids[1], taken, 0.6, released))
    holder.start()
    assert taken.wait(10)
    locking = rows.lock_free_runs
    started = []

    def meanwhile(ids, wanted):
        if not started:  # inside the first chunk's transaction: a run finishes, one starts
            queuety.cancel(run_ids[0])
            started.append(flow.dispatch({"token": token}))
        return locking(ids, wanted)

    monkeypatch.setattr(rows, "lock_free_runs", meanwhile)
    try:
        result = quarantine.pause_definition(definition.definition_hash, chunk_size=2)
    finally:
        holder.join()

    assert (result.done, result.skipped, result.failed) == (5, {"finished": 1}, {})
    assert statuses(run_ids[1:] + started) == ["paused"] * 5
    assert statuses(run_ids[:1]) == ["cancelled"]
    # The other chunks did not wait for the held row (SKIP LOCKED); it was paused once free.
    paused_at = dict(WorkflowRun.objects.filter(pk__in=run_ids).values_list("pk", "updated_at"))
    assert max(paused_at[pk] for pk in run_ids[2:]) < released[0] < paused_at[run_ids[1]]


# -- the command line -------------------------------------------------------------------------

def cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


def test_cli__pause_and_resume_a_definition_as_text_and_json(worker, token):
    run_ids = [approval_flow(token).dispatch({"token": token}) for _ in range(2)]
    definition = definition_of(run_ids[0])
    short = definition.definition_hash[:12]

    assert cli("workflow", "pause", "--definition", definition.definition_hash) == (
        f"Success: 2 runs of workflow 'quar_a_{token}' paused (definition {short}, id "
        f"{definition.pk}).\n")
    document = json.loads(cli("workflow", "pause", "--definition", short, "--format", "json"))
    assert document == {"action": "pause", "definition": {
        "id": definition.pk, "hash": definition.definition_hash,
        "workflow": f"quar_a_{token}"}, "paused": 0, "skipped": {"already_paused": 2},
        "failed": []}
    assert {e.data["by"] for e in Event.objects.filter(run_id__in=run_ids,
                                                       kind="workflow_paused")} == {"manage.py"}

    queuety.signal(run_ids[0], approval_signal(run_ids[0]))
    assert cli("workflow", "resume", "--definition", str(definition.pk)).splitlines() == [
        f"Success: 2 runs of workflow 'quar_a_{token}' resumed (definition {short}, id "
        f"{definition.pk})."]
    assert wait_for(run_ids[0], worker=worker).status == "completed"
    assert statuses(run_ids[1:]) == ["waiting_for_signal"]


def test_cli__one_run_as_before_and_errors_for_neither_both_or_an_unknown_definition(token):
    run_id = approval_flow(token).dispatch({"token": token})
    definition = definition_of(run_id)
    assert cli("workflow", "pause", str(run_id)) == f"Success: Workflow #{run_id} paused.\n"
    assert cli("workflow", "resume", str(run_id)) == f"Success: Workflow #{run_id} resumed.\n"

    with pytest.raises(CommandError, match="Give the id of the run to pause, or --definition "
                                           "HASH to pause every live run of a definition."):
        cli("workflow", "pause")
    with pytest.raises(CommandError, match="or --definition HASH to resume every paused run"):
        cli("workflow", "resume")
    with pytest.raises(CommandError, match=f"Give either a run id or --definition, not both "
                                           f"\\(got run #{run_id} and --definition 'abc"):
        cli("workflow", "pause", str(run_id), "--definition", "abcdef1234")
    with pytest.raises(CommandError, match="--format goes with --definition"):
        cli("workflow", "pause", str(run_id), "--format", "json")
    with pytest.raises(CommandError, match="No workflow definition has the id or hash "
                                           "'ffffffffffffdead'"):
        cli("workflow", "resume", "--definition", "ffffffffffffdead")
    assert statuses([run_id]) == ["waiting_for_signal"]
    assert definition.runs.filter(status="paused").count() == 0


def test_cli__a_run_that_could_not_be_resumed_is_listed_and_the_command_fails(token):
    child = queuety.workflow(f"quar_child_{token}").then(workflows.step_a)
    flow = (queuety.workflow(f"quar_capped_{token}").max_started_workflows(1)
            .wait_for_signal("go").start_workflows("tasks", child, "child_ids"))
    breach = flow.dispatch({"token": token, "tasks": ["x", "y"]})
    fine = flow.dispatch({"token": token, "tasks": []})
    definition = definition_of(breach)
    cli("workflow", "pause", "--definition", definition.definition_hash)
    queuety.signal(breach, "go")
    out = StringIO()

    with pytest.raises(CommandError, match=f"1 run of definition "
                                           f"{definition.definition_hash[:12]} could not be "
                                           "resumed \\(listed above\\); the others were."):
        call_command("queuety", "workflow", "resume", "--definition",
                     definition.definition_hash, stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Success: 1 run of workflow")
    assert lines[1].startswith(f"Failed: run #{breach}: Start step") and \
        "would start 2 runs" in lines[1]
    assert statuses([breach, fine]) == ["paused", "waiting_for_signal"]



# -- the admin --------------------------------------------------------------------------------

DEFINITIONS = "/admin/queuety/workflowdefinition/"


def admin_client(*perms: str, **options) -> Client:
    user = make_user(*perms, staff=True)
    client = Client(**options)
    client.force_login(user)
    return client


def flash(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_admin__the_definition_page_confirms_then_pauses_and_resumes_its_runs(worker, token):
    operator = admin_client("view_workflowrun", "change_workflowrun")
    run_ids = [approval_flow(token).dispatch({"token": token}) for _ in range(2)]
    other = approval_flow(token, "b").dispatch({"token": token})
    definition = definition_of(run_ids[0])
    page = f"{DEFINITIONS}{definition.pk}/change/"

    html = operator.get(page).content.decode()
    assert f'href="{DEFINITIONS}{definition.pk}/pause-runs/" id="pause-runs"' in html
    assert f'href="{DEFINITIONS}{definition.pk}/resume-runs/" id="resume-runs"' in html
    confirm = operator.get(f"{DEFINITIONS}{definition.pk}/pause-runs/")
    assert confirm.status_code == 200
    assert [row["affected"] for row in confirm.context["rows"]] == [2]
    assert "csrfmiddlewaretoken" in confirm.content.decode()
    assert statuses(run_ids) == ["waiting_for_signal"] * 2  # a GET changes nothing

    done = operator.post(f"{DEFINITIONS}{definition.pk}/pause-runs/", follow=True)

    assert done.redirect_chain == [(page, 302)]
    assert flash(done) == [f"Definition {definition.definition_hash[:12]} of "
                           f"'quar_a_{token}': 2 runs paused."]
    assert statuses(run_ids + [other]) == ["paused", "paused", "waiting_for_signal"]
    timeline = operator.get(f"/admin/queuety/workflowrun/{run_ids[0]}/change/")
    row = next(r for r in timeline.context["timeline"] if r["event"].kind == "workflow_paused")
    assert row["by"].startswith("admin:u") and definition.definition_hash in row["data"]

    queuety.signal(run_ids[0], approval_signal(run_ids[0]))
    resumed = operator.post(f"{DEFINITIONS}{definition.pk}/resume-runs/", follow=True)
    assert flash(resumed) == [f"Definition {definition.definition_hash[:12]} of "
                              f"'quar_a_{token}': 2 runs resumed."]
    assert wait_for(run_ids[0], worker=worker).status == "completed"
    assert statuses(run_ids[1:]) == ["waiting_for_signal"]
    assert LogEntry.objects.filter(object_id=str(definition.pk)).count() == 2


def test_admin__the_changelist_actions_confirm_then_act_on_each_selected_definition(token):
    operator = admin_client("view_workflowrun", "change_workflowrun")
    first = approval_flow(token).dispatch({"token": token})
    second = approval_flow(token, "b").dispatch({"token": token})
    untouched = approval_flow(token, "c").dispatch({"token": token})
    chosen = [definition_of(first).pk, definition_of(second).pk]
    selection = {"action": "pause_live_runs", "_selected_action": chosen}

    confirm = operator.post(DEFINITIONS, selection)
    assert confirm.status_code == 200
    assert [row["definition"].pk for row in confirm.context["rows"]] == sorted(chosen)
    assert statuses([first, second]) == ["waiting_for_signal"] * 2

    done = operator.post(DEFINITIONS, {**selection, "post": "yes"}, follow=True)
    assert len(flash(done)) == 2 and all("1 run paused." in m for m in flash(done))
    assert statuses([first, second, untouched]) == ["paused", "paused", "waiting_for_signal"]

    operator.post(DEFINITIONS, {"action": "resume_paused_runs", "_selected_action": chosen,
                                "post": "yes"})
    assert statuses([first, second]) == ["waiting_for_signal"] * 2


def test_admin__without_the_run_change_permission_nothing_is_offered_or_done(token):
    viewer = admin_client("view_workflowrun")
    run_id = approval_flow(token).dispatch({"token": token})
    definition = definition_of(run_id)

    assert "pause-runs" not in viewer.get(f"{DEFINITIONS}{definition.pk}/change/"
                                          ).content.decode()
    for action in ("pause-runs", "resume-runs"):
        assert viewer.get(f"{DEFINITIONS}{definition.pk}/{action}/").status_code == 403
        assert viewer.post(f"{DEFINITIONS}{definition.pk}/{action}/").status_code == 403
    assert viewer.get(DEFINITIONS).context["action_form"] is None
    viewer.post(DEFINITIONS, {"action": "pause_live_runs", "post": "yes",
                              "_selected_action": [definition.pk]})
    strict = admin_client("view_workflowrun", "change_workflowrun", enforce_csrf_checks=True)
    assert strict.post(f"{DEFINITIONS}{definition.pk}/pause-runs/").status_code == 403
    assert statuses([run_id]) == ["waiting_for_signal"]


# -- the REST API -----------------------------------------------------------------------------

API = "/queuety/api"


def api_client(*perms: str, user: User | None = None) -> APIClient:
    client = APIClient()
    client.force_authenticate(user or make_user(*perms))
    return client


def api_post(client: APIClient, path: str):
    return client.post(f"{API}{path}", data="", content_type="application/json")


def test_api__pause_and_resume_a_definition_answer_200_with_the_counts(worker, token):
    user = make_user("view_workflowrun", "change_workflowrun")
    operator = api_client(user=user)
    run_ids = [approval_flow(token).dispatch({"token": token}) for _ in range(3)]
    other = approval_flow(token, "b").dispatch({"token": token})
    definition = definition_of(run_ids[0])
    base = f"/workflows/quar_a_{token}/definitions"

    first = api_post(operator, f"{base}/{definition.definition_hash}/pause/")
    again = api_post(operator, f"{base}/{definition.definition_hash[:8]}/pause/")

    assert first.status_code == 200 and first.json() == {
        "action": "pause", "definition": {"id": definition.pk,
                                          "hash": definition.definition_hash,
                                          "workflow": f"quar_a_{token}"},
        "paused": 3, "skipped": {}, "failed": []}
    assert again.status_code == 200 and again.json()["paused"] == 0
    assert again.json()["skipped"] == {"already_paused": 3}
    assert statuses(run_ids + [other]) == ["paused"] * 3 + ["waiting_for_signal"]
    assert {e.data["by"] for e in Event.objects.filter(run_id__in=run_ids,
                                                       kind="workflow_paused")} == {
        f"api:user:{user.pk}:{user.get_username()}"}

    queuety.signal(run_ids[0], approval_signal(run_ids[0]))
    resumed = api_post(operator, f"{base}/{definition.definition_hash[:12]}/resume/")
    assert resumed.status_code == 200 and resumed.json()["resumed"] == 3
    assert wait_for(run_ids[0], worker=worker).status == "completed"


def test_api__404_for_an_unknown_hash_or_another_workflows_403_without_the_permission(token):
    run_id = approval_flow(token).dispatch({"token": token})
    other = approval_flow(token, "b").dispatch({"token": token})
    definition = definition_of(run_id)
    operator = api_client("view_workflowrun", "change_workflowrun")

    unknown = api_post(operator, f"/workflows/quar_a_{token}/definitions/ffffffffffffdead/"
                                 "pause/")
    assert unknown.status_code == 404 and unknown.json() == {
        "detail": "No workflow definition has the id or hash 'ffffffffffffdead'; list them "
                  "with 'manage.py queuety workflow definitions' (or the admin's Workflow "
                  "definitions).", "code": "definition_not_found"}
    wrong = api_post(operator, f"/workflows/quar_b_{token}/definitions/"
                               f"{definition.definition_hash}/pause/")
    assert wrong.status_code == 404 and wrong.json()["code"] == "definition_not_found"
    assert f"is of workflow 'quar_a_{token}', not 'quar_b_{token}'" in wrong.json()["detail"]
    path = f"/workflows/quar_a_{token}/definitions/{definition.definition_hash}/pause/"
    for client in (api_client("view_workflowrun", "signal_workflowrun"), APIClient()):
        refused = api_post(client, path)
        assert refused.status_code == 403 and refused.json()["code"] in (
            "permission_denied", "not_authenticated")
    assert operator.get(f"{API}{path}").status_code == 405
    assert statuses([run_id, other]) == ["waiting_for_signal"] * 2


def test_api__run_access_limits_a_definition_to_the_runs_the_user_may_act_on(token):
    run_ids = [approval_flow(token).dispatch({"token": token}) for _ in range(2)]
    definition = definition_of(run_ids[0])
    operator = api_client("view_workflowrun", "change_workflowrun")

    with override_settings(QUEUETY={**TEST_QUEUETY, "RUN_ACCESS": "tests.workflows.deny_all"}):
        response = api_post(operator, f"/workflows/quar_a_{token}/definitions/"
                                      f"{definition.definition_hash}/pause/")

    assert response.status_code == 200
    assert (response.json()["paused"], response.json()["skipped"]) == (
        0, {"not_permitted": 2})
    assert statuses(run_ids) == ["waiting_for_signal"] * 2


def test_api__the_openapi_schema_documents_both_endpoints():
    schema = json.loads(api_client("view_workflowrun").get(
        f"{API}/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").content)
    for action in ("pause", "resume"):
        operation = schema["paths"][f"{API}/workflows/{{name}}/definitions/{{hash}}/{action}/"]
        assert {p["name"] for p in operation["post"]["parameters"]} >= {"name", "hash"}
        assert set(operation["post"]["responses"]) >= {"200", "403", "404"}
    assert {"paused", "resumed", "skipped", "failed"} <= set(
        schema["components"]["schemas"]["BulkResult"]["properties"])
