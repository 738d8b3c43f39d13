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

import queuety
from queuety.models import WorkflowDefinition, WorkflowRun
from queuety.store.definitions import definition_id
from tests.integration.conftest import ROOT, Worker

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
    assert [(g.step, [c.field for c in g.changes]) for g in by_hash.options_changed] == [
        ("step_b", ["retry"])]


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
    assert [(c.field, c.new) for c in gone.workflow_changes] == [("retry", None)]
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
