"""The raw Celery peer: a plain Celery app (no Django, no Queuety) on the same Redis broker.

Tasks, chained three at a time by the driver:

- ``noop`` / ``noop_done``: nothing at all; the last task of a chain counts finished chains in
  Redis (one INCR) and, at the N-th, stores the time: the throughput clock stops there.
- ``pg_step`` / ``pg_done`` / ``pg_notify``: the "PG chain": each task first runs the
  step-boundary transaction (``qbench.ceiling.step_transaction``: BEGIN, update the run row,
  complete the step row, insert the next one, COMMIT) over a per-process psycopg connection,
  so the next task is published only after the commit (outbox-then-publish).
- ``notify``: the last task of a latency chain LPUSHes to a key the client BLPOPs on.
- ``stamp``: LPUSHes the time it started to a key: the tasks benchmark's enqueue-to-start
  latency (``qbench.tasks_bench``).

Celery defaults otherwise (acks early, prefetch multiplier 4, no result backend): "raw".
"""

from __future__ import annotations

import os
import random
import time

from celery import Celery

from qbench import ceiling, env

app = Celery("qbench_peer", broker=env.REDIS_URL, set_as_current=False)
app.conf.update(
    task_ignore_result=True,
    task_default_queue="qbench-celery",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # The "Celery as Queuety runs it" variant of the tasks benchmark acks after the task.
    task_acks_late=os.environ.get("QBENCH_PEER_ACKS_LATE") == "1",
)

_conn = None
_redis = None


def redis_client():
    """This process's Redis client (created after the pool fork)."""
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(env.REDIS_URL)
    return _redis


def _pg():
    global _conn
    if _conn is None or _conn.closed:
        import psycopg

        _conn = psycopg.connect(env.pg_url(env.STEP_DB, "postgresql"))
    return _conn


def _finish(key: str, n: int) -> None:
    if redis_client().incr(key) == n:
        redis_client().set(f"{key}:end", repr(time.time()))


@app.task(name="qbench.noop")
def noop() -> None:
    """Do nothing."""


@app.task(name="qbench.noop_done")
def noop_done(key: str, n: int) -> None:
    """Count one finished chain; the N-th stores the end time."""
    _finish(key, n)


@app.task(name="qbench.notify")
def notify(key: str) -> None:
    """Wake the client waiting on ``key``."""
    redis_client().lpush(key, os.getpid())


@app.task(name="qbench.stamp")
def stamp(key: str) -> None:
    """LPUSH the time this call started to ``key``."""
    redis_client().lpush(key, repr(time.time()))


@app.task(name="qbench.pg_step")
def pg_step(rid: int | None = None) -> None:
    """Run one step-boundary transaction (on a random run unless ``rid`` is given)."""
    ceiling.step_transaction(_pg(), rid or random.randint(1, ceiling.RUNS))


@app.task(name="qbench.pg_done")
def pg_done(key: str, n: int, rid: int | None = None) -> None:
    """A step-boundary transaction, then count one finished chain."""
    pg_step(rid)
    _finish(key, n)


@app.task(name="qbench.pg_notify")
def pg_notify(key: str, rid: int | None = None) -> None:
    """A step-boundary transaction, then wake the client waiting on ``key``."""
    pg_step(rid)
    redis_client().lpush(key, os.getpid())


@app.task(name="qbench.io_wait")
def io_wait(seconds: float, key: str) -> None:
    """An I/O-bound task for the threads pool: waits, then LPUSHes to ``key``."""
    time.sleep(seconds)
    redis_client().lpush(key, 1)
