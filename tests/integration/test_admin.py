"""The Django admin: the runs changelist, the run page and its actions, exports, definitions and
the approvals page, through Django's test client against PostgreSQL and a real worker."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

import queuety
from queuety.admin import display as admin_display
from queuety.admin import filters as admin_filters
from queuety.models import Event, RunStatus, Signal, WorkflowDefinition, WorkflowRun
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

RUNS = "/admin/queuety/workflowrun/"
DEFINITIONS = "/admin/queuety/workflowdefinition/"
SCHEMA = {"type": "object", "required": ["decision", "amount"],
          "properties": {"decision": {"enum": ["approve", "reject"]},
                         "amount": {"type": "integer", "minimum": 0, "maximum": 1000},
                         "comment": {"type": "string"}}}


def make_user(*perms: str, staff: bool = True, superuser: bool = False) -> User:
    user = User.objects.create_user(f"a{uuid.uuid4().hex[:10]}", password="pw", is_staff=staff,
                                    is_superuser=superuser)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)  # fresh permission cache


def client_for(user: User, **options) -> Client:
    client = Client(**options)
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def cancel_leftovers(token):
    """Cancel this test's unfinished runs afterwards, so pages listing every waiting run (here
    and in the API tests) stay short in the session's shared database."""
    yield
    for run_id in (WorkflowRun.objects.filter(state__token=token)
                   .exclude(status__in=["completed", "failed", "cancelled"])
                   .values_list("pk", flat=True)):
        try:
            queuety.cancel(run_id)
        except queuety.InvalidTransition:
            pass  # finished meanwhile


@pytest.fixture
def superuser() -> User:
    return make_user(superuser=True)


@pytest.fixture
def boss(superuser) -> Client:
    return client_for(superuser)


def run_page(run_id: int) -> str:
    return f"{RUNS}{run_id}/change/"


def act(client: Client, run_id: int, action: str, revision: int | None = None, **data):
    if revision is None:
        revision = WorkflowRun.objects.get(pk=run_id).revision
    return client.post(f"{RUNS}{run_id}/act/{action}/", {"revision": revision, **data})


