"""Definition diffs on stored definitions, on PostgreSQL: queuety.diff_definitions() by hash,
prefix and id, ``manage.py queuety workflow diff``, and the admin's definition page (the diff
against the previous definition, and the drain view). No worker: the runs are rows."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

import queuety
from queuety.models import WorkflowDefinition, WorkflowRun
from queuety.store.definitions import definition_id
from tests.integration.conftest import ROOT, Worker
from tests.integration.test_admin import DEFINITIONS, client_for, make_user

W = "tests.workflows"


def stored(builder: queuety.WorkflowBuilder) -> WorkflowDefinition:
    return WorkflowDefinition.objects.get(pk=definition_id(builder.build()))


def versions(token: str) -> tuple[WorkflowDefinition, WorkflowDefinition]:
    """Two definitions of one workflow: v2 retries step_b harder and adds step_c."""
    name = f"diff_{token}"
    old = stored(queuety.workflow(name).version("v1").then(f"{W}.step_a").then(f"{W}.step_b"))
    new = stored(queuety.workflow(name).version("v2").then(f"{W}.step_a")
                 .then(f"{W}.step_b", retry=queuety.RetryPolicy(max_attempts=5))
                 .then(f"{W}.step_c"))
    return old, new


def add_runs(definition: WorkflowDefinition, *statuses: str) -> None:
    WorkflowRun.objects.bulk_create(
        WorkflowRun(definition=definition, name=definition.name, total_steps=2, status=status)
        for status in statuses)


@pytest.fixture(autouse=True)
def remove_runs(token):
    """Delete this test's run rows afterwards: "running" rows no worker will ever touch would
    otherwise count in every later test that counts live runs."""
    yield
    WorkflowRun.objects.filter(name__contains=token).delete()


def run_cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


# -- queuety.diff_definitions() ----------------------------------------------------------------

def test_diff_definitions__by_hash_prefix_and_id_give_the_same_diff(token):
    old, new = versions(token)

    by_hash = queuety.diff_definitions(old.definition_hash, new.definition_hash)
    by_prefix = queuety.diff_definitions(old.definition_hash[:8], new.definition_hash[:12])
    by_id = queuety.diff_definitions(old.pk, str(new.pk))

    assert by_hash == by_prefix == by_id
    assert (by_hash.old.id, by_hash.new.id) == (old.pk, new.pk)
    assert (by_hash.old.hash, by_hash.new.hash) == (old.definition_hash, new.definition_hash)
    assert [(c.field, c.old, c.new) for c in by_hash.workflow_changes] == [
        ("version", "v1", "v2")]
    assert [e.step for e in by_hash.steps_added] == ["step_c"]
    assert [(g.step, [(c.field, c.old, c.new) for c in g.changes])
            for g in by_hash.options_changed] == [
        ("step_b", [("retry.backoff_factor", None, 2.0), ("retry.initial_delay", None, 1.0),
                    ("retry.jitter", None, 0.1), ("retry.max_attempts", None, 5),
                    ("retry.max_delay", None, 60.0)])]


def test_diff_definitions__unknown_refs_raise_unknown_definition_naming_them(token):
    old, _ = versions(token)

    with pytest.raises(queuety.UnknownDefinition, match="No workflow definition has the id "
                                                        "or hash 'ffffffff0000'") as caught:
        queuety.diff_definitions(old.pk, "ffffffff0000")
    assert caught.value.ref == "ffffffff0000"
    with pytest.raises(queuety.UnknownDefinition, match="'abc' is neither a definition id "
                                                        "nor a hash"):
        queuety.diff_definitions("abc", old.pk)
    with pytest.raises(queuety.UnknownDefinition, match="987654"):
        queuety.diff_definitions(old.pk, 987654)


def test_diff_definitions__of_two_workflows_and_of_one_that_no_longer_loads(token):
    old, _ = versions(token)
    other = stored(queuety.workflow(f"diff_other_{token}").then(f"{W}.step_a"))
    # A deploy removed the class its retry policy names: it no longer loads as a spec.
    ghost = WorkflowDefinition.objects.create(
        name=old.name, definition_hash=f"{token}{'e' * 52}",
        definition={**old.definition, "retry": {
            "max_attempts": 1, "initial_delay": 1.0, "backoff_factor": 2.0,
            "max_delay": 60.0, "jitter": 0.0, "retry_on": ["gone.Module"]}})

    across = queuety.diff_definitions(old.pk, other.pk)
    gone = queuety.diff_definitions(ghost.pk, old.pk)

    assert not across.same_workflow
    assert f"two different workflows, {old.name!r} and {other.name!r}" in across.to_text()
    assert [e.step for e in across.steps_removed] == ["step_b"]
    assert [(c.field, c.new) for c in gone.workflow_changes] == [
        ("retry.backoff_factor", None), ("retry.initial_delay", None), ("retry.jitter", None),
        ("retry.max_attempts", None), ("retry.max_delay", None), ("retry.retry_on", None)]
    assert gone.old.hash == ghost.definition_hash


# -- manage.py queuety workflow diff -------------------------------------------------------------

def test_cli_diff__text_and_json(token):
    old, new = versions(token)

    text = run_cli("workflow", "diff", str(old.pk), new.definition_hash[:10])
    data = json.loads(run_cli("workflow", "diff", old.definition_hash, str(new.pk), "--json"))

    lines = text.splitlines()
    assert lines[0] == (f"From: definition {old.pk} of {old.name!r} (version 'v1', hash "
                        f"{old.definition_hash[:12]})")
    assert lines[1].startswith(f"To:   definition {new.pk} of {new.name!r} (version 'v2'")
    for line in ("Workflow:", '  version: "v1" → "v2"', "Steps added:",
                 "  + step_c (task) at position 2", "Options changed:", "  step_b:"):
        assert line in lines, line
    assert data == json.loads(json.dumps(queuety.diff_definitions(old.pk, new.pk).to_dict()))
    assert data["steps_added"] == [{"step": "step_c", "kind": "task", "position": 2}]
    assert run_cli("workflow", "diff", str(old.pk), str(old.pk)).endswith(
        "No differences: the definitions are identical.\n")


def test_cli_diff__an_unknown_hash_is_a_one_line_error_with_exit_code_1(token, tmp_path):
    old, _ = versions(token)
    with pytest.raises(CommandError, match="No workflow definition has the id or hash "
                                           "'0000ffff0000'"):
        run_cli("workflow", "diff", str(old.pk), "0000ffff0000")

    result = subprocess.run(
        [sys.executable, "manage.py", "queuety", "workflow", "diff", str(old.pk), "0000ffff0000"],
        cwd=ROOT, capture_output=True, text=True,
        env=Worker(tmp_path).env)  # the test database (no worker is started)

    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        "Error: No workflow definition has the id or hash '0000ffff0000'; list them with "
        "'manage.py queuety workflow definitions' (or the admin's Workflow definitions).\n")


# -- the admin's definition page and changelist ----------------------------------------------------

LIVE = ("running", "waiting_for_signal", "waiting_for_workflows", "paused")


@pytest.fixture
def boss():
    return client_for(make_user(superuser=True))


def drain_row(html: str, definition: WorkflowDefinition) -> str:
    """The drain table's row of ``definition``: from its hash cell to the end of the row."""
    row = html.split(f'<code title="{definition.definition_hash}">')[-1]
    return row.split("</tr>")[0]


