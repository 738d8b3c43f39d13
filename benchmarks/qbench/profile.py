"""Where the time of a step goes (``benchmarks/run --profile``).

1. py-spy (sampling, ``--idle --nonblocking``, 250 Hz) on both pool processes of a worker while
   it runs N three-step no-op runs, once per worker configuration (as shipped; connections
   kept). Samples spent waiting for the next task (billiard's receive) are dropped; the rest
   ("busy": CPU and waits on PostgreSQL/Redis while a task is handled) are attributed to
   components, inclusively (a component's share contains its parts).
2. pyinstrument around ``runtime.attempt.execute_step`` in this process (persistent connection,
   publishing captured), same components.
3. The cost of one real publish (``send_task("queuety.execute_step")`` to Redis, as
   ``queuety.publish`` sends it), timed alone.

Raw outputs (py-spy collapsed stacks, pyinstrument text) are kept in the run's results folder.
"""

from __future__ import annotations

import collections
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from qbench import env, queuety_bench
from qbench.util import STARTED, Worker

#: (label, function name, file suffix or None). Matching is on py-spy/pyinstrument frames.
COMPONENTS = [
    ("execute_step, total (queuety/runtime/attempt.py)", "execute_step",
     "queuety/runtime/attempt.py"),
    ("  claim (UPDATE ... RETURNING)", "claim", "queuety/runtime/claim.py"),
    ("  load_spec", "load_spec", "queuety/store/definitions.py"),
    ("  heartbeat thread start + stop (heartbeat)", "heartbeat", "queuety/runtime/watchdog.py"),
    ("  handler (call_handler)", "call_handler", "queuety/core/handlers.py"),
    ("  engine.advance", "advance", "queuety/core/engine.py"),
    ("  record_success (transition transaction)", "record_success",
     "queuety/runtime/outcome.py"),
    ("    the one statement (_complete_postgres)", "_complete_postgres",
     "queuety/runtime/outcome.py"),
    ("    json.dumps of state/output/events", "dumps", "json/__init__.py"),
    ("    COMMIT (Connection.commit)", "Connection.commit", "psycopg/connection.py"),
    ("    on-commit publish of the next step (publish)", "publish", "queuety/publish.py"),
    ("opening a PostgreSQL connection (BaseDatabaseWrapper.connect)",
     "BaseDatabaseWrapper.connect", "django/db/backends/base/base.py"),
    ("closing it: Celery's Django fixup (close_database)", "DjangoWorkerFixup.close_database",
     "celery/fixups/django.py"),
    ("waiting on PostgreSQL replies (psycopg Connection.wait)", "Connection.wait",
     "psycopg/connection.py"),
    ("Celery send_task (kombu publish to Redis)", "Celery.send_task", "celery/app/base.py"),
]

IDLE_MARKERS = ("Worker._make_protected_receive", "_SimpleQueue.get_payload")


def _frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for frame in stack.split(";"):
        name, _, where = frame.rpartition(" (")
        out.append((name or frame, where.rstrip(")").rsplit(":", 1)[0]))
    return out


def _matches(frame: tuple[str, str], function: str, suffix: str | None) -> bool:
    name, path = frame
    return (name == function or name.endswith("." + function)) and (
        suffix is None or path.endswith(suffix))


def analyse_pyspy(paths: list[Path]) -> tuple[list[tuple[str, float]], dict]:
    """Inclusive share of busy samples per component, over the given raw py-spy files."""
    busy = 0
    counts: collections.Counter = collections.Counter()
    in_task = outside_step = 0
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, number = line.rpartition(" ")
            if "Worker.workloop" not in stack:
                continue  # other threads (the heartbeat thread) and torn samples
            n = int(number)
            if any(marker in stack for marker in IDLE_MARKERS):
                continue
            busy += n
            frames = _frames(stack)
            for label, function, suffix in COMPONENTS:
                if any(_matches(f, function, suffix) for f in frames):
                    counts[label] += n
            if "trace_task" in stack:
                in_task += n
                if not any(_matches(f, "execute_step", "queuety/runtime/attempt.py") for f in frames):
                    outside_step += n
    rows = [(label, 100 * counts[label] / busy) for label, _, _ in COMPONENTS if busy]
    rows.append(("Celery task tracing around it (signals, ack; not execute_step)",
                 100 * outside_step / busy if busy else 0.0))
    rows.append(("pool process outside a task (IPC, result to the parent)",
                 100 * (busy - in_task) / busy if busy else 0.0))
    return rows, {"busy_samples": busy}


