"""Django's tasks framework: Queuety's backend against raw Celery and django-tasks-db (issue 29).

Run as its own process (``python -m qbench.tasks_bench``) under ``qbench.settings_tasks``, so the
driver's Django keeps the project's settings. It starts its own workers, all of 2 processes on
the same PostgreSQL and Redis: Queuety's worker as shipped (``celery -A project worker``,
prefork, concurrency 2), the raw Celery peer (``qbench.celery_peer``, prefork, concurrency 2)
and two ``manage.py db_worker`` processes of django-tasks-db (``--interval 0.01``: the poll
when idle, 10 ms like the DBOS peer's; its default is 1 s). The db_workers run only during
their own tests, because their idle polling (about 200 transactions/s) would load the
machine under the others'. Measures, per engine, and prints one JSON line:

- ``cpu_ms`` of each throughput test: CPU ms per job of each kind of process while the jobs
  ran (``qbench.cpu``), and of the whole machine.
- ``celery_late``: the same raw Celery tasks on a worker that delivers as Queuety's does (acks
  late, prefetch multiplier 1): its jobs/s and latency only.
- ``jobs``: N no-op tasks enqueued where no worker takes them yet, then released at once
  (Queuety and Celery: ``add_consumer``; django-tasks-db: one UPDATE moving the rows to the
  workers' queue) and the clock starts. It stops at the last job's ``finished_at`` (Queuety,
  django-tasks-db), or when the N-th Celery task stores its time (each Celery task does one
  Redis INCR so that the clock can stop: a cost the others do not pay).
- ``enqueue``: E enqueues from this one process to a queue no worker consumes: the backend's
  ``enqueue()`` for Queuety and django-tasks-db, ``apply_async(queue=...)`` (``delay()`` with
  the queue) for Celery.
- ``latency``: one task at a time, its function LPUSHes ``time.time()`` as it starts and the
  client BLPOPs it: enqueue-to-start, p50 and p95 in ms, after 20 warm-ups; and the p50 of
  the ``enqueue()`` call itself, the part of it spent in the client.

Usage: python -m qbench.tasks_bench --n 1000 --enqueue 600 --lat 200 [--flip]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any, Callable

SETTINGS = "qbench.settings_tasks"
DB_WORKERS = 2
#: db_worker's poll interval when it finds nothing (seconds); its default is 1.
DB_POLL = 0.01


def _setup() -> None:
    from qbench import env

    os.environ.update({k: v for k, v in env.django_env().items() if k != "PYTHONPATH"})
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()
    from django.core.management import call_command

    import project.celery  # noqa: F401 - the project's Celery app is the current app

    call_command("migrate", "django_tasks_database", verbosity=0)


def _environ() -> dict[str, str]:
    from qbench import env

    return {**env.django_env(), "DJANGO_SETTINGS_MODULE": SETTINGS}


def _queue(kind: str) -> str:
    return f"qbench-{kind}-{uuid.uuid4().hex[:6]}"


# -- Queuety -----------------------------------------------------------------------------------

def queuety_jobs(worker, n: int) -> dict[str, float]:
    """N no-op jobs through Queuety's worker: jobs/s from add_consumer to the last finished_at."""
    from qbench import jobs_tasks, queuety_bench

    queue = _queue("jtp")
    task = jobs_tasks.noop.using(queue_name=queue)
    ids = [int(task.enqueue().id) for _ in range(n)]
    stats = queuety_bench.Stats()
    meter = _worker_meter(worker)
    try:
        meter.start()
        started = time.time()
        worker.consume(queue)
        end = queuety_bench.wait_done(stats, ids[0], ids[-1], timeout=60 + n / 10)
        cpu_ms = meter.per_job_ms(n)
    finally:
        stats.close()
        worker.ignore(queue)
    return {"jobs_per_s": n / (end - started), "seconds": end - started, "cpu_ms": cpu_ms}


def _worker_meter(worker):
    """CPU of a Celery worker's main process and pool processes (and PostgreSQL, Redis)."""
    from qbench.cpu import Meter

    return Meter({"worker main": lambda: [worker.proc.pid], "pool": worker.pool_pids})


def queuety_enqueue(count: int) -> dict[str, float]:
    from qbench import jobs_tasks

    task = jobs_tasks.noop.using(queue_name=_queue("jenq"))
    return _rate(count, task.enqueue)


# -- raw Celery --------------------------------------------------------------------------------

