"""``manage.py queuety job list|inspect|retry|retry-buried|cancel|bury|purge`` on real jobs:
PostgreSQL and the session's Celery worker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

import queuety
from queuety import signals
from queuety.models import Event, StepRun, WorkflowRun
from tests import job_tasks, workflows
from tests.integration.conftest import ROOT, wait_for
from tests.settings import QUEUETY as TEST_QUEUETY
from tests.workflows import marks

pytestmark = pytest.mark.worker


def run_cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", "job", *args, stdout=out)
    return out.getvalue()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        run_cli(*args)
    return str(caught.value)


def listed(*args: str) -> list[dict]:
    return json.loads(run_cli("list", "--format", "json", "--limit", "500", *args))


def job_scope(user, runs):
    """A QUEUETY["RUN_SCOPE"] for jobs: a user reaches the jobs whose first argument (the
    test's token) is their last name."""
    return runs.filter(state__args__0=user.last_name)


def tenant(token: str) -> User:
    return User.objects.create_user(f"j{uuid.uuid4().hex[:10]}", last_name=token)


def done(result, worker, statuses=("completed", "failed", "cancelled")):
    return wait_for(int(result.id), statuses=statuses, worker=worker)


def test_list__filters_by_task_status_and_queue_newest_first(worker, token):
    ok = job_tasks.add.enqueue(token, 1, b=2)
    bad = job_tasks.fails.enqueue(token)
    waiting = job_tasks.never_consumed.enqueue(token)
    workflow_run = queuety.workflow("jobs_cli_not_a_job").then(workflows.step_a).dispatch(
        {"token": token})
    done(ok, worker), done(bad, worker)

    mine = [job for job in listed() if job["args"][:1] == [token]]
    assert [job["id"] for job in mine] == [int(waiting.id), int(bad.id), int(ok.id)]
    assert workflow_run not in [job["id"] for job in listed()]
    assert {job["id"]: job["status"] for job in mine} == {
        int(ok.id): "SUCCESSFUL", int(bad.id): "FAILED", int(waiting.id): "READY"}
    assert mine[2]["return_value"] == 3 and "return_value" not in mine[1]
    assert mine[1]["buried"] is True and mine[1]["errors"][0]["exception_class_path"] == \
        "builtins.ValueError"

    ids = lambda *args: [job["id"] for job in listed(*args) if job["args"][:1] == [token]]  # noqa: E731
    assert ids("--task", "tests.job_tasks.fails") == [int(bad.id)]
    assert ids("--status", "buried") == [int(bad.id)]
    assert ids("--status", "successful") == [int(ok.id)]
    assert ids("--status", "READY", "--queue", "unconsumed") == [int(waiting.id)]
    assert ids("--queue", "io") == []
    newest, second = listed("--limit", "1"), listed("--limit", "1", "--offset", "1")
    assert len(newest) == len(second) == 1 and newest[0]["id"] > second[0]["id"]

    table = run_cli("list", "--task", "tests.job_tasks.fails", "--limit", "500")
    assert table.splitlines()[0].split() == ["ID", "Task", "Queue", "Status", "Attempts",
                                             "Enqueued_at", "Finished_at"]
    assert any(line.startswith(f"{bad.id} ") and "FAILED (buried)" in line
               for line in table.splitlines())
    assert run_cli("list", "--task", "tests.job_tasks.no_such_task") == "No jobs found.\n"


def test_list__bad_input_is_a_clear_error(worker):
    assert "Unknown job status 'done'; the statuses are READY, RUNNING, SUCCESSFUL" in \
        refused("list", "--status", "done")
    assert "The task filter is blank" in refused("list", "--task", " ")
    assert "--limit must be a whole number of at least 1" in refused("list", "--limit", "0")


def test_inspect__the_result_its_attempts_workers_errors_and_timeline(worker, token):
    bad = job_tasks.fails.enqueue(token)
    done(bad, worker)

    data = json.loads(run_cli("inspect", bad.id, "--format", "json"))
    assert data["id"] == int(bad.id) and data["task"] == "tests.job_tasks.fails"
    assert (data["status"], data["buried"], data["attempts"]) == ("FAILED", True, 1)
    assert len(data["worker_ids"]) == 1 and data["backend"] == "default"
    assert f"fails was told to fail ({token})" in data["errors"][0]["traceback"]
    assert data["run_error"]["type"] == "ValueError"
    kinds = [event["kind"] for event in data["timeline"]]
    assert kinds[0] == "workflow_started" and "step_failed" in kinds

    text = run_cli("inspect", bad.id)
    assert f"Job:      #{bad.id}\n" in text and "Status:   FAILED (buried)\n" in text
    assert f"Attempt error 1: builtins.ValueError: ValueError: fails was told to fail " \
           f"({token})" in text
    assert "Timeline:" in text and "workflow_failed" in text


def test_inspect__a_workflow_run_or_an_unknown_id_is_no_job(worker, token):
    run_id = queuety.workflow("jobs_cli_not_a_job").then(workflows.step_a).dispatch(
        {"token": token})

    for job_id in (run_id, 987654321):
        assert refused("inspect", str(job_id)) .startswith(
            f"Job {job_id} does not exist: no run with that id is a task's job.")
    assert "'abc' is not a job id" in refused("inspect", "abc")


def test_an_error__is_one_line_on_stderr_with_exit_code_1(worker):
    result = subprocess.run(
        [sys.executable, "manage.py", "queuety", "job", "cancel", "987654321"],
        cwd=ROOT, capture_output=True, text=True, env=worker.env)  # the test database

    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("Error: Job 987654321 does not exist: no run with that "
                                    "id is a task's job.")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_retry__a_buried_job_runs_again_from_its_failed_attempt(worker, token):
    job = job_tasks.attempts.enqueue(token, fail_times=1)
    done(job, worker)
    assert job_tasks.attempts.get_result(job.id).status.value == "FAILED"

    assert run_cli("retry", job.id) == f"Success: Job #{job.id} scheduled for retry.\n"
    done(job, worker, statuses=("completed",))

    again = json.loads(run_cli("inspect", job.id, "--format", "json"))
    assert (again["status"], again["buried"], again["attempts"]) == ("SUCCESSFUL", False, 2)
    assert again["return_value"]["attempt"] == 2 and len(marks(token)) == 2
    assert any(e["kind"] == "workflow_retried" and e["data"]["by"] == "manage.py"
               for e in again["timeline"])
    assert refused("retry", job.id) == (
        f"Cannot retry job {job.id}: it is SUCCESSFUL (it completed), and only a buried job "
        "runs again; enqueue its task again for a new job.")


def test_retry__an_unfinished_or_cancelled_job_is_refused(worker, token):
    waiting = job_tasks.never_consumed.enqueue(token)

    assert "it is unfinished (running), and only a buried job runs again" in \
        refused("retry", waiting.id)
    run_cli("cancel", waiting.id)
    assert "it is cancelled, and only a buried job runs again; enqueue its task again" in \
        refused("retry", waiting.id)


def test_retry_buried__every_buried_job_of_a_task(worker, token):
    first, second = job_tasks.fails.enqueue(token), job_tasks.fails.enqueue(token)
    other = job_tasks.attempts.enqueue(token, fail_times=5)
    for job in (first, second, other):
        done(job, worker)

    report = json.loads(run_cli("retry-buried", "--task", "tests.job_tasks.fails",
                                "--format", "json"))

    assert {int(first.id), int(second.id)} <= set(report["retried"])
    assert int(other.id) not in report["retried"] and report["failed"] == []
    for job in (first, second):
        wait_for(int(job.id), statuses=("failed",), worker=worker)
    deadline = time.monotonic() + 30
    while len(marks(token)) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marks(token)) == 5  # each fails job ran twice, the other once
    assert queuety.workflow_status(int(other.id)).status == "failed"
    assert run_cli("retry-buried", "--task", "tests.job_tasks.no_such_task") == \
        "Success: 0 buried job(s) scheduled for retry.\n"


