"""Queuety workloads, run from the driver process (Django set up on ``queuety_bench``).

- :func:`throughput`: N three-step no-op runs are dispatched to a queue no worker consumes
  yet; the clock starts when the worker is told to consume it (``add_consumer``) and stops
  at the last run's ``finished_at``. Also: committed transactions and new PostgreSQL
  sessions per step (``pg_stat_database`` deltas, our polling subtracted).
- :func:`latency`: one three-step run at a time (noop, noop2, notify); the client BLPOPs the
  key the last step LPUSHes, then polls the run row until it reads ``completed`` (so the
  last transition's commit is included). Both instants are reported.
- :func:`roundtrips`: in this process, with publishing captured, the SQL statements of
  ``dispatch`` and of each ``execute_step`` (``CaptureQueriesContext``) and their timings.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections import defaultdict

import psycopg
import redis

import queuety
from qbench import env
from qbench.util import Worker, db_counters, percentile

STEPS = ("qbench.steps.noop", "qbench.steps.noop2", "qbench.steps.noop3")
LATENCY_STEPS = ("qbench.steps.noop", "qbench.steps.noop2", "qbench.steps.notify")


def three_steps(queue: str, steps=STEPS) -> queuety.WorkflowBuilder:
    """The benchmark workflow: three no-op steps on ``queue``."""
    builder = queuety.workflow("qbench_three").on_queue(queue)
    for step in steps:
        builder = builder.then(step)
    return builder


class Stats:
    """An autocommit connection to ``queuety_bench`` for polling and pg_stat_database reads."""

    def __init__(self) -> None:
        self.conn = psycopg.connect(env.pg_url(env.QUEUETY_DB, "postgresql"), autocommit=True)
        self.queries = 0

    def one(self, sql: str, params=()):
        self.queries += 1
        return self.conn.execute(sql, params).fetchone()

    def counters(self, settle: bool = True) -> dict[str, int]:
        """pg_stat_database counters of queuety_bench (see :func:`qbench.util.db_counters`)."""
        found = db_counters(self.conn, env.QUEUETY_DB, settle)
        self.queries += found["reads"]
        return found

    def close(self) -> None:
        self.conn.close()


def preload(n: int, queue: str, steps=STEPS) -> tuple[int, int, float]:
    """Dispatch ``n`` runs to ``queue``; return (first id, last id, dispatches per second)."""
    builder = three_steps(queue, steps)
    started = time.perf_counter()
    ids = [builder.dispatch({"i": i, "token": uuid.uuid4().hex}) for i in range(n)]
    return ids[0], ids[-1], n / (time.perf_counter() - started)


def wait_done(stats: Stats, first: int, last: int, timeout: float) -> float:
    """Wait until runs first..last completed; return the epoch of the last ``finished_at``."""
    n = last - first + 1
    deadline = time.monotonic() + timeout
    while True:
        done, failed, end = stats.one(
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status = 'failed'), extract(epoch FROM max(finished_at)) "
            "FROM queuety_workflowrun WHERE id BETWEEN %s AND %s", [first, last])
        if failed:
            raise RuntimeError(f"{failed} benchmark runs failed (ids {first}..{last})")
        if done >= n:
            return float(end)
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {done}/{n} runs completed within {timeout:.0f}s")
        time.sleep(0.25)


def warm_up(worker: Worker, runs: int = 40) -> None:
    """Push a few runs through a fresh worker (imports, connections, caches)."""
    queue = f"qbench-warm-{uuid.uuid4().hex[:6]}"
    first, last, _ = preload(runs, queue)
    worker.consume(queue)
    stats = Stats()
    try:
        wait_done(stats, first, last, timeout=120)
    finally:
        stats.close()
        worker.ignore(queue)


def throughput(worker: Worker, n: int, account: bool = False) -> dict[str, float]:
    """N three-step runs through ``worker``: runs/s, steps/s; with ``account``, also the
    committed transactions, new sessions and rows written per step (waits for statistics to
    settle, ~10 s more)."""
    queue = f"qbench-tp-{uuid.uuid4().hex[:6]}"
    first, last, dispatch_rate = preload(n, queue)
    stats = Stats()
    try:
        before = stats.counters() if account else None
        polls_before = stats.queries
        started = time.time()
        worker.consume(queue)
        end = wait_done(stats, first, last, timeout=120 + n * 3 / 10)
        elapsed = end - started
        after = stats.counters() if account else None
        polls = stats.queries - polls_before
    finally:
        stats.close()
        worker.ignore(queue)
    steps = 3 * n
    result = {"runs_per_s": n / elapsed, "steps_per_s": steps / elapsed, "seconds": elapsed,
              "preload_dispatch_per_s": dispatch_rate}
    if account:
        # The runs were dispatched before ``before`` was read (and settled): these are the
        # workers' transactions only, our polls subtracted.
        result.update({
            "xact_per_step": (after["xact_commit"] - before["xact_commit"] - polls) / steps,
            "sessions_per_step": (after["sessions"] - before["sessions"]) / steps,
            "rows_inserted_per_step": (after["tup_inserted"] - before["tup_inserted"]) / steps,
            "rows_updated_per_step": (after["tup_updated"] - before["tup_updated"]) / steps,
        })
    return result


def latency(worker: Worker, samples: int, warmup: int = 20) -> dict[str, float]:
    """p50/p95 of dispatch -> last step ran (BLPOP) and dispatch -> run completed (ms)."""
    queue = f"qbench-lat-{uuid.uuid4().hex[:6]}"
    builder = three_steps(queue, LATENCY_STEPS)
    client = redis.Redis.from_url(env.REDIS_URL)
    stats = Stats()
    worker.consume(queue)
    to_last, to_done = [], []
    try:
        for i in range(warmup + samples):
            key = f"qbench:lat:{uuid.uuid4().hex}"
            started = time.perf_counter()
            run_id = builder.dispatch({"i": i, "done_key": key})
            if client.blpop([key], timeout=30) is None:
                raise RuntimeError(f"latency run {run_id} did not reach its last step in 30 s")
            signalled = time.perf_counter()
            deadline = signalled + 10
            while stats.one("SELECT status FROM queuety_workflowrun WHERE id = %s",
                            [run_id])[0] != "completed":
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"latency run {run_id} did not complete")
                time.sleep(0.0002)
            done = time.perf_counter()
            if i >= warmup:
                to_last.append((signalled - started) * 1000)
                to_done.append((done - started) * 1000)
    finally:
        worker.ignore(queue)
        stats.close()
        client.close()
    return {"p50_ms": statistics.median(to_done), "p95_ms": percentile(to_done, 95),
            "last_step_p50_ms": statistics.median(to_last),
            "last_step_p95_ms": percentile(to_last, 95)}


INLINE_PHASE = "3 steps, one task (inline)"


def roundtrips(runs: int = 100) -> dict:
    """SQL statements of dispatch and of each step boundary, executed in this process.

    Publishing is captured (no broker). ``CaptureQueriesContext`` lists the statements Django
    sends (BEGIN and COMMIT included); their times come from a ``connection.execute_wrapper``
    (``perf_counter``) and a timed ``connection._commit``, because the captured times are
    rounded to the millisecond. psycopg 3 sends BEGIN just before the first statement of a
    transaction, so that statement's time includes the BEGIN round trip. Returns, per phase,
    the statement kinds (checked identical across runs), median per-statement times, the
    median wall time, and the median ``workflow_status`` time on this small database.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queuety import publish
    from queuety.runtime import attempt

    builder = three_steps("qbench-captured")
    shapes: dict[str, list[str]] = {}
    times: dict[str, list[list[float]]] = defaultdict(list)
    walls: dict[str, list[float]] = defaultdict(list)
    status_ms: list[float] = []
    timings: list[float] = []

    def timed(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            timings.append(time.perf_counter() - started)

    connection.ensure_connection()
    plain_commit = connection._commit

    def timed_commit():
        started = time.perf_counter()
        try:
            return plain_commit()
        finally:
            timings.append(time.perf_counter() - started)

    def measure(phase: str, call, keep: bool):
        timings.clear()
        with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(timed):
            started = time.perf_counter()
            value = call()
            wall = time.perf_counter() - started
        kinds = [q["sql"].split()[0] for q in captured.captured_queries]
        if keep:  # the first runs also create the definition row and warm caches
            if phase in shapes and shapes[phase] != kinds:
                raise AssertionError(f"{phase}: statements changed: {shapes[phase]} -> {kinds}")
            shapes[phase] = kinds
            # BEGIN has no timing of its own (sent with the next statement): give it 0.
            per = list(timings)
            if "BEGIN" in kinds:
                per.insert(kinds.index("BEGIN"), 0.0)
            times[phase].append(per)
            walls[phase].append(wall)
        return value

    connection._commit = timed_commit
    try:
        for i in range(runs + 5):
            keep = i >= 5
            # Each step from its own message (inline continuation off), as a step that
            # follows a timed one, or that passes the inline bound, runs.
            with publish.captured() as sent:
                run_id = measure("dispatch", lambda: builder.dispatch(
                    {"i": i, "token": uuid.uuid4().hex}), keep)
                for index, phase in enumerate(("step 1", "step 2", "step 3 (last)")):
                    step_run_id = sent[index].step_run_id
                    measure(phase, lambda: attempt.execute_step(step_run_id, inline=False),
                            keep)
            started = time.perf_counter()
            assert queuety.workflow_status(run_id).status == "completed"
            if keep:
                status_ms.append((time.perf_counter() - started) * 1000)
            # As a worker runs it: one message, the next two steps inline.
            with publish.captured() as sent:
                run_id = builder.dispatch({"i": i, "token": uuid.uuid4().hex})
                step_run_id = sent[0].step_run_id
                measure(INLINE_PHASE, lambda: attempt.execute_step(step_run_id), keep)
                assert len(sent) == 1, "the second and third steps did not run inline"
            assert queuety.workflow_status(run_id).status == "completed"
    finally:
        del connection._commit
    result = {}
    for phase, kinds in shapes.items():
        per_statement = [statistics.median(column) * 1000 for column in zip(*times[phase])]
        result[phase] = {
            "statements": kinds, "round_trips": len(kinds),
            "statement_ms": [round(ms, 3) for ms in per_statement],
            "sql_ms": round(sum(per_statement), 3),
            "wall_ms": round(statistics.median(walls[phase]) * 1000, 3),
        }
    result["workflow_status_ms"] = round(statistics.median(status_ms), 3)
    return result
