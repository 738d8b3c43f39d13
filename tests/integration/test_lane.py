"""The I/O lane: a real Celery worker on the threads pool, PostgreSQL, a real broker.

Many async steps in flight in one process (overlap measured from recorded start and end
times), an async body cancelled at its deadline, a sync body recorded as timed out at its
deadline while its thread runs on, a body that blocks the event loop reported by name, a
SIGKILLed lane worker's in-flight steps all recovered, connections bounded by the pool (200
threads, 200 runs, POOL_SIZE sessions, plus the two beat threads' own), and a worker of 200
threads without the pool refused at its start.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from contextlib import contextmanager

import pytest
from django.db import connection

import queuety
from queuety.models import Artifact, Event, StepRun
from queuety.store.unpooled import OWN_CONNECTIONS
from tests import job_tasks, lane_steps
from tests.integration.conftest import Worker, wait_for
from tests.workflows import marks

pytestmark = pytest.mark.worker

POOL_SIZE = 5


class LaneWorker(Worker):
    """A lane worker: ``--pool threads``, Django's connection pool of ``POOL_SIZE``."""

    node_prefix = "lane"

    def __init__(self, *args, app_name: str, **kwargs) -> None:
        super().__init__(*args, pool="threads", beat=False, **kwargs)
        self.env = {**self.env, "QUEUETY_DB_POOL": str(POOL_SIZE),
                    "QUEUETY_DB_APPLICATION_NAME": app_name}
        self.app_name = app_name


@pytest.fixture(scope="module")
def lane(db_session, worker, tmp_path_factory):
    """A lane worker with 60 threads on a queue of its own (the session's prefork worker runs
    the sweeper)."""
    handle = LaneWorker(tmp_path_factory.mktemp("lane"), queue=f"io-{uuid.uuid4().hex[:6]}",
                        concurrency=60, app_name=f"lane-{uuid.uuid4().hex[:8]}")
    handle.start()
    yield handle
    handle.stop()
    wait_gone(handle.app_name)


def wait_gone(app_name, timeout=15):
    """Wait until the stopped worker's sessions have left PostgreSQL (the test database is
    dropped at the end of the session)."""
    deadline = time.monotonic() + timeout
    while connections_of(app_name) and time.monotonic() < deadline:
        time.sleep(0.2)


def times(token, kind):
    return [float(line.split()[1]) for line in marks(f"{token}-{kind}")]


