"""Worker memory over a long run (``benchmarks/run --memory``): a leak check.

One worker as shipped (project.settings, 2 prefork processes) consumes a stream of three-step
no-op runs, dispatched by the driver in batches of 200 while at most ~600 runs are waiting.
The RSS of the worker's main process and of its pool processes (VmRSS, /proc) is read when the
completed steps cross 1,000, 10,000, 30,000, 60,000 and the target (100,000 by default).
"""

from __future__ import annotations

import math
import time
import uuid

from qbench import env, queuety_bench
from qbench.util import Worker

CHECKPOINTS = (1_000, 10_000, 30_000, 60_000, 100_000)


def run(target_steps: int = 100_000, settings_module: str = "project.settings") -> dict:
    worker = Worker("project", 2, label="memory",
                    environ={**env.django_env(), "DJANGO_SETTINGS_MODULE": settings_module})
    checkpoints = sorted({c for c in CHECKPOINTS if c < target_steps} | {target_steps})
    runs_needed = math.ceil(target_steps / 3)
    queue = f"qbench-mem-{uuid.uuid4().hex[:6]}"
    builder = queuety_bench.three_steps(queue)
    stats = queuety_bench.Stats()
    points = []
    try:
        worker.start()
        queuety_bench.warm_up(worker)
        worker.consume(queue)
        first = last = None
        dispatched = done = 0
        started = time.monotonic()
        deadline = started + 600 + target_steps / 20
        while checkpoints:
            if first is not None:
                done = stats.one("SELECT count(*) FROM queuety_workflowrun WHERE id BETWEEN %s "
                                 "AND %s AND status = 'completed'", [first, last])[0]
                failed = stats.one("SELECT count(*) FROM queuety_workflowrun WHERE id BETWEEN "
                                   "%s AND %s AND status = 'failed'", [first, last])[0]
                if failed:
                    raise RuntimeError(f"{failed} runs failed")
            while checkpoints and done * 3 >= checkpoints[0]:
                points.append({"steps": checkpoints.pop(0), "steps_actual": done * 3,
                               **worker.rss_kib()})
            if dispatched < runs_needed and dispatched - done < 600:
                for _ in range(min(200, runs_needed - dispatched)):
                    last = builder.dispatch({"i": dispatched, "token": uuid.uuid4().hex})
                    first = first or last
                    dispatched += 1
            else:
                time.sleep(0.5)
            if time.monotonic() > deadline:
                raise RuntimeError(f"memory run: only {done * 3} steps before the deadline")
        elapsed = time.monotonic() - started
    finally:
        stats.close()
        worker.stop()
    growth = points[-1]["total"] - points[0]["total"]
    span = (points[-1]["steps"] - points[0]["steps"]) / 1000
    return {"points": points, "growth_kib": growth,
            "growth_per_1k_steps_kib": growth / span if span else 0.0,
            "steps_per_s": done * 3 / elapsed, "settings": settings_module}