def test_cancel__an_unfinished_job_and_not_a_finished_one(worker, token):
    waiting = job_tasks.never_consumed.enqueue(token)

    assert run_cli("cancel", waiting.id) == f"Success: Job #{waiting.id} cancelled.\n"

    job = json.loads(run_cli("inspect", waiting.id, "--format", "json"))
    assert (job["status"], job["run_status"], job["buried"]) == ("FAILED", "cancelled", False)
    assert refused("cancel", waiting.id) == (
        f"Cannot cancel job {waiting.id}: it is already cancelled. Purge it to delete it.")
    assert marks(token) == []


def test_bury__a_waiting_job_fails_through_the_engine_naming_the_operator(worker, token):
    waiting = job_tasks.never_consumed.enqueue(token)
    failed = []

    def receiver(sender, **kwargs):
        failed.append(kwargs)

    signals.run_failed.connect(receiver)
    try:
        assert run_cli("bury", waiting.id) == f"Success: Job #{waiting.id} buried.\n"
    finally:
        signals.run_failed.disconnect(receiver)

    [sent] = [each for each in failed if each["run_id"] == int(waiting.id)]
    assert sent["workflow"] == "task:tests.job_tasks.never_consumed"
    assert sent["error"]["type"] == "queuety.jobs.operations.JobBuried"
    assert "buried by manage.py while running" in sent["error"]["message"]
    job = json.loads(run_cli("inspect", waiting.id, "--format", "json"))
    assert (job["status"], job["buried"]) == ("FAILED", True)
    assert job["run_error"]["buried_by"] == "manage.py"
    assert [e["data"]["by"] for e in job["timeline"] if e["kind"] == "job_buried"] == \
        ["manage.py"]
    assert not StepRun.objects.filter(run_id=int(waiting.id), status="pending").exists()
    assert int(waiting.id) in [j["id"] for j in listed("--status", "buried")]
    assert refused("bury", waiting.id) == (
        f"Cannot bury job {waiting.id}: it is already buried (failed for good); only an "
        "unfinished job is buried.")
    assert marks(token) == []