def flash(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def result_ids(response) -> list[int]:
    return [run.pk for run in response.context["cl"].result_list]


def approval_run(token: str, name: str = "approve", **budget) -> int:
    builder = (queuety.workflow(f"adm_{name}_{token}").version("v7")
               .idempotency_key(f"key-{name}-{token}").max_transitions(20))
    if budget:
        builder = builder.max_cost_units(budget["cost"])
    return builder.wait_for_approval().then(workflows.step_a).dispatch({"token": token})


def kinds_and_actors(run_id: int) -> list[tuple[str, str]]:
    return [(e.kind, e.data.get("by") or e.data.get("sent_by") or "")
            for e in Event.objects.filter(run_id=run_id).order_by("pk")]


# -- the runs changelist ----------------------------------------------------------------------

def test_changelist__shows_every_column_for_a_waiting_run(boss, token):
    run_id = approval_run(token, cost=10)
    spec_hash = WorkflowRun.objects.get(pk=run_id).definition.definition_hash

    response = boss.get(RUNS, {"q": f"key-approve-{token}"})

    assert response.status_code == 200
    assert result_ids(response) == [run_id]
    html = response.content.decode()
    for text in ("waiting_for_signal", f"adm_approve_{token}", "v7", spec_hash[:12],
                 f"key-approve-{token}", "wait_for_approval (1/2)", "approval (a person)",
                 "transitions 0/20", "Waiting on a person"):
        assert text in html, text
    assert 'class="queuety-status"' in html  # the coloured status
    paginator = html.split('class="paginator"')[1].split("</p>")[0]
    assert " ".join(paginator.split()).startswith("> 1 workflow run")


def test_changelist__queries_do_not_grow_with_rows_and_nothing_counts_the_whole_table(boss, token):
    def load(count: int) -> list[str]:
        for _ in range(count):
            queuety.workflow(f"adm_rows_{token}_{count}").max_transitions(5).wait_for_signal(
                "go").dispatch({"token": token})
        boss.get(RUNS, {"q": f"adm_rows_{token}_{count}"})  # warms the definition cache
        with CaptureQueriesContext(connection) as queries:
            response = boss.get(RUNS, {"q": f"adm_rows_{token}_{count}"})
        assert len(result_ids(response)) == count
        return [q["sql"] for q in queries.captured_queries]

    few, many = load(2), load(25)

    assert len(few) == len(many)
    whole_table = [sql for sql in many if "COUNT(" in sql.upper() and "WHERE" not in sql.upper()]
    assert whole_table == []
    # The list reads the run row without its state column.
    listing = [sql for sql in many if sql.startswith("SELECT") and "ORDER BY" in sql
               and 'FROM "queuety_workflowrun"' in sql]
    assert listing and all('"queuety_workflowrun"."state"' not in sql for sql in listing)


def test_changelist__big_results_use_the_planner_estimate(boss, token, monkeypatch):
    queuety.workflow(f"adm_estimate_{token}").wait_for_signal("go").dispatch({"token": token})
    exact = boss.get(RUNS, {"q": f"adm_estimate_{token}"})
    assert "about" not in exact.content.decode().split('class="paginator"')[1]

    monkeypatch.setattr(admin_filters.EstimatedCountPaginator, "exact_below", 0)
    with CaptureQueriesContext(connection) as queries:
        estimated = boss.get(RUNS)

    assert estimated.context["cl"].paginator.estimated is True
    assert "about" in estimated.content.decode().split('class="paginator"')[1]
    sql = [q["sql"] for q in queries.captured_queries]
    assert any(s.startswith("EXPLAIN (FORMAT JSON)") for s in sql)
    assert not any("COUNT(" in s.upper() and "queuety_workflowrun" in s for s in sql)


def test_changelist__filters_by_status_name_version_waiting_type_and_definition(boss, worker,
                                                                                token):
    approval = approval_run(token, "filters_a")
    decision = (queuety.workflow(f"adm_filters_{token}").version("v2").wait_for_decision()
                .dispatch({"token": token}))
    needs_input = (queuety.workflow(f"adm_filters_{token}").version("v2")
                   .wait_for_input(schema=SCHEMA).dispatch({"token": token}))
    on_signal = (queuety.workflow(f"adm_filters_{token}").wait_for_signal("go")
                 .dispatch({"token": token}))
    done = queuety.workflow(f"adm_filters_{token}").then(workflows.step_a).dispatch(
        {"token": token})
    wait_for(done, worker=worker)

    def ids(**params):
        response = boss.get(RUNS, {"q": "adm_filters", **params})
        assert response.status_code == 200, params
        return {pk for pk in result_ids(response)} & {approval, decision, needs_input,
                                                       on_signal, done}

    assert ids(status__exact="completed") == {done}
    assert ids(workflow=f"adm_filters_{token}") == {decision, needs_input, on_signal, done}
    assert ids(workflow=f"adm_filters_{token}", version="v2") == {decision, needs_input}
    assert ids(version="v7") >= {approval}
    assert ids(workflow=f"adm_filters_{token}", version="(none)") == {on_signal, done}
    assert ids(waiting="person") == {approval, decision, needs_input}
    assert ids(waiting="approval") == {approval}
    assert ids(waiting="decision") == {decision}
    assert ids(waiting="input") == {needs_input}
    assert ids(waiting="signal") == {on_signal}
    definition = WorkflowRun.objects.get(pk=decision).definition_id
    assert ids(definition=definition) == {decision}
    shown = boss.get(RUNS, {"definition": definition}).content.decode()
    assert f"adm_filters_{token}" in shown and "By definition" in shown


def test_changelist__search_by_id_name_prefix_and_idempotency_key(boss, token):
    first = approval_run(token, "search")
    second = queuety.workflow(f"adm_search2_{token}").wait_for_signal("go").dispatch(
        {"token": token})

    assert result_ids(boss.get(RUNS, {"q": str(first)})) == [first]
    assert result_ids(boss.get(RUNS, {"q": f"#{second}"})) == [second]
    assert result_ids(boss.get(RUNS, {"q": f"key-search-{token}"})) == [first]
    assert result_ids(boss.get(RUNS, {"q": f"adm_search2_{token}"})) == [second]
    assert result_ids(boss.get(RUNS, {"q": f"no-such-{token}"})) == []


def test_changelist__is_read_only(boss, token):
    run_id = approval_run(token, "readonly")
    page = boss.get(RUNS)
    assert boss.get(f"{RUNS}add/").status_code == 403
    assert boss.get(f"{RUNS}{run_id}/delete/").status_code == 403
    assert boss.get(f"{DEFINITIONS}add/").status_code == 403
    actions = [name for name, _ in page.context["action_form"].fields["action"].choices]
    assert "delete_selected" not in actions
    assert {"export_selected", "pause_selected", "cancel_selected"} <= set(actions)
    # The run page has no edit form: posting to it changes nothing.
    before = WorkflowRun.objects.get(pk=run_id)
    boss.post(run_page(run_id), {"status": "completed", "state": "{}"})
    after = WorkflowRun.objects.get(pk=run_id)
    assert (after.status, after.state, after.revision) == (before.status, before.state,
                                                           before.revision)


# -- the run page ------------------------------------------------------------------------------

def test_run_page__status_budget_wait_definition_timeline_state_and_signals(boss, token):
    run_id = (queuety.workflow(f"adm_page_{token}").version("v3").max_transitions(4)
              .max_cost_units(10).wait_for_signals(["a", "b"]).then(workflows.step_a)
              .dispatch({"token": token, "note": "<b>not html</b>"}))
    queuety.signal(run_id, "a", {"from": "test"})
    run = WorkflowRun.objects.get(pk=run_id)

    response = boss.get(run_page(run_id))

    assert response.status_code == 200
    html = response.content.decode()
    for text in (f"Workflow: adm_page_{token} (#{run_id})", "Status:   waiting_for_signal",
                 "Version:  v3", f"Hash:     {run.definition.definition_hash}",
                 "Budget:   ", 'id="budgets"', "max_transitions", "0 / 4", "max_cost_units",
                 'aria-valuenow="0"', "Remaining", "b", 'id="definition-hash"',
                 f"?definition={run.definition_id}", "workflow_started", "signal_received",
                 'id="signals"', "&quot;from&quot;: &quot;test&quot;",
                 "&lt;b&gt;not html&lt;/b&gt;", "Download JSON export", f"revision {run.revision}",
                 'id="action-pause"', 'id="action-cancel"'):
        assert text in html, text
    assert 'id="action-resume"' not in html and 'id="action-retry"' not in html
    assert "<b>not html</b>" not in html  # state is escaped


def test_run_page__describes_every_kind_of_step(boss, token):
    run_id = (queuety.workflow(f"adm_kinds_{token}").wait_for_signal("go")
              .route(workflows.classify, {"small": "step_b", queuety.DEFAULT: "step_c"})
              .then(workflows.step_b).then(workflows.step_c).delay(minutes=5)
              .repeat_until("step_c", "done", max_iterations=3)
              .parallel([workflows.step_a, workflows.StepB])
              .for_each("tasks", workflows.run_task, mode="quorum", quorum=2)
              .wait_for_decision().dispatch({"token": token}))

    html = boss.get(run_page(run_id)).content.decode()

    for text in ("signals: go", "tests.workflows.classify; routes small → step_b, otherwise → "
                 "step_c", "sleep 5 min 0 s", "back to step_c until state[&#x27;done&#x27;] == "
                 "true, at most 3 times", "in parallel: tests.workflows.step_a, "
                 "tests.workflows.StepB", "tests.workflows.run_task for each item of "
                 "state[&#x27;tasks&#x27;], join quorum 2",
                 "decision from a person: approval, rejection (any)"):
        assert text in html, text


def test_run_page__describes_workflow_steps_and_links_related_runs(boss, token):
    child = queuety.workflow(f"adm_child_{token}").wait_for_signal("go")
    dependency = child.dispatch({"token": token})
    run_id = (queuety.workflow(f"adm_tree_{token}")
              .start_workflows("tasks", child, group_key="crew")
              .for_each("tasks", workflows.run_task, max_concurrency=2)
              .wait_for_workflows([dependency], "any")
              .run_workflow("sub", child, retry=queuety.RetryPolicy(max_attempts=2))
              .dispatch({"token": token, "tasks": [{"id": "a", "sleep": 5}]}))
    started = WorkflowRun.objects.get(started_by_id=run_id)

    html = boss.get(run_page(run_id)).content.decode()

    for text in (f"start a adm_child_{token} run per item of state[&#x27;tasks&#x27;] → "
                 "state[&#x27;started_workflow_ids&#x27;], group &#x27;crew&#x27;",
                 "join all, at most 2 at once", f"wait for runs {dependency}: any",
                 "child workflow sub (1 steps); restarted by", 'id="related"',
                 "started by this run", f"#{started.pk}</a>", "crew"):
        assert text in html, text
    child_page = boss.get(run_page(started.pk)).content.decode()
    assert "started it" in child_page and f"adm_tree_{token} #{run_id}</a>" in child_page
    queuety.cancel(run_id)
    queuety.cancel(dependency)


def test_changelist__says_when_a_run_sleeps_in_a_delay(boss, token):
    run_id = (queuety.workflow(f"adm_delay_{token}").delay(minutes=10)
              .then(workflows.step_a).dispatch({"token": token}))
    html = boss.get(RUNS, {"q": str(run_id)}).content.decode()
    assert "a delay of 10 min 0 s" in html


def test_changelist__shows_a_run_whose_definition_no_longer_loads(boss, token):
    # A deploy removed a class its retry policy names: the changelist must still list it (it
    # answered 500 for every page that showed such a run).
    good = queuety.workflow(f"adm_gone_{token}").then(workflows.step_a).build()
    stored = good.to_dict()
    bad = dict(stored, retry={"max_attempts": 1, "initial_delay": 1.0, "backoff_factor": 2.0,
                              "max_delay": 60.0, "jitter": 0.0, "retry_on": ["gone.Module"]})
    ghost = WorkflowDefinition.objects.create(name=f"adm_gone_{token}", definition=bad,
                                              definition_hash="e" * 64)
    run = WorkflowRun.objects.create(definition=ghost, name=f"adm_gone_{token}", total_steps=1,
                                     state={"token": token}, status="failed")

    response = boss.get(RUNS, {"q": str(run.pk)})

    assert response.status_code == 200
    html = response.content.decode()
    assert "definition does not load" in html and "e" * 12 in html


def test_run_page__long_state_is_cut_with_a_link_to_all_of_it(boss, token):
    big = {f"key_{i:04d}": "x" * 40 for i in range(400)}
    run_id = queuety.workflow(f"adm_big_{token}").wait_for_signal("go").dispatch(
        {"token": token, **big})

    cut = boss.get(run_page(run_id)).content.decode()
    whole = boss.get(run_page(run_id), {"state": "all"}).content.decode()

    assert 'id="state-all"' in cut and "key_0399" not in cut
    assert "key_0399" in whole and 'id="state-all"' not in whole


def test_run_page__timeline_is_paginated_newest_page_first(boss, worker, token):
    run_id = (queuety.workflow(f"adm_loop_{token}").then(workflows.counter_loop)
              .dispatch({"token": token}))
    wait_for(run_id, worker=worker)
    total = Event.objects.filter(run_id=run_id).count()
    assert total > 100

    last = boss.get(run_page(run_id))
    first = boss.get(run_page(run_id), {"events": 1})

    assert last.context["events_page"].number == last.context["events_page"].paginator.num_pages
    assert len(first.context["timeline"]) == admin_display.TIMELINE_PAGE_SIZE
    assert first.context["timeline"][0]["event"].kind == "workflow_started"
    assert last.context["timeline"][-1]["event"].kind == "workflow_completed"
    assert f"of {total}" in first.content.decode()


def test_run_page__failed_run_shows_its_error_and_offers_retry(boss, worker, token):
    run_id = queuety.workflow(f"adm_fail_{token}").then(workflows.boom).dispatch(
        {"token": token, "order": 7})
    wait_for(run_id, worker=worker)

    html = boss.get(run_page(run_id)).content.decode()

    assert 'id="error"' in html and "boom for order 7" in html and "ValueError" in html
    assert 'id="action-retry"' in html and 'id="action-cancel"' in html
    assert 'id="action-pause"' not in html


def test_run_page__unknown_run_redirects_with_a_message(boss):
    response = boss.get(run_page(987654321), follow=True)
    assert "Workflow run 987654321 does not exist; it may have been purged." in flash(response)


# -- actions -----------------------------------------------------------------------------------

def test_pause_resume_cancel__each_logged_on_the_timeline_with_the_user(superuser, token):
    client = client_for(superuser)
    run_id = approval_run(token, "ops")
    who = f"admin:{superuser.username}"

    paused = act(client, run_id, "pause")
    assert paused.status_code == 302 and paused.url == run_page(run_id)
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.PAUSED
    page = client.get(run_page(run_id))
    assert f"Run {run_id} was paused: a step in flight finishes, nothing new starts." in \
        flash(page)
    assert 'id="action-resume"' in page.content.decode()

    resumed = client.get(act(client, run_id, "resume").url)
    assert f"Run {run_id} was resumed; it is now waiting_for_signal." in flash(resumed)
    cancelled = client.get(act(client, run_id, "cancel").url)
    assert f"Run {run_id} was cancelled; its compensations, if any, run next." in \
        flash(cancelled)

    assert [(k, by) for k, by in kinds_and_actors(run_id) if by] == [
        ("workflow_paused", who), ("workflow_resumed", who), ("workflow_cancelled", who)]
    assert LogEntry.objects.filter(object_id=str(run_id), user=superuser).count() == 3
    page = client.get(run_page(run_id)).content.decode()
    assert 'id="action-' not in page  # a cancelled run offers nothing


def test_retry__runs_a_failed_run_again(boss, superuser, worker, token):
    run_id = (queuety.workflow(f"adm_retry_{token}").then(workflows.flaky)
              .dispatch({"token": token, "raise": "builtins.ValueError", "fail_times": 1}))
    assert wait_for(run_id, worker=worker).status == "failed"

    response = boss.get(act(boss, run_id, "retry").url)

    assert f"Run {run_id} was scheduled for retry from its failed step." in flash(response)
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed" and status.state["succeeded_on"] == 2
    assert ("workflow_retried", f"admin:{superuser.username}") in kinds_and_actors(run_id)


def test_approve__in_the_admin_completes_the_run(boss, superuser, worker, token):
    run_id = approval_run(token, "ok")

    response = boss.get(act(boss, run_id, "approve", note="looks good").url)

    assert f"Run {run_id} was approved; it is now running." in flash(response)
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert status.state["approval"] == {"by": superuser.username, "note": "looks good"}
    assert Signal.objects.get(run_id=run_id).sent_by == f"admin:{superuser.username}"
    assert ("signal_received", f"admin:{superuser.username}") in kinds_and_actors(run_id)


def test_reject__answers_a_decision(boss, worker, token):
    run_id = (queuety.workflow(f"adm_reject_{token}").wait_for_decision()
              .then(workflows.step_a).dispatch({"token": token}))
    page = boss.get(run_page(run_id)).content.decode()
    assert 'id="action-approve"' in page and 'id="action-reject"' in page

    response = boss.get(act(boss, run_id, "reject", note="no").url)

    assert f"Run {run_id} was rejected; it is now running." in flash(response)
    assert wait_for(run_id, worker=worker).state["decision"]["outcome"] == "rejected"


def test_input__form_from_the_schema_refuses_bad_input_and_accepts_good(boss, worker, token):
    run_id = (queuety.workflow(f"adm_input_{token}").wait_for_input(schema=SCHEMA)
              .then(workflows.step_a).dispatch({"token": token}))
    page = boss.get(run_page(run_id)).content.decode()
    assert 'id="input-form"' in page
    assert '<select id="f-decision" name="decision">' in page
    assert 'type="number"  id="f-amount"' in page and 'id="f-comment"' in page
    assert 'id="action-approve"' not in page

    bad = boss.get(act(boss, run_id, "input", decision="approve", amount="-5").url)
    assert any(m.startswith(f"The data of signal 'input' for run {run_id} does not match")
               and "/amount" in m for m in flash(bad))
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.WAITING_FOR_SIGNAL

    good = boss.get(act(boss, run_id, "input", decision="approve", amount="42",
                        comment="ok").url)
    assert f"Your input was sent to run {run_id}; it is now running." in flash(good)
    assert wait_for(run_id, worker=worker).state["input"] == {
        "decision": "approve", "amount": 42, "comment": "ok"}


def test_input__json_reply_when_the_schema_has_no_simple_form(boss, token):
    run_id = queuety.workflow(f"adm_json_{token}").wait_for_input().dispatch({"token": token})
    assert 'id="reply"' in boss.get(run_page(run_id)).content.decode()

    bad = boss.get(act(boss, run_id, "input", reply="{not json").url)
    good = boss.get(act(boss, run_id, "input", reply='[1, "two"]').url)

    assert any(m.startswith(f"The input for run {run_id} was not sent: The reply is not valid "
                            "JSON") for m in flash(bad))
    assert f"Your input was sent to run {run_id}; it is now completed." in flash(good)
    assert queuety.workflow_status(run_id).state["input"] == [1, "two"]


def test_stale_form__is_refused_and_nothing_changes(boss, token):
    run_id = approval_run(token, "stale")
    seen = WorkflowRun.objects.get(pk=run_id).revision
    queuety.pause(run_id)  # someone else acts meanwhile
    queuety.resume(run_id)

    for action in ("cancel", "approve"):
        response = boss.get(act(boss, run_id, action, revision=seen).url)
        assert (f"Run {run_id} changed since this page was loaded, so nothing was done. Check "
                "its current status and try again.") in flash(response)
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.WAITING_FOR_SIGNAL
    assert not Signal.objects.filter(run_id=run_id).exists()


def test_invalid_action_for_the_status__says_why(boss, worker, token):
    run_id = queuety.workflow(f"adm_done_{token}").then(workflows.step_a).dispatch(
        {"token": token})
    wait_for(run_id, worker=worker)
    response = boss.get(act(boss, run_id, "pause").url)
    assert (f"Cannot pause workflow run {run_id}: it is completed, not running or waiting."
            in flash(response))
    approve = boss.get(act(boss, run_id, "approve").url)
    assert any(f"Run {run_id}" in m and "not waiting" in m for m in flash(approve))


def test_actions__need_post_csrf_and_their_permission(token):
    run_id = approval_run(token, "perms")
    viewer = client_for(make_user("view_workflowrun"))
    signaller = client_for(make_user("view_workflowrun", "signal_workflowrun"))
    operator = client_for(make_user("view_workflowrun", "change_workflowrun"))
    nobody = client_for(make_user())
    outsider = client_for(make_user("view_workflowrun", staff=False))

    view_only = viewer.get(run_page(run_id)).content.decode()
    assert 'id="action-' not in view_only and "Download JSON export" in view_only
    assert act(viewer, run_id, "pause").status_code == 403
    assert act(viewer, run_id, "approve").status_code == 403
    assert act(signaller, run_id, "pause").status_code == 403
    assert act(operator, run_id, "approve").status_code == 403
    assert nobody.get(run_page(run_id)).status_code == 403
    assert act(nobody, run_id, "pause").status_code == 403
    assert outsider.get(run_page(run_id)).status_code == 302  # to the login page
    assert viewer.get(f"{RUNS}{run_id}/act/pause/").status_code == 405
    assert viewer.get(f"{RUNS}{run_id}/act/explode/").status_code == 404

    signaller_page = signaller.get(run_page(run_id)).content.decode()
    assert 'id="action-approve"' in signaller_page and 'id="action-pause"' not in signaller_page
    operator_page = operator.get(run_page(run_id)).content.decode()
    assert 'id="action-pause"' in operator_page and 'id="action-approve"' not in operator_page

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_user(superuser=True))
    revision = WorkflowRun.objects.get(pk=run_id).revision
    assert strict.post(f"{RUNS}{run_id}/act/pause/", {"revision": revision}).status_code == 403
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.WAITING_FOR_SIGNAL
    assert act(operator, run_id, "pause").status_code == 302
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.PAUSED


