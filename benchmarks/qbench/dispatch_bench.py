"""Dispatch benchmarks, run as a subprocess that forks its dispatching processes.

``rate``: P processes each call ``dispatch()`` C times, all released together by a barrier;
the result is P*C / (last finish - release). The workflow is on its own queue that no worker
consumes (``.on_queue()``); the queue is deleted from Redis afterwards.

``race``: P processes dispatch the SAME idempotency key at the same instant. Asserts that they
all got one run id, and that exactly one run, one first step row, one dispatch-key row and one
Celery message exist; prints the wall time of the race.

The parent sets Django up and creates the definition row before forking, then closes its
connection, so children inherit no socket (each opens its own database and broker
connection). Usage:

    python -m qbench.dispatch_bench rate --procs 8 --count 250
    python -m qbench.dispatch_bench race --procs 32
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import uuid

from qbench import env


def _child(builder, count: int, barrier, results, key_mode: bool) -> None:
    from django.db import connection

    ids = []
    connection.ensure_connection()  # connect before the start line, like a running server
    barrier.wait(timeout=120)
    started = time.time()
    for i in range(count):
        ids.append(builder.dispatch({"i": i}))
    results.put((started, time.time(), ids))
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["rate", "race"])
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    env.setup_django()

    import redis
    from django.db import connections

    import queuety
    from queuety.models import DispatchKey, StepRun, WorkflowRun
    from queuety.store.definitions import definition_id

    token = uuid.uuid4().hex[:10]
    queue = f"qbench-unconsumed-{token}"
    builder = (queuety.workflow("qbench_dispatch").on_queue(queue)
               .then("qbench.steps.noop").then("qbench.steps.noop2").then("qbench.steps.noop3"))
    key = None
    if args.mode == "race":
        key = f"qbench-race-{token}"
        builder = builder.idempotency_key(key)
        args.count = 1
    definition_id(builder.build())
    connections.close_all()

    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.procs + 1)
    results = ctx.Queue()
    children = [ctx.Process(target=_child, args=(builder, args.count, barrier, results,
                                                 key is not None)) for _ in range(args.procs)]
    for child in children:
        child.start()
    client = redis.Redis.from_url(env.REDIS_URL)
    try:
        barrier.wait(timeout=120)
        released = time.time()
        outcomes = [results.get(timeout=300) for _ in children]
        for child in children:
            child.join(timeout=60)
        failed = [c.exitcode for c in children if c.exitcode != 0]
        if failed:
            raise RuntimeError(f"dispatching processes failed: exit codes {failed}")
        finished = max(end for _, end, _ in outcomes)
        ids = [run_id for _, _, batch in outcomes for run_id in batch]
        total = len(ids)
        out = {"procs": args.procs, "dispatches": total,
               "seconds": finished - released, "per_s": total / (finished - released)}
        if key is not None:
            runs = WorkflowRun.objects.filter(idempotency_key=key)
            checks = {
                "distinct_ids": len(set(ids)),
                "runs": runs.count(),
                "first_steps": StepRun.objects.filter(run__in=runs).count(),
                "dispatch_keys": DispatchKey.objects.filter(key=key).count(),
                "messages": client.llen(queue),
            }
            out["checks"] = checks
            out["exactly_one"] = all(value == 1 for value in checks.values())
        else:
            out["messages"] = client.llen(queue)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(timeout=10)
        client.delete(queue)
        client.close()
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
