"""Chains of tasks (and the job layer's other compositions) on PostgreSQL and the session's
real prefork Celery worker."""

from __future__ import annotations

import os
import signal
import time

import pytest

import queuety
from queuety.jobs import batches, chains, framework
from queuety.jobs.enqueue import InvalidTaskArguments
from queuety.models import WorkflowRun
from tests import job_tasks
from tests.integration.conftest import wait_for
from tests.workflows import marks

pytestmark = pytest.mark.worker


def texts(token: str) -> list[str]:
    """What was marked under ``token``, without the pids."""
    return [line.split(" ", 1)[1] for line in marks(token)]


def wait_marked(token: str, text: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while not any(line.endswith(text) for line in marks(token)):
        assert time.monotonic() < deadline, f"nothing marked {text!r} under {token}"
        time.sleep(0.05)
    return marks(token)


# -- chains -------------------------------------------------------------------------------------

def test_chain__each_task_gets_the_previous_return_value_in_order(worker, token):
    result = queuety.chain(job_tasks.chain_start, job_tasks.chain_double,
                           job_tasks.chain_double).enqueue(token, 2)

    assert (result.status, result.done, result.total) == ("running", 0, 3)
    wait_for(int(result.id), worker=worker)
    result = result.refresh()

    assert result.status == "completed" and result.is_finished
    assert result.return_value == {"token": token, "n": 12}        # (2 + 1) * 2 * 2
    assert [r["n"] for r in result.results] == [3, 6, 12] and result.done == 3
    assert texts(token) == ["start", "double", "double"]
    status = queuety.workflow_status(int(result.id))
    assert status.name == "chain:tests.job_tasks.chain_start+2"
    assert status.total_steps == 3


def test_chain__an_async_link_runs_in_its_place(worker, token):
    result = queuety.chain(job_tasks.chain_start, job_tasks.chain_double_async,
                           job_tasks.chain_double).enqueue(token, 4)

    wait_for(int(result.id), worker=worker)
    result = result.refresh()

    assert result.status == "completed"
    assert [r["n"] for r in result.results] == [5, 10, 20]
    assert texts(token) == ["start", "adouble", "double"]


def test_chain__stops_at_the_first_failure_and_enqueues_catch_once(worker, token):
    result = queuety.chain(job_tasks.chain_start, job_tasks.chain_fails,
                           job_tasks.chain_double, catch=job_tasks.chain_catch
                           ).enqueue(token, 1)

    wait_for(int(result.id), worker=worker)
    result = result.refresh()
    assert result.status == "failed" and result.done == 1
    assert result.error["type"] == "ValueError"
    with pytest.raises(ValueError, match=f"Chain {result.id} has not completed"):
        _ = result.return_value
    wait_marked(token, f"catch {result.id} ValueError")
    time.sleep(1)  # time for a second catch, were there one
    assert texts(token) == ["start", "fails", f"catch {result.id} ValueError"]


def test_chain__a_link_retries_by_its_backends_job_options(worker, token):
    retrying = job_tasks.chain_flaky.using(backend="retrying")
    result = queuety.chain(job_tasks.chain_start, retrying).enqueue(token, 0)

    wait_for(int(result.id), worker=worker)
    result = result.refresh()
    assert result.status == "completed" and result.return_value["flaky"] == 3
    assert texts(token) == ["start", "flaky", "flaky", "flaky"]


def test_chain__sigkill_mid_chain_resumes_at_its_link_each_side_effect_once(worker, token):
    result = queuety.chain(job_tasks.chain_start, job_tasks.chain_hang_first_time,
                           job_tasks.chain_double).enqueue(token, 1)
    [line] = [m for m in wait_marked(token, "hang") if m.endswith(" hang")]
    victim = int(line.split()[0])

    os.kill(victim, signal.SIGKILL)
    wait_for(int(result.id), timeout=60, worker=worker)
    result = result.refresh()

    assert result.status == "completed" and result.return_value["n"] == (2 + 100) * 2
    # The link that succeeded before the kill never ran again; the killed one ran twice (at
    # least once, recorded once); the one after it once.
    assert texts(token) == ["start", "hang", "hang", "double"]
    hang_pids = [int(m.split()[0]) for m in marks(token) if m.endswith(" hang")]
    assert hang_pids[0] == victim and hang_pids[1] != victim


def test_chain__cancel_stops_it_and_later_tasks_never_run(worker, token):
    result = queuety.chain(job_tasks.chain_start, job_tasks.chain_sleep,
                           job_tasks.chain_double).enqueue(token, 1)
    wait_marked(token, "sleep")

    result.cancel()
    time.sleep(2.5)  # the sleeping link returns after 1.5 s
    result = result.refresh()

    assert result.status == "cancelled" and result.done == 1
    assert "double" not in texts(token)
    with pytest.raises(queuety.InvalidTransition):
        result.cancel()


def test_chain__bad_input_is_refused_and_nothing_enqueued(token):
    before = WorkflowRun.objects.count()

    with pytest.raises(InvalidTaskArguments, match="chain_start cannot be stored as JSON"):
        queuety.chain(job_tasks.chain_start, job_tasks.chain_double).enqueue(token, object())
    with pytest.raises(framework.InvalidTask, match="'nowhere', which the tasks backend"):
        queuety.chain(job_tasks.chain_start,
                      job_tasks.chain_double.using(queue_name="nowhere")).enqueue(token, 1)
    with pytest.raises(TypeError, match="takes tasks"):
        queuety.chain(job_tasks.chain_start, job_tasks.not_a_task)
    with pytest.raises(TypeError, match="takes a context"):
        queuety.chain(job_tasks.attempts)
    with pytest.raises(TypeError, match="at least one task"):
        queuety.chain()
    assert WorkflowRun.objects.count() == before
    with pytest.raises(chains.ChainNotFound, match="is not a chain"):
        queuety.chain(job_tasks.chain_start).get_result(
            job_tasks.add.enqueue(token, 1, 2).id)
    with pytest.raises(chains.ChainNotFound, match="No chain has id '999999999'"):
        chains.Chain.get_result("999999999")
    with pytest.raises(chains.ChainNotFound, match="'x' is not a chain's id"):
        chains.Chain.get_result("x")


# -- batches ------------------------------------------------------------------------------------

CALLBACKS = {"then": job_tasks.batch_then, "catch": job_tasks.batch_catch,
             "finally_": job_tasks.batch_finally}


def callback_marks(batch_id: str, count: int, timeout: float = 30) -> list[str]:
    """The callbacks batch ``batch_id`` ran, once ``count`` of them ran (and a moment more, to
    see one that should not have)."""
    deadline = time.monotonic() + timeout
    while len(texts(f"batch-{batch_id}")) < count:
        assert time.monotonic() < deadline, f"batch {batch_id}: {texts(f'batch-{batch_id}')}"
        time.sleep(0.05)
    time.sleep(1)
    return texts(f"batch-{batch_id}")


def test_batch__every_job_succeeds_then_and_finally_run_once(worker, token):
    result = queuety.batch([(job_tasks.batch_item, [token, i]) for i in range(3)]
                           + [(job_tasks.batch_item, [token], {"index": 3})],
                           **CALLBACKS).enqueue()
    assert (result.total, result.done, result.pending, result.progress) == (4, 0, 4, 0)

    wait_for(int(result.id), worker=worker)
    result = result.refresh()

    assert result.status == "completed" and result.is_finished and not result.cancelled
    assert (result.done, result.failed, result.pending, result.progress) == (4, 0, 0, 100)
    assert sorted(texts(token)) == [f"item {i}" for i in range(4)]
    assert [job_tasks.batch_item.get_result(i).return_value for i in result.job_ids] == [
        0, 1, 2, 3]
    assert callback_marks(result.id, 2) == [
        "then done=4 failed=0 cancelled=False", "finally done=4 failed=0 cancelled=False"]


def test_batch__concurrent_failures_run_catch_once_at_the_first_and_finally_once(
        worker, token):
    items = [(job_tasks.batch_item, [token, i], {"fail": i % 3 != 0}) for i in range(6)]
    # The last job outlasts the failures: catch must not wait for it.
    items.append((job_tasks.batch_item, [token, 6], {"sleep": 3}))
    result = queuety.batch(items, **CALLBACKS).enqueue()

    seen = callback_marks(result.id, 1, timeout=30)
    assert len(seen) == 1, seen
    [catch] = seen
    assert catch.startswith("catch ")
    assert not queuety.workflow_status(int(result.id)).status == "completed"
    wait_for(int(result.id), worker=worker)
    result = result.refresh()

    assert (result.done, result.failed) == (3, 4) and len(result.failed_job_ids) == 4
    assert callback_marks(result.id, 2) == [catch, "finally done=3 failed=4 cancelled=False"]


def test_batch__cancel_cancels_its_jobs_and_runs_finally_once(worker, token):
    items = [(job_tasks.batch_item, [token, 0]),
             (job_tasks.never_consumed, [token])]
    result = queuety.batch(items, **CALLBACKS).enqueue()
    deadline = time.monotonic() + 30
    while result.done < 1:
        assert time.monotonic() < deadline, "the batch's first job never finished"
        time.sleep(0.05)
        result = result.refresh()

    result.cancel()
    [finally_] = callback_marks(result.id, 1)
    result = result.refresh()

    assert finally_ == "finally done=1 failed=1 cancelled=True"
    assert result.cancelled and (result.done, result.failed) == (1, 1)
    never = job_tasks.never_consumed.get_result(result.job_ids[1])
    assert queuety.workflow_status(int(never.id)).status == "cancelled"
    with pytest.raises(queuety.InvalidTransition):
        result.cancel()


def test_batch__bad_input_is_refused_and_nothing_enqueued(token):
    before = WorkflowRun.objects.count()

    with pytest.raises(InvalidTaskArguments, match="batch_item cannot be stored as JSON"):
        queuety.batch([(job_tasks.batch_item, [token, object()])]).enqueue()
    with pytest.raises(framework.InvalidTask, match="'nowhere', which the tasks backend"):
        queuety.batch([job_tasks.chain_start.using(queue_name="nowhere")])
    with pytest.raises(batches.BatchNotFound, match="is not a batch"):
        batches.Batch.get_result(job_tasks.add.enqueue(token, 1, 2).id)
    assert WorkflowRun.objects.count() == before + 1  # the add job only


def test_a_catch_that_cannot_be_enqueued__is_logged_and_the_failure_stands(token, caplog):
    from django.db import transaction

    from queuety.jobs import callbacks

    # A chain no worker runs (its queue is consumed by none), whose catch no longer imports.
    chain_id = int(queuety.chain(job_tasks.never_consumed).enqueue(token).id)
    run = WorkflowRun.objects.get(pk=chain_id)
    run.state["chain"]["catch"] = {"path": "tests.job_tasks.no_such_task", "backend": "default",
                                   "queue_name": "default", "priority": 0, "run_after": None}
    WorkflowRun.objects.filter(pk=chain_id).update(state=run.state)
    with transaction.atomic():
        callbacks.write("run_failed", {"run_id": run.pk, "workflow": run.name,
                                       "error": {"type": "ValueError", "message": "x"}})
        assert WorkflowRun.objects.filter(pk=run.pk).exists()  # the transaction still works

    assert f"The catch callback of run id={run.pk}" in caplog.text
    assert "no_such_task" in caplog.text


# -- throttling after exceptions ----------------------------------------------------------------

def test_throttle_exceptions__a_keys_jobs_are_held_not_failed_until_the_window_passes(
        worker, token):
    Status = framework.TaskResultStatus
    failed = []
    for _ in range(2):
        result = job_tasks.throttled_fails.enqueue(token)
        wait_for(int(result.id), worker=worker)
        result.refresh()
        failed.append(result)
    assert [r.status for r in failed] == [Status.FAILED] * 2

    held = job_tasks.throttled_ok.enqueue(token)          # same key: held
    time.sleep(1.0)
    held.refresh()
    assert held.status == Status.READY and "ok" not in texts(token)
    wait_for(int(held.id), timeout=30, worker=worker)
    held.refresh()

    assert held.status == Status.SUCCESSFUL and held.return_value == "ok"
    assert held.attempts == 1 and held.errors == []       # the held attempts were not counted
    # It ran once the first failure had left the 3 s window.
    assert (held.started_at - failed[0].finished_at).total_seconds() >= 2.9
    assert texts(token) == ["fails", "fails", "ok"]
