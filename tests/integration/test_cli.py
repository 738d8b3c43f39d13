"""``manage.py queuety workflow status|list`` on real runs."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

import queuety
from tests import workflows
from tests.integration.conftest import ROOT, wait_for

pytestmark = pytest.mark.worker


def run_cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def completed_run(worker, token):
    run_id = (queuety.workflow("cli_ok").then(workflows.step_a).then(workflows.step_b)
              .dispatch({"token": token, "user_id": 42}))
    wait_for(run_id, worker=worker)
    return run_id


@pytest.fixture
def failed_run(worker, token):
    run_id = (queuety.workflow("cli_failing").then(workflows.step_a).then(workflows.boom)
              .dispatch({"token": token, "order": 9}))
    wait_for(run_id, worker=worker)
    return run_id


def test_status__completed_run_prints_the_original_labels(completed_run, token):
    lines = run_cli("workflow", "status", str(completed_run)).splitlines()

    status = queuety.workflow_status(completed_run)
    assert lines[:4] == [
        f"Workflow: cli_ok (#{completed_run})",
        "Status:   completed",
        "Step:     2/2",
        f"Hash:     {status.definition_hash}",
    ]
    assert lines[4] == "State:"
    assert json.loads("\n".join(lines[5:])) == status.state
    assert '    "user_id": 42' in [line.rstrip(",") for line in lines]
    assert not any(line.startswith(("Error:", "StepName:")) for line in lines)


def test_status__failed_run_shows_step_name_and_error(failed_run):
    text = run_cli("workflow", "status", str(failed_run))

    assert "Status:   failed\n" in text
    assert "Step:     1/2\n" in text
    assert "StepName: boom\n" in text
    assert "Error:    ValueError: boom for order 9 (step 'boom', attempt 1/3)\n" in text
    assert "Retry:    max_attempts=3 " in text


def test_status__json_format_is_the_status_object(failed_run):
    data = json.loads(run_cli("workflow", "status", str(failed_run), "--format", "json"))

    assert data["id"] == failed_run and data["status"] == "failed"
    assert data["error"]["type"] == "ValueError" and data["error"]["step"] == "boom"
    assert data == json.loads(json.dumps(queuety.workflow_status(failed_run).to_dict()))


def test_status__unknown_id_is_a_one_line_error_with_exit_code_1(worker):
    result = subprocess.run(
        [sys.executable, "manage.py", "queuety", "workflow", "status", "987654321"],
        cwd=ROOT, capture_output=True, text=True, env=worker.env,  # the test database
    )

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "Error: Workflow #987654321 not found.\n"


def test_list__table_and_json_newest_first(completed_run, failed_run):
    table = run_cli("workflow", "list", "--limit", "2").splitlines()
    assert table[0].split() == ["ID", "Name", "Version", "Hash", "Status", "Step", "StepName"]
    assert table[1].split()[:2] == [str(failed_run), "cli_failing"]
    assert table[1].split()[4:] == ["failed", "1/2", "boom"]
    assert table[2].split()[:2] == [str(completed_run), "cli_ok"]
    assert table[2].split()[4:] == ["completed", "2/2", "-"]

    failed = json.loads(run_cli("workflow", "list", "--status", "failed", "--format", "json"))
    assert failed and all(run["status"] == "failed" for run in failed)
    assert failed_run in [run["id"] for run in failed]
    assert completed_run not in [run["id"] for run in failed]


def test_list__unknown_status_is_refused():
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="Unknown status 'done'; use one of running, "):
        run_cli("workflow", "list", "--status", "done")


def test_approve_reject_input_signal__mirror_the_original(worker, token):
    from django.core.management import CommandError

    run_id = (queuety.workflow("cli_human").wait_for_signal("ready").wait_for_approval()
              .wait_for_decision().wait_for_input(schema={"type": "object"})
              .then(workflows.step_a).dispatch({"token": token}))
    status = run_cli("workflow", "status", str(run_id))
    assert "Waiting:  signal => ready\n" in status and "WaitMode: all\n" in status
    assert '"remaining":["ready"]' in status

    assert run_cli("workflow", "signal", str(run_id), "ready", "--data", '{"a": 1}') == \
        f"Success: Signal 'ready' sent to workflow #{run_id} (completed its wait). " \
        "Status: waiting_for_signal.\n"
    assert run_cli("workflow", "approve", str(run_id), "--data", '{"by": "cli"}').startswith(
        f"Success: Approval sent to workflow #{run_id}.")
    with pytest.raises(CommandError, match="--data must be a JSON object."):
        run_cli("workflow", "reject", str(run_id), "--data", "[1]")
    assert run_cli("workflow", "reject", str(run_id)).startswith(
        f"Success: Rejection sent to workflow #{run_id}.")
    with pytest.raises(CommandError, match="does not match the input schema"):
        run_cli("workflow", "input", str(run_id), "--data", '"text"')
    assert run_cli("workflow", "input", str(run_id), "--data", '{"x": 1}').startswith(
        f"Success: Input sent to workflow #{run_id}.")
    with pytest.raises(CommandError, match=f"Workflow #{98765432} not found."):
        run_cli("workflow", "approve", "98765432")
    final = wait_for(run_id, worker=worker)
    assert final.state["approval"] == {"by": "cli"}
    assert final.state["decision"]["outcome"] == "rejected" and final.state["input"] == {"x": 1}