def test_next__only_redirects_to_this_site(boss, token):
    run_id = approval_run(token, "next")
    evil = act(boss, run_id, "pause", next="https://evil.example.com/")
    assert evil.url == run_page(run_id)
    run_id = approval_run(token, "next2")
    local = act(boss, run_id, "pause", next=f"{RUNS}approvals/")
    assert local.url == f"{RUNS}approvals/"


# -- bulk actions and exports ------------------------------------------------------------------

def test_export__download_button_gives_the_json_document(token):
    run_id = approval_run(token, "export")
    viewer = client_for(make_user("view_workflowrun"))

    response = viewer.get(f"{RUNS}{run_id}/export/")

    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'attachment; filename="queuety-run-{run_id}.json"'
    document = json.loads(response.content)
    assert document["format_version"] == 2 and document["run"]["id"] == run_id
    assert [e["kind"] for e in document["events"]][0] == "workflow_started"
    assert viewer.get(f"{RUNS}987654321/export/").status_code == 404
    assert client_for(make_user()).get(f"{RUNS}{run_id}/export/").status_code == 403


def test_export__bulk_action_gives_json_lines_for_several_runs_and_json_for_one(boss, token):
    first, second = approval_run(token, "bulk1"), approval_run(token, "bulk2")

    several = boss.post(RUNS, {"action": "export_selected", "_selected_action": [first, second]})
    one = boss.post(RUNS, {"action": "export_selected", "_selected_action": [second]})

    assert several["Content-Type"] == "application/x-ndjson"
    lines = b"".join(several.streaming_content).decode().splitlines()
    assert [json.loads(line)["run"]["id"] for line in lines] == [first, second]
    assert one["Content-Type"] == "application/json"
    assert json.loads(one.content)["run"]["id"] == second


