"""Run tags against PostgreSQL and a real worker: tags given at dispatch, by ``start()`` and by
the builder's ``.with_tags()``, set by a step with ``context.tag()`` (durable with its outcome,
never from a failed attempt), and read back everywhere: status, ``GET runs/`` and its
``tag=`` filter, ``workflow list --tag``, the admin's filter and search, export and replay,
and the event log's ``--tag`` / ``tag=``."""

from __future__ import annotations

import html
import json
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

import queuety
from queuety import exceptions
from queuety.models import Event, WorkflowRun
from tests import tag_steps
from tests.integration.conftest import wait_for
from tests.integration.test_api import make_user

pytestmark = pytest.mark.worker

API = "/queuety/api"
RUNS = "/admin/queuety/workflowrun/"
RETRY_ONCE = queuety.RetryPolicy(max_attempts=2, initial_delay=0.05, jitter=0)


def cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


def api() -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user("view_workflowrun", "add_workflowrun"))
    return client


@pytest.fixture
def token() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def tagged_runs(worker, token):
    """Three finished runs of one workflow: customer ``token`` on plan pro and on plan free,
    and another customer on plan pro (the ``plan`` tag set by the step)."""
    flow = queuety.workflow(f"tags_{token}").with_tags(team="billing") \
        .then(tag_steps.tags_plan)
    ids = {
        "mine_pro": flow.dispatch({"plan": "pro"}, tags={"customer": token}),
        "mine_free": flow.dispatch({"plan": "free"}, tags={"customer": token}),
        "other_pro": flow.dispatch({"plan": "pro"}, tags={"customer": f"x{token}"}),
    }
    for run_id in ids.values():
        wait_for(run_id, worker=worker)
    return ids


def test_dispatch__tags_from_the_builder_the_dispatch_and_the_step(tagged_runs, token):
    status = queuety.workflow_status(tagged_runs["mine_pro"])
    assert status.status == "completed"
    # with_tags(team=...) on every run, the dispatch's customer, the step's plan and stage.
    assert status.tags == {"team": "billing", "customer": token, "plan": "pro",
                           "stage": "tagged"}
    assert status.to_dict()["tags"] == status.tags
    completed = Event.objects.get(run_id=tagged_runs["mine_pro"], kind="step_completed")
    assert completed.data["tags"] == {"plan": "pro", "stage": "tagged"}


def test_dispatch__dispatch_tags_win_over_the_builder_s(worker, token):
    flow = queuety.workflow(f"tags_win_{token}").with_tags(team="billing", region="eu") \
        .then(tag_steps.plain)
    run_id = flow.dispatch({}, tags={"team": "ops"})
    assert WorkflowRun.objects.get(pk=run_id).tags == {"team": "ops", "region": "eu"}
    # The locked path (an idempotency key) writes them too.
    keyed = flow.idempotency_key(f"tags:{token}").dispatch({}, tags={"k": "v"})
    assert WorkflowRun.objects.get(pk=keyed).tags == {"team": "billing", "region": "eu",
                                                      "k": "v"}
    wait_for(run_id, worker=worker)
    wait_for(keyed, worker=worker)


def test_dispatch__a_bad_tag_is_refused_before_anything_is_written(worker, token):
    name = f"tags_bad_{token}"
    flow = queuety.workflow(name).then(tag_steps.plain)
    for tags, named in (({"customer:id": "1"}, "'customer:id'"), ({"n": 42}, "'n'"),
                        ({"a=b": "1"}, "'a=b'")):
        with pytest.raises(exceptions.InvalidPayload, match=named):
            flow.dispatch({}, tags=tags)
    assert not WorkflowRun.objects.filter(name=name).exists()