def max_overlap(intervals):
    """The most intervals open at one moment."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    live = peak = 0
    for _, change in edges:
        live += change
        peak = max(peak, live)
    return peak


def connections_of(app_name):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                       [app_name])
        return cursor.fetchone()[0]


@contextmanager
def sessions_sampled(app_name):
    """Yield a list that fills, every 0.1 s until the block ends, with how many PostgreSQL
    sessions ``app_name`` holds."""
    held = []
    stop = threading.Event()

    def sample():
        try:
            while not stop.is_set():
                held.append(connections_of(app_name))
                time.sleep(0.1)
        finally:
            connection.close()  # this thread's own session, or the test database stays busy

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield held
    finally:
        stop.set()
        sampler.join()


def test_many_async_steps_are_in_flight_at_once_on_few_connections(lane):
    tokens = [uuid.uuid4().hex[:12] for _ in range(50)]
    flow = queuety.workflow("lane_overlap").then(lane_steps.await_network, queue=lane.queue)
    runs = [flow.dispatch({"token": token, "body": 2}) for token in tokens]
    with sessions_sampled(lane.app_name) as held:
        statuses = [wait_for(run_id, timeout=60, worker=lane) for run_id in runs]
    assert [s.status for s in statuses] == ["completed"] * len(runs)
    intervals = [(times(t, "start")[0], times(t, "end")[0]) for t in tokens]
    # 50 bodies of 2 s each on 60 threads: nearly all overlap (a prefork pool of 4: 4).
    assert max_overlap(intervals) >= 40, intervals
    assert max(held) <= POOL_SIZE + OWN_CONNECTIONS, held  # and the beats' own


def test_async_tasks_on_the_lanes_queue__run_concurrently_on_its_event_loop(lane):
    tokens = [uuid.uuid4().hex[:12] for _ in range(30)]
    on_lane = job_tasks.awaits_network.using(backend="anyqueue", queue_name=lane.queue)
    results = [on_lane.enqueue(token, 2) for token in tokens]
    for result in results:
        wait_for(int(result.id), timeout=60, worker=lane)
        result.refresh()
    assert [(r.status, r.return_value) for r in results] == [("SUCCESSFUL", 2)] * len(tokens)
    intervals = [(times(t, "start")[0], times(t, "end")[0]) for t in tokens]
    # 30 jobs of 2 s each on 60 threads: nearly all at once (a prefork pool of 4: 4).
    assert max_overlap(intervals) >= 20, intervals
    # The lane worker ran them all: its main process's pid is in each worker id (host:pid@...).
    assert {r.worker_ids[0].split("@")[0].rpartition(":")[2] for r in results} == {
        str(lane.proc.pid)}


def test_an_async_body_is_cancelled_at_its_deadline(lane):
    token = uuid.uuid4().hex[:12]
    run_id = (queuety.workflow("lane_async_timeout")
              .then(lane_steps.await_too_long, timeout=1, queue=lane.queue)
              .dispatch({"token": token, "body": 4}))
    status = wait_for(run_id, timeout=30, worker=lane)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    claimed = StepRun.objects.get(pk=failed.step_run_id).claimed_at
    assert 1.0 <= (failed.created_at - claimed).total_seconds() <= 3.0
    # Until well past the moment an uncancelled 4 s body would have marked it.
    time.sleep(max(0.0, times(token, "start")[0] + 5.5 - time.time()))
    assert marks(f"{token}-after") == []  # cancelled: the body never went on


def test_an_async_body_that_swallows_its_cancellation_is_timed_out_and_not_merged(lane):
    run_id = (queuety.workflow("lane_swallow")
              .then(lane_steps.swallows_cancellation, timeout=1, queue=lane.queue)
              .dispatch({"token": uuid.uuid4().hex[:12], "body": 5}))
    status = wait_for(run_id, timeout=30, worker=lane)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    assert "late" not in status.state
    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    assert failed.data["discarded"] == {"output": {"late": True}}


def test_an_uninterruptible_sync_body_times_out_at_its_deadline_and_its_thread_is_counted(
        lane):
    token = uuid.uuid4().hex[:12]
    run_id = (queuety.workflow("lane_sync_timeout")
              .then(lane_steps.sync_uninterruptible, timeout=1, queue=lane.queue)
              .then(lane_steps.next_step)
              .dispatch({"token": token, "body": 4}))
    status = wait_for(run_id, timeout=30, worker=lane)
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    claimed = StepRun.objects.get(pk=failed.step_run_id).claimed_at
    assert 1.0 <= (failed.created_at - claimed).total_seconds() <= 3.0
    assert marks(f"{token}-after") == []  # recorded while the body still ran
    ended = f"Abandoned thread queuety-lane-body-{failed.step_run_id} ended"
    deadline = time.monotonic() + 15
    while not (marks(f"{token}-after") and ended in lane.log()):
        assert time.monotonic() < deadline, lane.log()[-3000:]
        time.sleep(0.1)
    assert len(marks(f"{token}-after")) == 1  # the thread ran on, and ended
    log = lane.log()
    assert f"queuety-lane-body-{failed.step_run_id} runs on until its call returns" in log
    assert ended in log
    assert "late" not in queuety.workflow_status(run_id).state  # never merged


def test_an_abandoned_body_cannot_write_an_artifact_after_its_deadline(lane):
    token = uuid.uuid4().hex[:12]
    run_id = (queuety.workflow("lane_late_artifact")
              .then(lane_steps.writes_after_its_deadline, timeout=1, queue=lane.queue)
              .dispatch({"token": token, "body": 2}))
    assert wait_for(run_id, timeout=30, worker=lane).status == "failed"
    deadline = time.monotonic() + 10
    while not marks(f"{token}-refused") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [line.split()[1] for line in marks(f"{token}-refused")] == ["StepTimeout"]
    # The write before the deadline shows with the recorded failure; the late one nowhere,
    # not even as an invisible row of the attempt.
    assert queuety.artifacts(run_id) and [a["key"] for a in queuety.artifacts(run_id)] == [
        "early"]
    assert list(Artifact.objects.filter(run_id=run_id).values_list("key", "visible")) == [
        ("early", True)]


def test_a_body_that_blocks_the_event_loop_is_reported_by_name(lane):
    token = uuid.uuid4().hex[:12]
    run_id = (queuety.workflow("lane_blocker")
              .then(lane_steps.blocks_the_loop, queue=lane.queue)
              .dispatch({"token": token, "body": 1.5}))
    assert wait_for(run_id, timeout=30, worker=lane).status == "completed"
    report = Event.objects.get(run_id=run_id, kind="loop_blocked")
    assert report.step_name == "blocks_the_loop"
    assert report.data["blocked_seconds"] >= 0.5
    assert "Step 'blocks_the_loop' of run" in lane.log()


def test_a_killed_lane_workers_in_flight_steps_are_all_recovered(db_session, worker, tmp_path):
    lane = LaneWorker(tmp_path, queue=f"io-kill-{uuid.uuid4().hex[:6]}", concurrency=40,
                      app_name=f"lane-kill-{uuid.uuid4().hex[:8]}")
    lane.start()
    tokens = [uuid.uuid4().hex[:12] for _ in range(20)]
    flow = (queuety.workflow("lane_killed").then(lane_steps.await_network, queue=lane.queue)
            .then(lane_steps.next_step))
    runs = [flow.dispatch({"token": token, "body": 3}) for token in tokens]
    try:
        deadline = time.monotonic() + 30
        while sum(bool(marks(f"{t}-start")) for t in tokens) < len(tokens):
            assert time.monotonic() < deadline, lane.log()[-3000:]
            time.sleep(0.1)
        lane.stop(signal.SIGKILL)
        lane.start()
        statuses = [wait_for(run_id, timeout=90, worker=lane) for run_id in runs]
    finally:
        lane.stop()
        wait_gone(lane.app_name)
    assert [s.status for s in statuses] == ["completed"] * len(runs)
    for run_id in runs:
        kinds = list(Event.objects.filter(run_id=run_id).values_list("kind", "step_name"))
        # Exactly one transition per step, though the first ran twice.
        assert kinds.count(("step_completed", "await_network")) == 1, kinds
        assert kinds.count(("step_completed", "next_step")) == 1, kinds
        assert ("step_retried", "await_network") in kinds or \
            ("step_failed", "await_network") not in kinds
    lost = Event.objects.filter(run_id__in=runs, data__error__type="queuety.exceptions.WorkerLost")
    assert lost.count() >= len(runs) - 2  # each in-flight attempt recorded as lost


def test_the_lane_refuses_to_start_on_the_embedded_default(tmp_path):
    import os
    import subprocess
    import sys

    from tests.integration.conftest import ROOT

    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update({"DJANGO_SETTINGS_MODULE": "project.settings", "PYTHONPATH": str(ROOT),
                "QUEUETY_VAR_DIR": str(tmp_path)})
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "project", "worker",
                           "--pool", "threads", "-c", "4", "-Q", "nothing-here"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "The Queuety I/O lane (a worker with --pool threads) needs PostgreSQL" in done.stderr
    assert "and a real broker (the broker is filesystem://" in done.stderr


def test_too_many_abandoned_threads_make_the_lane_worker_replace_itself(
        db_session, worker, tmp_path):
    lane = LaneWorker(tmp_path, queue=f"io-stuck-{uuid.uuid4().hex[:6]}", concurrency=8,
                      app_name=f"lane-stuck-{uuid.uuid4().hex[:8]}")
    lane.env["QUEUETY_TEST_LANE_MAX_ABANDONED"] = "0"
    lane.start()
    token = uuid.uuid4().hex[:12]
    try:
        run_id = (queuety.workflow("lane_stuck")
                  .then(lane_steps.sync_uninterruptible, timeout=1, queue=lane.queue)
                  .dispatch({"token": token, "body": 8}))
        status = wait_for(run_id, timeout=30, worker=lane)
        assert status.status == "failed"
        assert status.error["type"] == "queuety.exceptions.StepTimeout"
        deadline = time.monotonic() + 30
        while lane.log().count(" ready.") < 2:
            assert time.monotonic() < deadline, lane.log()[-3000:]
            time.sleep(0.2)
        assert "more than QUEUETY['LANE_MAX_ABANDONED'] = 0" in lane.log()
        # The worker came back (Celery re-executed it) and runs steps again.
        after = (queuety.workflow("lane_after_restart")
                 .then(lane_steps.await_network, queue=lane.queue)
                 .dispatch({"token": uuid.uuid4().hex[:12], "body": 0.1}))
        assert wait_for(after, timeout=60, worker=lane).status == "completed"
        started = times(token, "start")[0]
        time.sleep(max(0.0, started + 9 - time.time()))
        assert marks(f"{token}-after") == []  # the restart ended the stuck thread
    finally:
        lane.stop()
        wait_gone(lane.app_name)


def test_a_lane_worker_of_200_threads_without_the_pool_refuses_to_start(db_session, tmp_path):
    # Without Django's pool each of its threads would hold a PostgreSQL session of its own:
    # 200 against a server's max_connections of 100 is "too many clients" for it and for the
    # site's web processes. It refuses before it consumes anything.
    app_name = f"lane-nopool-{uuid.uuid4().hex[:8]}"
    refused = Worker(tmp_path, queue=f"io-nopool-{uuid.uuid4().hex[:6]}", pool="threads",
                     beat=False, concurrency=200)
    refused.env["QUEUETY_DB_APPLICATION_NAME"] = app_name
    refused.launch()
    try:
        refused.proc.wait(timeout=60)
    finally:
        refused.stop()
    log = refused.log()
    assert refused.proc.returncode != 0, log[-3000:]
    assert ("queuety: This I/O lane worker (--pool threads) runs 200 threads, and without "
            "Django's connection pool") in log
    assert "more than QUEUETY['LANE_MAX_CONNECTIONS'] (20)" in log
    assert "DATABASES['default']['OPTIONS']['pool'] = {'min_size': 2, 'max_size': 20}" in log
    assert "--concurrency 17 or fewer" in log
    assert connections_of(app_name) == 0


def test_200_threads_on_the_pool_finish_200_runs_on_at_most_its_max_size_sessions(
        db_session, worker, tmp_path):
    wide = LaneWorker(tmp_path, queue=f"io-wide-{uuid.uuid4().hex[:6]}", concurrency=200,
                      app_name=f"lane-wide-{uuid.uuid4().hex[:8]}")
    wide.start()
    tokens = [uuid.uuid4().hex[:12] for _ in range(200)]
    flow = queuety.workflow("lane_wide").then(lane_steps.await_network, queue=wide.queue)
    try:
        with sessions_sampled(wide.app_name) as held:
            runs = [flow.dispatch({"token": token, "body": 1}) for token in tokens]
            statuses = [wait_for(run_id, timeout=120, worker=wide) for run_id in runs]
    finally:
        wide.stop()
        wait_gone(wide.app_name)
    assert [s.status for s in statuses] == ["completed"] * len(runs)
    intervals = [(times(t, "start")[0], times(t, "end")[0]) for t in tokens]
    # Far more bodies in flight than connections (measured 99 to 150 here; a prefork pool of
    # 4: 4): the threads shared the pool's few.
    assert max_overlap(intervals) >= 50, max_overlap(intervals)
    # The pool's sessions, and the heartbeat's and the registry beat's own (outside it).
    assert held and max(held) <= POOL_SIZE + OWN_CONNECTIONS, held
