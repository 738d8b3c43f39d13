"""The DBOS Transact peer, run as its own process (DBOS keeps global state and threads).

A workflow of three no-op ``@DBOS.step``s on the system database ``dbos_bench`` (same
PostgreSQL). Measures, in this order, and prints one JSON line:

- latency: ``wf3(i)`` called inline (DBOS's fastest path, no queue), after a warm-up;
- direct throughput: ``threads`` threads calling ``wf3`` until ``n`` workflows ran;
- queued throughput (``--queue-n``): ``enqueue`` on a queue with ``worker_concurrency=2``
  polled every 10 ms (the DBOS default is 1 s), from the first enqueue to the last
  ``updated_at``. The queue is deleted afterwards: registered queues persist and are polled.

``xact_commit`` deltas of ``dbos_bench`` (pg_stat_database) give transactions per workflow.

Usage: python -m qbench.dbos_peer --n 500 --lat 200 --threads 2 --queue-n 300
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
from dbos import DBOS

from qbench import env
from qbench.util import db_counters, percentile

DB_URL = env.pg_url(env.DBOS_DB, "postgresql")


@DBOS.step()
def step_one(i: int) -> int:
    return i


@DBOS.step()
def step_two(i: int) -> int:
    return i


@DBOS.step()
def step_three(i: int) -> int:
    return i


@DBOS.workflow()
def wf3(i: int) -> int:
    step_one(i)
    step_two(i)
    return step_three(i)


def commits(conn) -> int:
    """Committed transactions of dbos_bench so far, once every idle backend has flushed."""
    return db_counters(conn, env.DBOS_DB)["xact_commit"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--lat", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--queue-n", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--account", action="store_true",
                        help="count committed transactions per workflow (waits 2 x 11 s)")
    args = parser.parse_args()

    DBOS(config={"name": "qbench", "system_database_url": DB_URL, "log_level": "WARNING",
                 "executor_id": f"qbench-{os.getpid()}"})
    DBOS.launch()
    stats = psycopg.connect(DB_URL, autocommit=True)
    result: dict = {}
    try:
        for i in range(args.warmup):
            wf3(i)

        samples = []
        for i in range(args.lat):
            started = time.perf_counter()
            wf3(i)
            samples.append((time.perf_counter() - started) * 1000)
        result["latency_p50_ms"] = statistics.median(samples)
        result["latency_p95_ms"] = percentile(samples, 95)

        if args.account:
            # DBOS's background threads commit while idle too: measure their rate first.
            idle_from, mark = commits(stats), time.monotonic()
            before = commits(stats)
            idle_rate = (before - idle_from - 2) / (time.monotonic() - mark)
            mark = time.monotonic()
        started = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(wf3, range(args.n)))
        elapsed = time.perf_counter() - started
        result["direct_wf_per_s"] = args.n / elapsed
        result["direct_steps_per_s"] = 3 * args.n / elapsed
        if args.account:  # minus our own reads (2 per db_counters call) and idle commits
            after = commits(stats)
            idle = idle_rate * (time.monotonic() - mark)
            result["xact_per_wf"] = (after - before - 2 - idle) / args.n
            result["idle_commits_per_s"] = idle_rate

        if args.queue_n:
            name = f"qbench_{uuid.uuid4().hex[:8]}"
            DBOS.register_queue(name, worker_concurrency=2, polling_interval_sec=0.01)
            try:
                started = time.time()
                for i in range(args.queue_n):
                    DBOS.enqueue_workflow(name, wf3, i)
                deadline = time.monotonic() + 60 + args.queue_n
                while time.monotonic() < deadline:
                    done, last = stats.execute(
                        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), max(updated_at) "
                        "FROM dbos.workflow_status WHERE queue_name = %s", [name]).fetchone()
                    if done >= args.queue_n:
                        break
                    time.sleep(0.05)
                else:
                    raise RuntimeError(f"DBOS queue: {done}/{args.queue_n} after the deadline")
                elapsed = last / 1000 - started
                result["queue_wf_per_s"] = args.queue_n / elapsed
                result["queue_steps_per_s"] = 3 * args.queue_n / elapsed
            finally:
                DBOS.delete_queue(name)
    finally:
        stats.close()
        DBOS.destroy()
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