def test_start__tags_of_a_registered_workflow(worker, token):
    name = f"tags_reg_{token}"
    queuety.register(name, queuety.workflow(name).with_tags(source="registry")
                     .then(tag_steps.plain))
    try:
        run_id = queuety.start(name, {}, tags={"customer": token})
        assert queuety.workflow_status(run_id).tags == {"source": "registry",
                                                        "customer": token}
        answer = api().post(f"{API}/runs/", {"workflow": name, "payload": {},
                                             "tags": {"customer": "api"}}, format="json")
        assert answer.status_code == 201, answer.content
        assert WorkflowRun.objects.get(pk=answer.json()["run"]["id"]).tags == {
            "source": "registry", "customer": "api"}
        refused = api().post(f"{API}/runs/", {"workflow": name, "tags": {"a:b": "1"}},
                             format="json")
        assert refused.status_code == 400 and "'a:b'" in refused.json()["detail"]
        for falsy in ([], 0, ""):  # not a mapping, however empty: refused, no run written
            before = WorkflowRun.objects.filter(name=name).count()
            refused = api().post(f"{API}/runs/", {"workflow": name, "tags": falsy},
                                 format="json")
            assert refused.status_code == 400 and "mapping" in refused.json()["detail"]
            assert WorkflowRun.objects.filter(name=name).count() == before
        wait_for(run_id, worker=worker)
    finally:
        from queuety import registry
        registry.unregister(name)


def test_context_tag__a_failed_attempt_s_tags_are_not_applied(worker, token):
    run_id = queuety.workflow(f"tags_retry_{token}").then(
        tag_steps.tags_then_fails_once, retry=RETRY_ONCE).dispatch({})
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert status.tags == {"attempt": "2"}


def test_context_tag__a_bad_tag_fails_the_step_naming_the_key(worker, token):
    run_id = queuety.workflow(f"tags_badstep_{token}").then(tag_steps.bad_tag).dispatch({})
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and "'has:colon'" in status.error["message"]
    assert status.tags == {}


def test_rest__tag_filters_all_must_match(tagged_runs, token):
    client = api()
    both = client.get(f"{API}/runs/?tag=customer:{token}&tag=plan:pro").json()
    assert [run["id"] for run in both["results"]] == [tagged_runs["mine_pro"]]
    assert both["results"][0]["tags"]["customer"] == token
    one = client.get(f"{API}/runs/", {"tag": f"customer:{token}"}).json()
    assert [run["id"] for run in one["results"]] == [tagged_runs["mine_free"],
                                                     tagged_runs["mine_pro"]]
    detail = client.get(f"{API}/runs/{tagged_runs['mine_free']}/").json()
    assert detail["tags"]["plan"] == "free"
    for bad, says in (("customer", "not key:value"), ("bad key:1", "'bad key'"),
                      ("plan:pro&tag=plan:free", "two values")):
        answer = client.get(f"{API}/runs/?tag={bad}")
        assert answer.status_code == 400 and says in answer.json()["detail"], answer.content


def test_cli__list_tag_and_status(tagged_runs, token):
    listed = json.loads(cli("workflow", "list", "--tag", f"customer={token}",
                            "--tag", "plan=pro", "--format", "json"))
    assert [run["id"] for run in listed] == [tagged_runs["mine_pro"]]
    table = cli("workflow", "list", "--tag", f"customer={token}")
    assert "Tags" in table.splitlines()[0] and f"customer={token}" in table
    assert str(tagged_runs["other_pro"]) not in table
    shown = cli("workflow", "status", str(tagged_runs["mine_pro"]))
    assert f"Tags:     customer={token}, plan=pro, stage=tagged, team=billing" in shown
    with pytest.raises(CommandError, match="not key=value"):
        cli("workflow", "list", "--tag", "customer")


