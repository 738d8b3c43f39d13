"""The I/O-bound and timed workloads (issue 18): ``benchmarks/run --only io,timed``.

``io``: N one-step runs whose step awaits 1 s (``async def``), all dispatched at once, on
  one Queuety I/O-lane worker (``--pool threads -c N``, Django's connection pool of 20);
  against DBOS (one process, an async workflow calling an async step) and a raw Celery
  threads-pool worker (a task that sleeps 1 s). Wall time from the worker being pointed at
  the work to the last finish; peak RSS of all the worker's processes; peak PostgreSQL
  sessions the lane held (``pg_stat_activity`` by application name).
``timed``: N three-step no-op runs whose steps have ``timeout=30``, on 2 prefork processes,
  against the untimed runs of the ``throughput`` section (and DBOS direct, raw Celery no-op).
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import psycopg
import redis

from qbench import env, util

LANE_POOL = 20


def _sampler(pids, conninfo: str | None, app_name: str | None):
    """Sample RSS (all ``pids()``) and sessions of ``app_name`` every 50 ms until stopped."""
    peak = {"rss_kib": 0, "sessions": 0}
    stop = threading.Event()

    def run() -> None:
        conn = psycopg.connect(conninfo, autocommit=True) if conninfo else None
        while not stop.is_set():
            peak["rss_kib"] = max(peak["rss_kib"], sum(util.rss_kib(p) for p in pids()))
            if conn is not None:
                count = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                                     "application_name = %s", [app_name]).fetchone()[0]
                peak["sessions"] = max(peak["sessions"], count)
            time.sleep(0.05)
        if conn is not None:
            conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return peak, stop, thread


def queuety_io(n: int) -> dict[str, float]:
    """N concurrent 1 s async steps on one lane worker."""
    import queuety
    from qbench.queuety_bench import Stats, wait_done

    app_name = f"qbench-lane-{uuid.uuid4().hex[:6]}"
    environ = {**env.django_env(), "DJANGO_SETTINGS_MODULE": "project.settings",
               "QUEUETY_DB_POOL": str(LANE_POOL), "QUEUETY_DB_APPLICATION_NAME": app_name}
    worker = util.Worker("project", n, label=f"lane-{n}", environ=environ, pool="threads")
    worker.start()
    queue = f"qbench-io-{uuid.uuid4().hex[:6]}"
    builder = queuety.workflow("qbench_io").then("qbench.steps.await_one", queue=queue)
    ids = [builder.dispatch({"wait": 1.0}) for _ in range(n)]
    stats = Stats()
    pids = lambda: [worker.proc.pid, *worker.pool_pids()] if worker.proc else []  # noqa: E731
    idle_kib = sum(util.rss_kib(p) for p in pids())
    peak, stop, sampler = _sampler(pids, env.pg_url(env.QUEUETY_DB, "postgresql"), app_name)
    try:
        started = time.time()
        worker.consume(queue)
        end = wait_done(stats, ids[0], ids[-1], timeout=120 + n / 5)
    finally:
        stop.set()
        sampler.join()
        stats.close()
        worker.stop()
    return {"seconds": end - started, "peak_rss_mib": peak["rss_kib"] / 1024,
            "idle_rss_mib": idle_kib / 1024, "peak_sessions": peak["sessions"],
            # What each step in flight adds: the peak over the idle worker, per step.
            "kib_per_in_flight_step": (peak["rss_kib"] - idle_kib) / n}


def celery_io(n: int) -> dict[str, float]:
    """N concurrent 1 s sleeping tasks on a raw Celery threads-pool worker."""
    from qbench.celery_peer import app

    worker = util.Worker("qbench.celery_peer", n, label=f"celery-threads-{n}",
                         environ=env.django_env(), pool="threads")
    worker.start()
    queue = f"qbench-cio-{uuid.uuid4().hex[:6]}"
    key = f"qbench:io:{uuid.uuid4().hex}"
    for _ in range(n):
        app.send_task("qbench.io_wait", (1.0, key), queue=queue)
    client = redis.Redis.from_url(env.REDIS_URL)
    pids = lambda: [worker.proc.pid, *worker.pool_pids()] if worker.proc else []  # noqa: E731
    peak, stop, sampler = _sampler(pids, None, None)
    try:
        started = time.time()
        worker.consume(queue)
        for _ in range(n):
            client.blpop([key], timeout=120)
        end = time.time()
    finally:
        stop.set()
        sampler.join()
        worker.stop()
    return {"seconds": end - started, "peak_rss_mib": peak["rss_kib"] / 1024}


def dbos_io(n: int) -> dict[str, float]:
    """DBOS, one process: N async workflows each awaiting an async 1 s step."""
    return util.run_json([sys.executable, "-m", "qbench.dbos_async", "--n", str(n)],
                         environ=env.django_env(),
                         log=env.RESULTS_DIR / "logs" / "dbos_async.log", timeout=600)


def queuety_timed(worker: util.Worker, n: int) -> dict[str, float]:
    """N three-step no-op runs, each step ``timeout=30``."""
    import queuety
    from qbench.queuety_bench import STEPS, Stats, wait_done

    queue = f"qbench-timed-{uuid.uuid4().hex[:6]}"
    builder = queuety.workflow("qbench_timed").on_queue(queue)
    for step in STEPS:
        builder = builder.then(step, timeout=30)
    ids = [builder.dispatch({"i": i}) for i in range(n)]
    stats = Stats()
    try:
        started = time.time()
        worker.consume(queue)
        end = wait_done(stats, ids[0], ids[-1], timeout=120 + n * 3 / 10)
    finally:
        stats.close()
        worker.ignore(queue)
    return {"steps_per_s": 3 * n / (end - started), "seconds": end - started}