def test_bulk_actions__pause_and_cancel_report_what_they_did(superuser, token):
    client = client_for(superuser)
    first, second = approval_run(token, "bp1"), approval_run(token, "bp2")
    queuety.cancel(second)

    paused = client.post(RUNS, {"action": "pause_selected", "_selected_action": [first, second]},
                         follow=True)
    assert f"Run {first} was paused." in flash(paused)
    assert (f"1 run was left as it was: Cannot pause workflow run {second}: it is cancelled, "
            "not running or waiting.") in flash(paused)

    cancelled = client.post(RUNS, {"action": "cancel_selected", "_selected_action": [first]},
                            follow=True)
    assert f"Run {first} was cancelled." in flash(cancelled)
    assert ("workflow_cancelled", f"admin:{superuser.username}") in kinds_and_actors(first)

    viewer = client_for(make_user("view_workflowrun"))
    refused = viewer.post(RUNS, {"action": "cancel_selected", "_selected_action": [first]},
                          follow=True)
    assert "No action selected." in flash(refused)


def test_bulk_actions__refuse_more_than_the_limit(boss, token, monkeypatch):
    monkeypatch.setattr(admin_display, "BULK_LIMIT", 1)
    first, second = approval_run(token, "lim1"), approval_run(token, "lim2")
    response = boss.post(RUNS, {"action": "pause_selected", "_selected_action": [first, second]},
                         follow=True)
    assert ("At most 1 runs can be handled at once; select fewer runs (filter the list "
            "first).") in flash(response)
    assert WorkflowRun.objects.get(pk=first).status == RunStatus.WAITING_FOR_SIGNAL


