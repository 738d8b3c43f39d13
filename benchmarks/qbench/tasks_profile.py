"""Where a no-op job's time goes (``benchmarks/run --only tasks --profile``; issue 29).

Run as its own process under ``qbench.settings_tasks`` (``python -m qbench.tasks_profile``):

1. py-spy (``--idle --nonblocking``, 250 Hz) on both pool processes of Queuety's worker while
   it runs N no-op jobs (``qbench.tasks_bench.queuety_jobs``), attributed to the components of
   ``qbench.profile`` (inclusive shares of the busy samples), plus the share of the pool
   processes' time spent idle, waiting for the next message;
2. the same run's PostgreSQL sessions, sampled every 5 ms from ``pg_stat_activity``: what the
   worker's statements wait on while active (a commit's WAL flush is ``IO/WALSync``);
3. in this process, with publishing captured: the statements of ``enqueue()`` and of the
   job's ``execute_step``, and the median wall time of each.

Prints one JSON line. Raw py-spy files go to the run's results folder (``--out``).
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from qbench import tasks_bench


def _pg_waits(stop: threading.Event, found: collections.Counter) -> None:
    """Count (wait type, wait event) of the benchmark database's active client sessions."""
    import psycopg

    from qbench import env

    with psycopg.connect(env.pg_url(env.QUEUETY_DB, "postgresql"), autocommit=True) as conn:
        while not stop.is_set():
            for wait_type, event in conn.execute(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend' AND state = 'active'"):
                found[f"{wait_type or 'CPU'}/{event or '-'}"] += 1
            time.sleep(0.005)


def _idle_share(paths: list[Path]) -> float:
    """Percent of the pool processes' main-thread samples spent waiting for a message."""
    from qbench.profile import IDLE_MARKERS

    idle = total = 0
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, number = line.rpartition(" ")
            if "Worker.workloop" not in stack:
                continue
            total += int(number)
            if any(marker in stack for marker in IDLE_MARKERS):
                idle += int(number)
    return 100 * idle / total if total else 0.0


def pyspy_jobs(n: int, out_dir: Path) -> dict[str, Any]:
    """py-spy on a fresh Queuety worker's pool processes, and PostgreSQL's waits, over N jobs."""
    from qbench import util
    from qbench.profile import analyse_pyspy

    worker = util.Worker("project", 2, label="tasks-profile", environ=tasks_bench._environ())
    spies: list[subprocess.Popen] = []
    outputs: list[Path] = []
    waits: collections.Counter = collections.Counter()
    stop = threading.Event()
    sampler = threading.Thread(target=_pg_waits, args=(stop, waits), daemon=True)
    try:
        worker.start()
        tasks_bench.queuety_jobs(worker, 50)
        for pid in worker.pool_pids():
            outputs.append(out_dir / f"pyspy-jobs-{pid}.txt")
            spy = util.start([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                              str(pid), "--idle", "--nonblocking", "--rate", "250", "--format",
                              "raw", "--output", str(outputs[-1])],
                             log=out_dir / "pyspy-jobs.log")
            spies.append(spy)
        time.sleep(1.0)
        sampler.start()
        result = tasks_bench.queuety_jobs(worker, n)
    finally:
        stop.set()
        for spy in spies:  # SIGINT: py-spy writes its output and exits
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                util.stop(spy, signal.SIGKILL)
        worker.stop()
    present = [p for p in outputs if p.exists()]
    rows, meta = analyse_pyspy(present)
    sampled = sum(waits.values()) or 1
    return {"jobs_per_s_while_sampled": result["jobs_per_s"], "rows": rows, **meta,
            "busy_ms_per_job": 1000 * meta["busy_samples"] / 250 / n,
            "idle_percent": _idle_share(present),
            "pg_waits_percent": {k: 100 * v / sampled for k, v in waits.most_common(6)}}


def in_process(runs: int = 200) -> dict[str, Any]:
    """Statements and median wall time of enqueue() and of the job's execute_step."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from qbench import jobs_tasks
    from queuety import publish
    from queuety.runtime import attempt

    task = jobs_tasks.noop.using(queue_name="qbench-captured")
    walls: dict[str, list[float]] = {"enqueue": [], "execute_step": []}
    shapes: dict[str, list[str]] = {}
    for i in range(runs + 20):
        with publish.captured() as sent, CaptureQueriesContext(connection) as enq:
            started = time.perf_counter()
            task.enqueue()
            enqueued = time.perf_counter()
        with CaptureQueriesContext(connection) as ran:
            attempt.execute_step(sent[0].step_run_id)
            done = time.perf_counter()
        if i >= 20:
            walls["enqueue"].append((enqueued - started) * 1000)
            walls["execute_step"].append((done - enqueued) * 1000)
            shapes["enqueue"] = [q["sql"].split()[0] for q in enq.captured_queries]
            shapes["execute_step"] = [q["sql"].split()[0] for q in ran.captured_queries]
    return {phase: {"statements": shapes[phase],
                    "wall_ms_p50": round(statistics.median(walls[phase]), 3)}
            for phase in walls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qbench.tasks_profile")
    parser.add_argument("--n", type=int, default=1000, help="jobs sampled by py-spy")
    parser.add_argument("--out", type=Path, required=True, help="folder of the raw files")
    args = parser.parse_args(argv)
    tasks_bench._setup()
    from qbench import util

    try:
        result = {"pyspy": pyspy_jobs(args.n, args.out), "in_process": in_process()}
    finally:
        util.stop_all()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