def celery_jobs(worker, n: int) -> dict[str, float]:
    """N single no-op Celery tasks (each INCRs a counter; the N-th stores the time)."""
    import redis

    from qbench import celery_peer as peer
    from qbench import env

    queue = _queue("ctasks")
    key = f"qbench:ctasks:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(env.REDIS_URL)
    meter = _worker_meter(worker)
    try:
        for _ in range(n):
            peer.noop_done.apply_async((key, n), queue=queue)
        meter.start()
        started = time.time()
        worker.consume(queue)
        deadline = time.monotonic() + 60 + n / 10
        while (end := client.get(f"{key}:end")) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery tasks: {client.get(key)}/{n} in time")
            time.sleep(0.05)
        cpu_ms = meter.per_job_ms(n)
    finally:
        worker.ignore(queue)
        client.delete(key, f"{key}:end", queue)
        client.close()
    return {"jobs_per_s": n / (float(end) - started), "seconds": float(end) - started,
            "cpu_ms": cpu_ms}


def celery_enqueue(count: int) -> dict[str, float]:
    import redis

    from qbench import celery_peer as peer
    from qbench import env

    queue = _queue("cenq")
    try:
        return _rate(count, lambda: peer.noop.apply_async(queue=queue))
    finally:
        redis.Redis.from_url(env.REDIS_URL).delete(queue)


# -- django-tasks-db ---------------------------------------------------------------------------