# -- definitions -------------------------------------------------------------------------------

def test_definitions__name_version_hash_and_run_counts_per_status(boss, token):
    builder = queuety.workflow(f"adm_def_{token}").version("d1").wait_for_signal("go")
    waiting = [builder.dispatch({"token": token, "n": n}) for n in range(3)]
    queuety.cancel(waiting[0])
    definition = WorkflowDefinition.objects.get(name=f"adm_def_{token}")

    listing = boss.get(DEFINITIONS, {"q": f"adm_def_{token}"})
    html = listing.content.decode()

    assert listing.status_code == 200
    for text in (f"adm_def_{token}", "d1", definition.definition_hash[:12],
                 f"?definition={definition.pk}&amp;status__exact=waiting_for_signal",
                 f"?definition={definition.pk}&amp;status__exact=cancelled"):
        assert text in html, text
    row = next(d for d in listing.context["cl"].result_list if d.pk == definition.pk)
    assert row.run_counts == {"waiting_for_signal": 2, "cancelled": 1}

    detail = boss.get(f"{DEFINITIONS}{definition.pk}/change/").content.decode()
    assert definition.definition_hash in detail and "&quot;wait_for_go&quot;" in detail
    # Whoever may see runs may see their definitions.
    viewer = client_for(make_user("view_workflowrun"))
    assert viewer.get(f"{DEFINITIONS}{definition.pk}/change/").status_code == 200