def test_bury__a_running_job_discards_its_attempt_and_stays_buried(worker, token):
    job = job_tasks.naps.enqueue(token, 2.0)
    wait_for_mark = time.monotonic() + 30
    while not marks(token) and time.monotonic() < wait_for_mark:
        time.sleep(0.05)
    assert [j["status"] for j in listed("--status", "RUNNING") if j["id"] == int(job.id)] == \
        ["RUNNING"]

    run_cli("bury", job.id)
    time.sleep(3.0)  # the attempt ends meanwhile: its outcome must be discarded

    after = job_tasks.naps.get_result(job.id)
    assert after.status.value == "FAILED" and queuety.workflow_status(int(job.id)).status == \
        "failed"
    assert "return_value" not in WorkflowRun.objects.get(pk=int(job.id)).state
    # And a buried job runs again on retry, to its end this time.
    run_cli("retry", job.id)
    done(job, worker, statuses=("completed",))
    assert job_tasks.naps.get_result(job.id).return_value == "woke"


def test_purge__finished_jobs_by_status_and_age_and_never_a_workflow_run(worker, token):
    old, recent = job_tasks.tidy.enqueue(token), job_tasks.tidy.enqueue(token)
    bad = job_tasks.fails.enqueue(token)
    waiting = job_tasks.never_consumed.enqueue(token)
    workflow_run = queuety.workflow("task:tests.job_tasks.tidy").then(workflows.step_a) \
        .dispatch({"token": token})  # a workflow named like a job, but no job's state
    for job in (old, recent, bad):
        done(job, worker)
    wait_for(workflow_run, worker=worker)
    WorkflowRun.objects.filter(pk=int(old.id)).update(
        finished_at=timezone.now() - timedelta(days=10))

    assert run_cli("purge", "--task", "tests.job_tasks.tidy", "--older-than", "7") == \
        "Success: Purged 1 job(s).\n"
    assert not WorkflowRun.objects.filter(pk=int(old.id)).exists()
    assert not Event.objects.filter(run_id=int(old.id)).exists()
    assert WorkflowRun.objects.filter(pk=int(recent.id)).exists()

    assert run_cli("purge", "--task", "tests.job_tasks.tidy") == "Success: Purged 1 job(s).\n"
    assert WorkflowRun.objects.filter(pk=workflow_run).exists()
    assert run_cli("purge", "--task", "tests.job_tasks.fails", "--status", "successful") == \
        "Success: Purged 0 job(s).\n"
    assert WorkflowRun.objects.filter(pk=int(bad.id)).exists()
    assert "purge deletes finished jobs only, not READY ones" in refused(
        "purge", "--status", "ready")
    assert "--older-than is a number of days" in refused("purge", "--older-than", "-1")
    run_cli("purge", "--task", "tests.job_tasks.never_consumed", "--status", "all")
    assert WorkflowRun.objects.filter(pk=int(waiting.id)).exists()  # unfinished: kept


def test_as_user__only_the_jobs_run_scope_gives_and_run_access_decides(worker, token):
    mine = job_tasks.never_consumed.enqueue(token)
    theirs = job_tasks.never_consumed.enqueue(f"{token}-other")
    user = tenant(token)
    scoped = {**TEST_QUEUETY, "RUN_SCOPE": "tests.integration.test_jobs_cli.job_scope"}

    with override_settings(QUEUETY=scoped):
        assert [job["id"] for job in listed("--as-user", user.username)] == [int(mine.id)]
        assert refused("inspect", theirs.id, "--as-user", user.username).startswith(
            f"Job {theirs.id} does not exist")
        assert refused("bury", theirs.id, "--as-user", user.username).startswith(
            f"Job {theirs.id} does not exist")
        assert run_cli("cancel", mine.id, "--as-user", user.username) == \
            f"Success: Job #{mine.id} cancelled.\n"
        assert run_cli("purge", "--status", "all", "--as-user", user.username) == \
            "Success: Purged 1 job(s).\n"
    assert WorkflowRun.objects.filter(pk=int(theirs.id), status="running").exists()

    denied = {**scoped, "RUN_ACCESS": "tests.workflows.deny_all"}
    with override_settings(QUEUETY=denied):
        theirs_user = tenant(f"{token}-other")
        assert refused("bury", theirs.id, "--as-user", theirs_user.username) == (
            f"User {theirs_user.username!r} may not act on job {theirs.id}: "
            "QUEUETY['RUN_ACCESS'] refuses it. Act as a user it allows.")
        assert listed("--as-user", theirs_user.username) == []
    assert "No user is named 'nobody-here'" in refused("list", "--as-user", "nobody-here")
    run_cli("cancel", theirs.id)