class DbWorkers:
    """``DB_WORKERS`` ``manage.py db_worker`` processes on one queue, stopped by PID."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.procs: list = []

    def __enter__(self) -> "DbWorkers":
        from qbench import env, util

        for number in range(DB_WORKERS):
            self.procs.append(util.start(
                [sys.executable, str(env.ROOT / "manage.py"), "db_worker", "--backend", "db",
                 "--queue-name", self.queue, "--interval", str(DB_POLL), "--no-reload",
                 "--no-startup-delay", "--worker-id", f"qbench-{number}-{uuid.uuid4().hex[:6]}"],
                log=env.RESULTS_DIR / "logs" / "db_worker.log", environ=_environ()))
        # Warm up: imports, connections; also proves both processes take tasks.
        done = _db_wait(self.queue, [_db_task(self.queue).enqueue().id for _ in range(20)],
                        timeout=90)
        if done is None:
            raise RuntimeError("django-tasks-db workers did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        from qbench import util

        for proc in self.procs:
            util.stop(proc)


def _db_task(queue: str, name: str = "noop"):
    from qbench import jobs_tasks

    return getattr(jobs_tasks, name).using(backend="db", queue_name=queue)


def _db_wait(queue: str, ids: list[str], timeout: float) -> float | None:
    """Wait until the rows ``ids`` succeeded; return the epoch of the last ``finished_at``."""
    from django.db.models import Count, Max, Q
    from django_tasks_db.models import DBTaskResult

    rows = DBTaskResult.objects.filter(queue_name=queue, id__in=ids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = rows.aggregate(done=Count("id", filter=Q(status="SUCCESSFUL")),
                               failed=Count("id", filter=Q(status="FAILED")),
                               end=Max("finished_at"))
        if found["failed"]:
            raise RuntimeError(f"{found['failed']} django-tasks-db tasks failed")
        if found["done"] >= len(ids):
            return found["end"].timestamp()
        time.sleep(0.25)
    return None


def db_jobs_and_latency(n: int, samples: int) -> tuple[dict, dict]:
    """Throughput, then latency, on one pair of db_workers (started for these tests only)."""
    from django_tasks_db.models import DBTaskResult

    queue, hold = _queue("dtp"), _queue("dhold")
    task = _db_task(hold)
    ids = [task.enqueue().id for _ in range(n)]
    with DbWorkers(queue) as workers:
        from qbench.cpu import Meter

        meter = Meter({"db_worker": lambda: [proc.pid for proc in workers.procs]})
        meter.start()
        started = time.time()
        DBTaskResult.objects.filter(queue_name=hold).update(queue_name=queue)
        end = _db_wait(queue, ids, timeout=60 + n / 5)
        if end is None:
            raise RuntimeError(f"django-tasks-db: {n} tasks not done in time")
        jobs = {"jobs_per_s": n / (end - started), "seconds": end - started,
                "cpu_ms": meter.per_job_ms(n)}
        latency = _latency(lambda key: _db_task(queue, "stamp").enqueue(key), samples)
    DBTaskResult.objects.filter(queue_name__in=[queue, hold]).delete()
    return jobs, latency


def db_enqueue(count: int) -> dict[str, float]:
    from django_tasks_db.models import DBTaskResult

    queue = _queue("denq")
    try:
        return _rate(count, _db_task(queue).enqueue)
    finally:
        # Rows no worker takes would stay READY in the table the next polls scan.
        DBTaskResult.objects.filter(queue_name=queue).delete()


# -- shared ------------------------------------------------------------------------------------

def _rate(count: int, call: Callable[[], Any], warmup: int = 20) -> dict[str, float]:
    for _ in range(warmup):
        call()
    started = time.perf_counter()
    for _ in range(count):
        call()
    return {"per_s": count / (time.perf_counter() - started)}


def _latency(enqueue: Callable[[str], Any], samples: int, warmup: int = 20) -> dict[str, float]:
    """Enqueue-to-start (ms): the time the task's function stamped minus the time before
    ``enqueue`` was called (one clock: one machine)."""
    import redis

    from qbench import env
    from qbench.util import percentile

    client = redis.Redis.from_url(env.REDIS_URL)
    times, calls = [], []
    try:
        for i in range(warmup + samples):
            key = f"qbench:tlat:{uuid.uuid4().hex}"
            before = time.time()
            enqueue(key)
            returned = time.time()
            popped = client.blpop([key], timeout=30)
            if popped is None:
                raise RuntimeError("a latency task did not start within 30 s")
            if i >= warmup:
                times.append((float(popped[1]) - before) * 1000)
                calls.append((returned - before) * 1000)
    finally:
        client.close()
    # The enqueue call's own share of the latency: the rest is delivery and the claim.
    return {"p50_ms": statistics.median(times), "p95_ms": percentile(times, 95),
            "enqueue_call_p50_ms": statistics.median(calls)}


def queuety_latency(worker, samples: int) -> dict[str, float]:
    from qbench import jobs_tasks

    queue = _queue("jlat")
    worker.consume(queue)
    try:
        return _latency(jobs_tasks.stamp.using(queue_name=queue).enqueue, samples)
    finally:
        worker.ignore(queue)


def celery_latency(worker, samples: int) -> dict[str, float]:
    from qbench import celery_peer as peer

    queue = _queue("clat")
    worker.consume(queue)
    try:
        return _latency(lambda key: peer.stamp.apply_async((key,), queue=queue), samples)
    finally:
        worker.ignore(queue)


def _warm(worker, run: Callable[..., Any]) -> None:
    run(worker, 50)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qbench.tasks_bench")
    parser.add_argument("--n", type=int, default=1000, help="tasks per throughput test")
    parser.add_argument("--enqueue", type=int, default=600, help="enqueues per rate test")
    parser.add_argument("--lat", type=int, default=200, help="latency samples")
    parser.add_argument("--flip", action="store_true", help="run the engines in reverse order")
    args = parser.parse_args(argv)
    _setup()
    from qbench import util

    results: dict[str, Any] = {}
    queuety = util.Worker("project", 2, label="tasks-queuety", environ=_environ())
    peer = util.Worker("qbench.celery_peer", 2, label="tasks-peer", environ=_environ())
    # Raw Celery delivering as Queuety's worker does (acks late, prefetch 1): the ceiling a
    # message per job leaves, with none of Queuety's work.
    late = util.Worker("qbench.celery_peer", 2, label="tasks-peer-late",
                       environ={**_environ(), "QBENCH_PEER_ACKS_LATE": "1"},
                       extra=["--prefetch-multiplier", "1"])
    try:
        queuety.start()
        peer.start()
        late.start()
        _warm(queuety, queuety_jobs)
        _warm(peer, celery_jobs)
        _warm(late, celery_jobs)

        def run_queuety() -> None:
            results["queuety_jobs"] = queuety_jobs(queuety, args.n)
            results["queuety_enqueue"] = queuety_enqueue(args.enqueue)
            results["queuety_latency"] = queuety_latency(queuety, args.lat)

        def run_celery() -> None:
            results["celery_jobs"] = celery_jobs(peer, args.n)
            results["celery_enqueue"] = celery_enqueue(args.enqueue)
            results["celery_latency"] = celery_latency(peer, args.lat)
            results["celery_late_jobs"] = celery_jobs(late, args.n)
            results["celery_late_latency"] = celery_latency(late, args.lat)

        def run_db() -> None:
            results["db_jobs"], results["db_latency"] = db_jobs_and_latency(args.n, args.lat)
            results["db_enqueue"] = db_enqueue(args.enqueue)

        engines = [run_queuety, run_celery, run_db]
        for run in (reversed(engines) if args.flip else engines):
            run()
    finally:
        queuety.stop()
        peer.stop()
        late.stop()
        util.stop_all()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