# -- approvals ---------------------------------------------------------------------------------

def test_approvals__every_run_waiting_on_a_person_oldest_first_answerable_inline(boss, worker,
                                                                                 token):
    older = approval_run(token, "apq1")
    decision = (queuety.workflow(f"adm_apq2_{token}").wait_for_decision()
                .then(workflows.step_a).dispatch({"token": token}))
    needs_input = (queuety.workflow(f"adm_apq3_{token}").wait_for_input(schema=SCHEMA)
                   .dispatch({"token": token}))
    on_signal = queuety.workflow(f"adm_apq4_{token}").wait_for_signal("go").dispatch(
        {"token": token})

    page = boss.get(f"{RUNS}approvals/")
    listed = [row["run"].pk for row in page.context["rows"]]
    html = page.content.decode()

    assert page.status_code == 200
    mine = [pk for pk in listed if pk in (older, decision, needs_input, on_signal)]
    assert mine == [older, decision, needs_input]
    assert f'id="approval-{decision}"' in html and "Reject" in html and "Answer…" in html

    answered = boss.post(f"{RUNS}{older}/act/approve/", {
        "revision": WorkflowRun.objects.get(pk=older).revision, "next": f"{RUNS}approvals/"},
        follow=True)
    assert answered.redirect_chain[-1][0] == f"{RUNS}approvals/"
    assert f"Run {older} was approved; it is now running." in flash(answered)
    assert older not in [row["run"].pk for row in answered.context["rows"]]
    assert wait_for(older, worker=worker).status == "completed"

    viewer = client_for(make_user("view_workflowrun"))
    seen = viewer.get(f"{RUNS}approvals/").content.decode()
    assert f'id="approval-{decision}"' in seen and 'class="button q-button q-approve"' not in seen
    assert client_for(make_user()).get(f"{RUNS}approvals/").status_code == 403