def test_definition_page__shows_the_diff_against_the_previous_definition(boss, token):
    old, new = versions(token)
    first = boss.get(f"{DEFINITIONS}{old.pk}/change/").content.decode()
    page = boss.get(f"{DEFINITIONS}{new.pk}/change/").content.decode()

    assert "First definition of this workflow." in first
    assert (f'Against <a href="{DEFINITIONS}{old.pk}/change/">definition {old.pk} of '
            f"&#x27;{old.name}&#x27; (version &#x27;v1&#x27;, hash {old.definition_hash[:12]})"
            "</a>, the previous definition of this workflow:") in page
    table = page.split('<table class="queuety-diff">')[1].split("</table>")[0]
    for row in ("<td>workflow</td><td></td><td><code>version</code></td>"
                "<td><code>&quot;v1&quot;</code></td><td><code>&quot;v2&quot;</code></td>",
                "<td>added</td><td>step_c</td><td><code></code></td><td><code></code></td>"
                "<td><code>task step at position 2</code></td>",
                "<td>option</td><td>step_b</td><td><code>retry.max_attempts</code></td>"
                "<td><code>unset</code></td><td><code>5</code></td>"):
        assert row in table, row
    assert "First definition" not in page


def test_definition_page__lists_the_workflows_definitions_with_live_and_total_runs(boss,
                                                                                  token):
    old, new = versions(token)
    newest = stored(queuety.workflow(old.name).version("v3").then(f"{W}.step_a"))
    add_runs(old, "completed", "failed", "cancelled")
    add_runs(new, *LIVE, "completed")

    page = boss.get(f"{DEFINITIONS}{new.pk}/change/").content.decode()

    drained, live, empty = (drain_row(page, each) for each in (old, new, newest))
    assert f"<td>0</td><td><a href=\"/admin/queuety/workflowrun/?definition={old.pk}\">3</a>" \
        in drained and "drained: its code can go" in drained
    assert f"<td>4</td><td><a href=\"/admin/queuety/workflowrun/?definition={new.pk}\">5</a>" \
        in live and "drained" not in live
    # The newest definition is what new runs get: without runs it is not drained.
    assert "<td>0</td>" in empty and "<td>newest</td>" in empty and "drained" not in empty
    assert f'<a href="{DEFINITIONS}{old.pk}/change/">{old.pk}</a>' in page
    assert f"<strong>{new.pk} (this page)</strong>" in page
    assert page.index(f">{newest.pk}</a>") < page.index(f">{new.pk} (this page)") \
        < page.index(f">{old.pk}</a>")  # newest first


def test_changelist__live_runs_column_from_the_one_grouped_query(boss, token):
    old, new = versions(token)
    add_runs(old, "completed")
    add_runs(new, "running", "paused", "failed")

    def listing(search: str):
        with CaptureQueriesContext(connection) as queries:
            response = boss.get(DEFINITIONS, {"q": search})
        return response, len(queries)

    response, many = listing(f"diff_{token}")
    _, one = listing(old.definition_hash)

    rows = {d.pk: d for d in response.context["cl"].result_list}
    assert set(rows) == {old.pk, new.pk}
    html = response.content.decode()
    assert '<th scope="col" class="column-live_runs">' in html
    assert '<td class="field-live_runs">2</td>' in html
    assert '<td class="field-live_runs">0 <span title="No live run' in html
    assert html.count("(drained: its code can go)") == 1
    assert many == one  # no query per row
