"""Django's tasks framework on Queuety: a task's job on PostgreSQL and the session's real
prefork Celery worker (Django 6.0's django.tasks, or the django-tasks backport on 5.2)."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import queuety
from queuety import publish
from queuety.jobs import framework
from queuety.jobs.enqueue import InvalidTaskArguments
from queuety.models import StepRun, WorkflowRun
from queuety.runtime import attempt
from queuety.webhooks import outbox
from tests import job_tasks
from tests.integration.conftest import wait_for
from tests.workflows import marks

pytestmark = pytest.mark.worker

Status = framework.TaskResultStatus


def finished(result, worker, timeout: float = 30):
    """Wait for the job of ``result`` to finish; return its result, read again."""
    wait_for(int(result.id), timeout=timeout, worker=worker)
    result.refresh()
    return result


def test_enqueue__runs_on_a_worker_and_reads_back_as_the_framework_says(worker, token):
    result = job_tasks.add.enqueue(token, 2, b=3)

    assert result.status == Status.READY and not result.is_finished
    assert result.task == job_tasks.add and (result.args, result.kwargs) == ([token, 2], {"b": 3})
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    finished(result, worker)

    assert result.status == Status.SUCCESSFUL and result.return_value == 5
    assert result.errors == [] and result.attempts == 1
    [worker_id] = result.worker_ids
    assert worker_id.split("/")[-1] == marks(token)[0].split()[0]  # the pool process's pid
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at \
        <= result.finished_at
    again = job_tasks.add.get_result(result.id)
    assert (again.status, again.return_value, again.worker_ids) == (
        Status.SUCCESSFUL, 5, result.worker_ids)
    # async_to_sync: the backend's sync_to_async work runs in this thread (and on its
    # connection), as under an ASGI server's request.
    assert async_to_sync(job_tasks.add.aget_result)(result.id).return_value == 5
    # A job is a run: the workflow tools see it too.
    assert queuety.workflow_status(int(result.id)).state["return_value"] == 5


def test_aenqueue_and_an_async_task__run_on_the_prefork_worker(worker, token):
    result = async_to_sync(job_tasks.async_add.aenqueue)(token, 4, 5)

    assert finished(result, worker).return_value == 9
    assert len(marks(token)) == 1


def test_enqueue_in_a_transaction__reaches_workers_at_commit_and_never_if_rolled_back(
        worker, token):
    before = WorkflowRun.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        job_tasks.add.enqueue(f"{token}-rolled-back", 1, 1)
        raise RuntimeError("the view failed after enqueueing")
    assert WorkflowRun.objects.count() == before

    with transaction.atomic():
        kept = job_tasks.add.enqueue(f"{token}-kept", 1, 1)
        time.sleep(1.0)  # a worker would have run it by now, had the message gone out
        assert marks(f"{token}-kept") == []

    assert finished(kept, worker).return_value == 2
    time.sleep(0.5)
    assert marks(f"{token}-rolled-back") == []


def test_a_raising_task__fails_with_its_error_and_no_retry_by_default(worker, token):
    result = finished(job_tasks.fails.enqueue(token), worker)

    assert result.status == Status.FAILED and result.is_finished
    [error] = result.errors
    assert error.exception_class is ValueError
    assert f"fails was told to fail ({token})" in error.traceback
    assert "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    assert len(marks(token)) == 1 and result.attempts == 1


def test_backend_options__retry_each_attempt_sees_its_context(worker, token):
    result = job_tasks.attempts.using(backend="retrying").enqueue(token, fail_times=2)

    finished(result, worker)

    assert result.status == Status.SUCCESSFUL, result.errors
    assert result.return_value == {"attempt": 3, "id": result.id, "workers": 3}
    assert [error.exception_class for error in result.errors] == [ConnectionError] * 2
    assert result.attempts == 3 and len(marks(token)) == 3
    assert result.backend == "retrying"


def test_job_options__a_timeout_interrupts_the_task(worker, token):
    started = time.monotonic()
    result = finished(job_tasks.sleeps.enqueue(token, 5.0), worker)

    assert result.status == Status.FAILED
    assert result.errors[0].exception_class is queuety.StepTimeout
    assert time.monotonic() - started < 4.5


def test_task_class_options__a_timeout_given_to_the_task_itself(worker, token):
    result = finished(job_tasks.sleeps_briefly.enqueue(token, 5.0), worker)

    assert result.status == Status.FAILED
    assert result.errors[0].exception_class is queuety.StepTimeout
    assert result.task.timeout == 0.5  # kept by .using(), as the framework's fields are


def test_run_after__held_in_the_database_until_due(worker, token):
    # Beyond QUEUETY["MAX_ETA"] (5 s in the tests): no message until the sweeper sends it.
    due = timezone.now() + timedelta(seconds=6)
    result = job_tasks.add.using(run_after=due).enqueue(token, 1, 2)
    row = StepRun.objects.get(run_id=int(result.id))
    assert row.published_at is None
    assert due <= row.available_at < due + timedelta(seconds=0.5)

    time.sleep(3)
    result.refresh()
    assert result.status == Status.READY and marks(token) == []
    finished(result, worker)

    assert result.return_value == 3 and result.started_at >= due
    assert result.task.run_after == due


def test_priority__a_positive_priority_runs_as_high_a_negative_as_low(worker, token):
    with publish.captured() as sent:
        job_tasks.urgent.enqueue(token)
        job_tasks.add.using(priority=-5).enqueue(token, 1, 1)
        job_tasks.add.enqueue(token, 1, 1)
    assert [message.priority for message in sent] == ["high", "low", None]

    result = finished(job_tasks.urgent.enqueue(token), worker)
    assert result.return_value == "urgent" and result.task.priority == 10


def test_return_values__made_json_as_the_framework_does_or_the_job_fails(worker, token):
    assert finished(job_tasks.returns_tuple.enqueue(token), worker).return_value == [1, 2]

    bad = finished(job_tasks.returns_object.enqueue(token), worker)
    assert bad.status == Status.FAILED
    assert issubclass(bad.errors[0].exception_class, TypeError)
    assert issubclass(bad.errors[0].exception_class, queuety.PermanentError)  # never retried
    assert "cannot be stored as JSON" in bad.errors[0].traceback


def test_sigkill_mid_job__recovered_and_run_again_once(worker, token):
    result = job_tasks.hang_first_time.enqueue(token)
    deadline = time.monotonic() + 30
    while not marks(token):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    victim = int(marks(token)[0].split()[0])

    os.kill(victim, signal.SIGKILL)
    finished(result, worker, timeout=60)

    assert result.status == Status.SUCCESSFUL and result.return_value != victim
    assert len(marks(token)) == 2 and result.attempts == 2
    assert result.errors[0].exception_class is queuety.WorkerLost
    assert result.worker_ids[0].endswith(f"/{victim}")


def test_bad_input__refused_with_a_clear_error_and_nothing_enqueued(token):
    before = WorkflowRun.objects.count()

    with pytest.raises(InvalidTaskArguments, match="cannot be stored as JSON") as caught:
        job_tasks.add.enqueue(token, object(), 1)
    assert isinstance(caught.value, TypeError)  # as the framework's own backends raise
    with pytest.raises(framework.InvalidTask, match="in the past"):
        job_tasks.add.using(run_after=timezone.now() - timedelta(minutes=5)).enqueue(token, 1, 1)
    with pytest.raises(framework.InvalidTask, match="QUEUES"):
        job_tasks.add.using(queue_name="nowhere")
    with pytest.raises(framework.InvalidTask, match="module level"):
        framework.task_backends["default"].validate_task(
            job_tasks.add.using().__class__(
                priority=0, func=lambda: None, backend="default", queue_name="default",
                run_after=None))

    assert WorkflowRun.objects.count() == before
    assert marks(token) == []


def test_get_result__of_no_job_is_task_result_does_not_exist(token):
    workflow_run = queuety.workflow("not_a_job").then("tests.workflows.step_a").dispatch(
        {"token": token})
    backend = framework.task_backends["default"]

    for missing in (str(workflow_run), "999999999", "abc", "-1"):
        with pytest.raises(framework.TaskResultDoesNotExist):
            backend.get_result(missing)


def test_enqueue_and_a_noop_job__statements_pinned(token, monkeypatch):
    # Measured in this process: enqueue is the one-statement dispatch; the job's attempt is
    # the claim and the transition (no wait named the job: its waiters are not read).
    job_tasks.add.enqueue(token, 0, 0)  # the definition row, once per process
    monkeypatch.setattr(outbox, "CACHE_SECONDS", 3600.0)
    outbox.forget()
    from queuety import signals

    signals.sinks_want("run_started")
    with publish.captured() as sent:
        with CaptureQueriesContext(connection) as enqueued:
            result = job_tasks.add.enqueue(token, 1, 1)
        with CaptureQueriesContext(connection) as ran:
            attempt.execute_step(sent[-1].step_run_id, inline=False)

    assert [q["sql"].split()[0] for q in enqueued.captured_queries] == ["WITH"]
    assert [q["sql"].split()[0] for q in ran.captured_queries] == ["UPDATE", "WITH"]
    assert job_tasks.add.get_result(result.id).return_value == 2


def test_unique_jobs__32_concurrent_enqueues_of_one_key_make_one_job(worker, token):
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    barrier = Barrier(32)

    def enqueue(_):
        barrier.wait()
        try:
            return job_tasks.charge_once.enqueue(token, 7).id
        finally:
            connection.close()

    with ThreadPoolExecutor(32) as pool:
        ids = set(pool.map(enqueue, range(32)))

    assert len(ids) == 1
    [job_id] = ids
    assert finished(job_tasks.charge_once.get_result(job_id), worker).return_value == 7
    assert len(marks(token)) == 1
    # Another key is another job; the same key later is still that job.
    assert job_tasks.charge_once.enqueue(token, 8).id != job_id
    assert job_tasks.charge_once.enqueue(token, 7).id == job_id


def test_unique_jobs__the_key_is_free_again_after_unique_for(worker, token):
    first = job_tasks.refresh_cache.enqueue(token)
    assert job_tasks.refresh_cache.enqueue(token).id == first.id
    time.sleep(1.2)  # unique_for=1.0

    later = job_tasks.refresh_cache.enqueue(token)

    assert later.id != first.id
    finished(first, worker)
    finished(later, worker)
    assert len(marks(token)) == 2


def test_unique_jobs__a_key_whose_job_was_purged_starts_a_new_job(worker, token):
    first = finished(job_tasks.charge_once.enqueue(token, 9), worker)
    WorkflowRun.objects.filter(pk=int(first.id)).delete()  # as retention or job purge does

    again = job_tasks.charge_once.enqueue(token, 9)

    assert again.id != first.id
    assert finished(again, worker).return_value == 9


def test_get_result__of_another_backends_job_names_that_backend(worker, token):
    result = job_tasks.add.using(backend="retrying").enqueue(token, 1, 1)

    assert result.task.get_result(result.id).backend == "retrying"
    with pytest.raises(framework.TaskResultDoesNotExist, match="'retrying', not 'default'"):
        framework.task_backends["default"].get_result(result.id)


def test_cancel__a_deferred_job_is_failed_and_never_runs(worker, token):
    result = job_tasks.add.using(run_after=timezone.now() + timedelta(seconds=2)).enqueue(
        token, 1, 1)

    queuety.cancel(int(result.id))
    time.sleep(3)
    result.refresh()

    assert result.status == Status.FAILED and result.errors == []
    assert marks(token) == []


def test_a_job_a_workflow_waits_for__reads_its_waiters_and_wakes_them(worker, token,
                                                                       monkeypatch):
    monkeypatch.setattr(outbox, "CACHE_SECONDS", 3600.0)
    outbox.forget()
    from queuety import signals

    signals.sinks_want("run_started")
    with publish.captured() as sent:  # the job waits in the test's hands
        job = job_tasks.add.enqueue(token, 1, 2)
    waiter = queuety.workflow("waits_for_a_job").wait_for_workflow(int(job.id)).dispatch(
        {"token": token})
    wait_for(waiter, statuses=("waiting_for_workflows",), worker=worker)
    assert WorkflowRun.objects.get(pk=int(job.id)).awaited

    with CaptureQueriesContext(connection) as ran:
        attempt.execute_step(sent[-1].step_run_id, inline=False)

    # The completing statement saw the wait's mark: the waiters are read, and woken.
    assert [q["sql"].split()[0] for q in ran.captured_queries] == ["UPDATE", "WITH", "SELECT"]
    assert wait_for(waiter, worker=worker).status == "completed"
