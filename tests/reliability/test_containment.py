"""A step that leaks memory or hangs is contained by the worker's limits.

The demo project sets ``CELERY_WORKER_MAX_TASKS_PER_CHILD``, ``CELERY_WORKER_MAX_MEMORY_PER_CHILD``
and ``CELERY_TASK_TIME_LIMIT`` (docs/deploy/running-workers.md); here workers get small limits so
the test sees them act in seconds.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

import queuety
from queuety.models import Event
from tests.integration.conftest import wait_for
from tests.reliability import steps
from tests.reliability.chaos import PoolWorker, alive, delete_queue, publishing_to

BROKER = os.environ["CELERY_BROKER_URL"]


def limited_worker(tmp_path_factory, name: str, *options: str, **env: str):
    queue = f"queuety-{name}-{uuid.uuid4().hex[:10]}"
    handle = PoolWorker(tmp_path_factory.mktemp(name), BROKER, queue, beat=True,
                        concurrency=1, name=name, options=options)
    handle.env.update(env)
    handle.start()
    return handle, queue


@pytest.fixture(scope="module")
def memory_limited(quiet_session_worker, tmp_path_factory):
    """One pool process, replaced once a task leaves it above 150 MiB."""
    handle, queue = limited_worker(tmp_path_factory, "memory",
                                   "--max-memory-per-child", str(150 * 1024))
    with publishing_to(BROKER, queue):
        yield handle
    handle.stop()
    delete_queue(BROKER, queue)


@pytest.fixture(scope="module")
def time_limited(quiet_session_worker, tmp_path_factory):
    """One pool process, with a 2 s hard time limit per task.

    Set as the demo sets it, through ``CELERY_TASK_TIME_LIMIT`` (here from the environment):
    a task's own limit wins over the worker's ``--time-limit``, so with the setting in place
    the command-line option would not apply.
    """
    handle, queue = limited_worker(tmp_path_factory, "time", QUEUETY_TASK_TIME_LIMIT="2")
    with publishing_to(BROKER, queue):
        yield handle
    handle.stop()
    delete_queue(BROKER, queue)


def test_leaking_step__its_process_is_replaced_after_the_task(memory_limited, token,
                                                               figures):
    # The pool checks memory when a task ends, and steps run inline share their task, so the
    # next step gets a message (and a task) of its own here: a timed step is never inline.
    run_id = (queuety.workflow("rel_leak").then(steps.leak).then(steps.after_leak, timeout=30)
              .dispatch({"token": token, "leak_mib": 300}))

    status = wait_for(run_id, timeout=60, worker=memory_limited)

    assert status.status == "completed", status.error
    leaked_by, next_by = status.state["leaked_by"], status.state["after_leak_by"]
    # One pool process: the next step ran in a new one because the leaker was retired.
    assert next_by != leaked_by
    deadline = time.monotonic() + 10
    while alive(leaked_by) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(leaked_by)
    assert [step for step, _, _ in steps.read_ledger(token)] == ["leak", "after_leak"]
    figures.record("containment_memory", leaked_mib=300, limit_mib=150,
                   replaced=leaked_by != next_by)


def test_hanging_step_without_timeout__killed_at_the_hard_limit_and_recorded(time_limited, token,
                                                                             figures):
    started = time.monotonic()
    run_id = (queuety.workflow("rel_hang").then(steps.hang).then(steps.after_leak)
              .dispatch({"token": token}))

    status = wait_for(run_id, timeout=30, worker=time_limited)
    took = time.monotonic() - started

    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    assert "worker's hard time limit" in status.error["message"]
    # Recorded by the worker's main process when it killed the pool process, not by the
    # sweeper after the heartbeat went stale (the hanging process kept beating until killed).
    assert took < 2 + 3, took
    assert [step for step, _, _ in steps.read_ledger(token)] == ["hang"]
    assert Event.objects.filter(run_id=run_id, kind="step_failed").count() == 1
    # The pool is whole again: the next run is served.
    after = queuety.workflow("rel_after_hang").then(steps.after_leak).dispatch(
        {"token": f"{token}-next"})
    assert wait_for(after, timeout=30, worker=time_limited).status == "completed"
    figures.record("containment_hang", hard_limit_s=2, failed_after_s=round(took, 2))