def pyspy_worker(settings_module: str, label: str, n: int, out_dir: Path) -> dict:
    """Record both pool processes of a fresh worker while it runs ``n`` runs."""
    worker = Worker("project", 2, label=f"profile-{label}",
                    environ={**env.django_env(), "DJANGO_SETTINGS_MODULE": settings_module})
    spies: list[subprocess.Popen] = []
    outputs: list[Path] = []
    stats = queuety_bench.Stats()
    queue = f"qbench-prof-{uuid.uuid4().hex[:6]}"
    rate = 250
    try:
        worker.start()
        queuety_bench.warm_up(worker)
        first, last, _ = queuety_bench.preload(n, queue)
        for pid in worker.pool_pids():
            output = out_dir / f"pyspy-{label}-{pid}.txt"
            outputs.append(output)
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
                 "--idle", "--nonblocking", "--rate", str(rate), "--format", "raw",
                 "--output", str(output)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            STARTED.append(spy)
            spies.append(spy)
        time.sleep(1.0)
        started = time.time()
        worker.consume(queue)
        end = queuety_bench.wait_done(stats, first, last, timeout=120 + n)
        elapsed = end - started
    finally:
        for spy in spies:  # SIGINT: py-spy writes its output and exits
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
            STARTED.remove(spy)
        stats.close()
        worker.stop()
    rows, meta = analyse_pyspy([p for p in outputs if p.exists()])
    steps = 3 * n
    busy_s = meta["busy_samples"] / rate
    return {"rows": rows, "steps": steps, "steps_per_s": steps / elapsed,
            "busy_ms_per_step": 1000 * busy_s / steps, **meta}


def pyinstrument_inprocess(runs: int, out_dir: Path) -> dict:
    """Profile execute_step in this process (persistent connection, publishing captured)."""
    from pyinstrument import Profiler

    from queuety import publish
    from queuety.runtime import attempt

    builder = queuety_bench.three_steps("qbench-captured")
    with publish.captured() as sent:
        for i in range(runs):
            builder.dispatch({"i": i, "token": uuid.uuid4().hex})
    pending = [m.step_run_id for m in sent]
    profiler = Profiler(interval=0.0005)
    steps = 3 * len(pending)  # a call may run the following steps inline
    with publish.captured() as more:
        profiler.start()
        started = time.perf_counter()
        while pending:
            for step_run_id in pending:
                attempt.execute_step(step_run_id)
            pending = [m.step_run_id for m in more]
            more.clear()
        elapsed = time.perf_counter() - started
        profiler.stop()
    (out_dir / "pyinstrument.txt").write_text(profiler.output_text(unicode=False, color=False))
    root = profiler.last_session.root_frame()
    totals: collections.Counter = collections.Counter()

    def walk(frame, active: frozenset) -> None:
        here = set(active)
        for label, function, suffix in COMPONENTS:
            if label in active:
                continue
            path = (frame.file_path or "")
            if (frame.function == function.split(".")[-1]) and (
                    suffix is None or path.endswith(suffix)):
                totals[label] += frame.time
                here.add(label)
        for child in frame.children:
            walk(child, frozenset(here))

    walk(root, frozenset())
    total = sum(totals[label] for label, f, _ in COMPONENTS if f == "execute_step") or elapsed
    rows = [(label, 100 * totals[label] / total) for label, _, _ in COMPONENTS
            if totals[label] and "Celery" not in label]
    return {"rows": rows, "steps": steps, "ms_per_step": 1000 * elapsed / steps}


def publish_cost(count: int = 500) -> float:
    """Median ms of one ``queuety.execute_step`` message, sent by name as ``queuety.publish``
    sends it, to a Redis queue nobody consumes."""
    import redis
    from celery import current_app

    queue = f"qbench-pubcost-{uuid.uuid4().hex[:6]}"
    samples = []
    try:
        for i in range(count + 20):
            started = time.perf_counter()
            current_app.send_task("queuety.execute_step", (0,), queue=queue, ignore_result=True)
            if i >= 20:
                samples.append((time.perf_counter() - started) * 1000)
    finally:
        client = redis.Redis.from_url(env.REDIS_URL)
        client.delete(queue)
        client.close()
    return statistics.median(samples)


def run(out_dir: Path, n: int = 1000) -> dict:
    shipped = pyspy_worker("project.settings", "shipped", n, out_dir)
    kept = pyspy_worker("qbench.settings_reuse", "keep", n, out_dir)
    inproc = pyinstrument_inprocess(max(100, n // 3), out_dir)
    publish_ms = publish_cost()
    labels = [label for label, _ in shipped["rows"]]
    kept_rows = dict(kept["rows"])
    return {
        "pyspy_table": [(label, dict(shipped["rows"])[label], kept_rows.get(label, 0.0))
                        for label in labels],
        "pyspy_shipped": shipped, "pyspy_keep": kept,
        "pyinstrument": inproc["rows"], "pyinstrument_ms_per_step": inproc["ms_per_step"],
        "publish_ms": publish_ms,
        "notes": (f"py-spy busy time per step: as shipped {shipped['busy_ms_per_step']:.1f} ms "
                  f"({shipped['steps_per_s']:.0f} steps/s while sampled), connections kept "
                  f"{kept['busy_ms_per_step']:.1f} ms ({kept['steps_per_s']:.0f} steps/s). "
                  f"In-process execute_step: {inproc['ms_per_step']:.2f} ms per step. One "
                  f"real publish (send_task to Redis): {publish_ms:.2f} ms."),
    }
