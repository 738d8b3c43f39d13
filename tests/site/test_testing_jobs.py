"""``queuety.testing``'s jobs: a site's Django tasks run in the test, with no broker and no
worker, through the code a worker runs (pytest-django's ``db`` fixture)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

import queuety
from queuety.jobs import framework
from queuety.models import StepRun
from queuety.testing import WorkflowDidNotSettle, no_broker, run_jobs, run_task
from tests import job_tasks
from tests.workflows import marks

Status = framework.TaskResultStatus


@pytest.fixture
def token() -> str:
    return uuid.uuid4().hex[:12]


def test_run_task__runs_the_job_to_its_end_and_returns_its_task_result(db, token):
    result = run_task(job_tasks.add, token, 2, b=3)

    assert isinstance(result, framework.TaskResult)
    assert (result.status, result.return_value, result.attempts) == (Status.SUCCESSFUL, 5, 1)
    assert result.task == job_tasks.add and result.errors == []
    assert len(marks(token)) == 1
    # The worker's own code claimed and recorded it: a run like any job's.
    assert queuety.workflow_status(int(result.id)).status == "completed"
    assert list(StepRun.objects.filter(run_id=int(result.id)).values_list(
        "attempt", "status")) == [(1, "completed")]


def test_run_task__runs_the_retries_without_waiting_for_their_back_off(db, token):
    result = run_task(job_tasks.attempts.using(backend="retrying"), token, fail_times=2)

    assert result.status == Status.SUCCESSFUL and result.attempts == 3
    assert result.return_value["attempt"] == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"] * 2


def test_run_task__a_failing_task_is_failed_with_its_error(db, token):
    result = run_task(job_tasks.fails, token)

    assert result.status == Status.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert f"fails was told to fail ({token})" in error.traceback


def test_run_task__a_deferred_task_runs_at_once(db, token):
    later = job_tasks.add.using(run_after=timezone.now() + timedelta(hours=1))
    assert run_task(later, token, 1, b=1).return_value == 2


def test_run_task__refuses_bad_arguments_as_enqueue_does(db, token):
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        run_task(job_tasks.add, token, object(), b=1)
    assert marks(token) == []


def test_run_task__refuses_a_task_on_another_backend_naming_the_fix(db, settings, token):
    settings.TASKS = {**settings.TASKS, "dummy": {
        "BACKEND": f"{framework.SOURCE}.backends.dummy.DummyBackend"}}
    with pytest.raises(TypeError, match=r"backend 'dummy' \(DummyBackend\); point TASKS"):
        run_task(job_tasks.add.using(backend="dummy"), token, 1, b=2)
    assert marks(token) == []


def test_run_jobs__runs_what_the_code_under_test_enqueued_oldest_first(db, token):
    with no_broker():
        first = job_tasks.add.enqueue(token, 1, b=2)
        second = job_tasks.returns_tuple.enqueue(token)
    ran = run_jobs()

    assert [r.id for r in ran] == [first.id, second.id]
    assert [(r.status, r.return_value) for r in ran] == [(Status.SUCCESSFUL, 3),
                                                         (Status.SUCCESSFUL, [1, 2])]
    assert len(marks(token)) == 2
    assert run_jobs() == []  # nothing is left to run


def test_run_jobs__gives_up_on_a_job_that_never_settles(db, token):
    with no_broker():
        job_tasks.attempts.using(backend="retrying").enqueue(token, fail_times=2)
    with pytest.raises(WorkflowDidNotSettle, match="after 1 step attempts"):
        run_jobs(max_steps=1)