def test_admin__tag_filter_search_and_run_page(tagged_runs, token, admin_client):
    page = admin_client.get(RUNS, {"tag": f"customer:{token}"})
    assert page.status_code == 200
    shown = {run.pk for run in page.context["cl"].result_list}
    assert shown == {tagged_runs["mine_pro"], tagged_runs["mine_free"]}
    assert f"customer={token}" in page.content.decode()
    searched = admin_client.get(RUNS, {"q": f"customer:x{token}"})
    assert {run.pk for run in searched.context["cl"].result_list} == {tagged_runs["other_pro"]}
    # A hand-edited bad filter: a message saying what is wrong, and the list unfiltered.
    bad = admin_client.get(RUNS, {"tag": "nocolon"})
    assert bad.status_code == 200
    assert "'nocolon' is not key:value" in html.unescape(bad.content.decode())
    assert "shown without the tag filter" in bad.content.decode()
    assert set(tagged_runs.values()) <= {run.pk for run in bad.context["cl"].result_list}
    run_page = admin_client.get(f"{RUNS}{tagged_runs['mine_free']}/change/")
    assert f"customer={token}, plan=free" in run_page.content.decode()


def test_export__tags_round_trip_and_old_documents_still_replay(tagged_runs, token):
    document = queuety.export_workflow(tagged_runs["mine_pro"])
    assert document["run"]["tags"]["customer"] == token
    again = queuety.replay_workflow(json.loads(json.dumps(document)))
    assert WorkflowRun.objects.get(pk=again).tags == document["run"]["tags"]
    del document["run"]["tags"]  # as exported before tags
    older = queuety.replay_workflow(document)
    assert WorkflowRun.objects.get(pk=older).tags == {}
    document["run"]["tags"] = {"bad:key": "1"}
    with pytest.raises(exceptions.WorkflowDefinitionError, match="'bad:key'"):
        queuety.replay_workflow(document)


def test_event_log__tag_filter_cli_and_rest(tagged_runs, token):
    mine = {tagged_runs["mine_pro"], tagged_runs["mine_free"]}
    lines = [json.loads(line) for line in cli(
        "log", "--tag", f"customer={token}", "--json").splitlines()]
    assert lines and {row["run_id"] for row in lines} == mine
    narrowed = [json.loads(line) for line in cli(
        "log", "--tag", f"customer={token}", "--tag", "plan=pro", "--json").splitlines()]
    assert {row["run_id"] for row in narrowed} == {tagged_runs["mine_pro"]}
    answer = api().get(f"{API}/events/?tag=customer:{token}&tag=plan:free").json()
    assert {row["run_id"] for row in answer["results"]} == {tagged_runs["mine_free"]}
    bad = api().get(f"{API}/events/?tag=nocolon")
    assert bad.status_code == 400 and "not key:value" in bad.json()["detail"]
    with pytest.raises(CommandError, match="not key=value"):
        cli("log", "--tag", "nocolon")


def test_dispatch__flow_control_per_key_writes_the_tags_too(worker, token):
    flow = queuety.workflow(f"tags_keyed_{token}").with_tags(team="billing") \
        .then(tag_steps.plain)
    run_id = flow.dispatch({}, key=f"k{token}", singleton=True, tags={"customer": token})
    assert WorkflowRun.objects.get(pk=run_id).tags == {"team": "billing", "customer": token}
    wait_for(run_id, worker=worker)


def test_export__a_run_tagged_past_32_by_its_steps_replays_with_every_tag(worker, token):
    # A dispatch sets at most 32 and a step at most 32 per attempt; their merge can be more,
    # and replay takes what the engine wrote.
    run_id = queuety.workflow(f"tags_many_{token}").then(tag_steps.tags_twenty).dispatch(
        {}, tags={f"given{n}": "y" for n in range(20)})
    assert wait_for(run_id, worker=worker).status == "completed"
    document = queuety.export_workflow(run_id)
    assert len(document["run"]["tags"]) == 40
    again = queuety.replay_workflow(json.loads(json.dumps(document)))
    assert WorkflowRun.objects.get(pk=again).tags == document["run"]["tags"]


def test_rest__an_empty_tag_filter_is_no_filter(tagged_runs, token):
    for path in ("runs", "events"):
        answer = api().get(f"{API}/{path}/?tag=&workflow=tags_{token}")
        assert answer.status_code == 200, answer.content
        assert set(tagged_runs.values()) <= {row.get("run_id", row.get("id"))
                                             for row in answer.json()["results"]}
