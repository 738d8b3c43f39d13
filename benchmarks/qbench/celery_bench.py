"""Raw Celery workloads (the peer), run from the driver against a ``qbench.celery_peer`` worker.

Throughput: N chains of three tasks are published to a queue the worker does not consume
yet; the clock starts at ``add_consumer`` and stops when the N-th chain's last task stores
its time in Redis. Latency: one chain at a time, the client BLPOPs the key its last task
LPUSHes (after that task's commit, for the PG chain).
"""

from __future__ import annotations

import statistics
import time
import uuid

import redis
from celery import chain

from qbench import celery_peer as peer
from qbench import env
from qbench.util import Worker, percentile


def _chain(queue: str, *tasks):
    """A chain whose every task is routed to ``queue``."""
    return chain(*(task.set(queue=queue) for task in tasks))


def _throughput_chain(kind: str, queue: str, *last_args):
    if kind == "noop":
        return _chain(queue, peer.noop.si(), peer.noop.si(), peer.noop_done.si(*last_args))
    return _chain(queue, peer.pg_step.si(), peer.pg_step.si(), peer.pg_done.si(*last_args))


def throughput(worker: Worker, n: int, kind: str) -> dict[str, float]:
    """``kind`` = ``noop`` (no-op tasks) or ``pg`` (one step transaction per task)."""
    queue = f"qbench-ctp-{uuid.uuid4().hex[:6]}"
    key = f"qbench:ctp:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(env.REDIS_URL)
    try:
        started = time.perf_counter()
        for _ in range(n):
            _throughput_chain(kind, queue, key, n).apply_async()
        publish_rate = n / (time.perf_counter() - started)
        started = time.time()
        worker.consume(queue)
        deadline = time.monotonic() + 120 + n * 3 / 10
        while (end := client.get(f"{key}:end")) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery {kind}: {client.get(key)}/{n} chains in time")
            time.sleep(0.1)
        elapsed = float(end) - started
    finally:
        worker.ignore(queue)
        client.delete(key, f"{key}:end", queue)
        client.close()
    return {"runs_per_s": n / elapsed, "steps_per_s": 3 * n / elapsed, "seconds": elapsed,
            "preload_publish_per_s": publish_rate}


def latency(worker: Worker, samples: int, kind: str, warmup: int = 20) -> dict[str, float]:
    """p50/p95 (ms) of one 3-task chain, apply_async -> the client's BLPOP returns."""
    queue = f"qbench-clat-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(env.REDIS_URL)
    worker.consume(queue)
    times = []
    try:
        for i in range(warmup + samples):
            key = f"qbench:clat:{uuid.uuid4().hex}"
            if kind == "noop":
                sig = _chain(queue, peer.noop.si(), peer.noop.si(), peer.notify.si(key))
            else:
                sig = _chain(queue, peer.pg_step.si(), peer.pg_step.si(), peer.pg_notify.si(key))
            started = time.perf_counter()
            sig.apply_async()
            if client.blpop([key], timeout=30) is None:
                raise RuntimeError(f"celery {kind} latency chain lost")
            if i >= warmup:
                times.append((time.perf_counter() - started) * 1000)
    finally:
        worker.ignore(queue)
        client.close()
    return {"p50_ms": statistics.median(times), "p95_ms": percentile(times, 95)}


def warm_up(worker: Worker) -> None:
    """Run a few chains of both kinds through a fresh worker."""
    throughput(worker, 50, "noop")
    throughput(worker, 50, "pg")
