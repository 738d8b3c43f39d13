"""What signals, metrics and tracing cost: throughput and round trips, everything on vs off.

    DATABASE_URL=postgres://... CELERY_BROKER_URL=redis://.../N .venv/bin/python \
        benchmarks/observability.py [--n 400] [--rounds 3] [--concurrency 2]

Three prefork workers, one per mode, idle until told to consume:

- ``off``: no receiver, metrics and tracing off (what a site that uses none of them runs);
- ``signals+metrics``: one receiver on every signal, ``QUEUETY["METRICS"]`` on in
  prometheus-client's multiprocess mode;
- ``all``: the same plus ``QUEUETY["TRACING"]``, an SDK tracer provider with a batch processor
  and the in-memory exporter.

Each round dispatches ``--n`` three-step no-op runs to a queue nobody consumes, points one
worker at it and stops the clock at the last run's ``finished_at`` (as benchmarks/run does);
the modes take turns within each round, so a noisy neighbour hits them alike. The round trips
of one step are counted in this process (``CaptureQueriesContext``) with the same switches.
Prints a Markdown table.

``--cpu`` measures in this process instead, with publishing captured (no broker): the modes
take turns in blocks of ``--n`` three-step runs, each block's CPU time (``process_time``, which
leaves out the time spent waiting for PostgreSQL) per step, median of ``--rounds`` blocks. On a
shared, loaded machine the wall-clock throughput is noise; the CPU a step adds is the cost.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qbench.obs.settings")

MODES = {
    "off": {},
    "signals+metrics": {"QBENCH_OBS_SIGNALS": "1", "PROMETHEUS_MULTIPROC_DIR": ""},
    "all": {"QBENCH_OBS_SIGNALS": "1", "PROMETHEUS_MULTIPROC_DIR": "",
            "QBENCH_OBS_TRACING": "1"},
}
STEPS = ("qbench.steps.noop", "qbench.steps.noop2", "qbench.steps.noop3")


def start_worker(mode: str, concurrency: int, folder: Path) -> tuple[subprocess.Popen, str]:
    node = f"obs-{mode.replace('+', '-')}-{uuid.uuid4().hex[:6]}@localhost"
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}",
               "DJANGO_SETTINGS_MODULE": "qbench.obs.settings"}
    for key, value in MODES[mode].items():
        if key == "PROMETHEUS_MULTIPROC_DIR":
            value = str(folder / mode)
            shutil.rmtree(value, ignore_errors=True)
            os.makedirs(value)
        environ[key] = value
    log = open(folder / f"worker-{mode}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "project", "worker", "--pool", "prefork",
         "--concurrency", str(concurrency), "--loglevel", "WARNING", "-Q",
         f"obs-idle-{uuid.uuid4().hex[:6]}", "-n", node, "--without-gossip",
         "--without-mingle"], cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    return proc, node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=400, help="runs per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--cpu", action="store_true", help="measure CPU per step in-process")
    args = parser.parse_args()
    if args.cpu:
        cpu(args.n, args.rounds)
        return

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import queuety
    from project.celery import app
    from queuety.models import WorkflowRun

    folder = Path(tempfile.mkdtemp(prefix="qbench-obs-"))
    workers = {mode: start_worker(mode, args.concurrency, folder) for mode in MODES}
    try:
        for mode, (_, node) in workers.items():
            deadline = time.monotonic() + 90
            while not app.control.ping(destination=[node], timeout=0.5):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {mode} did not start ({folder})")
        results: dict[str, list[float]] = {mode: [] for mode in MODES}
        for round_no in range(args.rounds + 1):  # round 0 warms every worker up
            for mode, (_, node) in workers.items():
                queue = f"obs-{uuid.uuid4().hex[:8]}"
                builder = queuety.workflow("qbench_obs").on_queue(queue)
                for step in STEPS:
                    builder = builder.then(step)
                n = 40 if round_no == 0 else args.n
                ids = [builder.dispatch({"i": i}) for i in range(n)]
                started = time.time()
                app.control.add_consumer(queue, destination=[node], reply=True)
                while WorkflowRun.objects.filter(pk__in=ids, status="completed").count() < n:
                    time.sleep(0.2)
                end = max(WorkflowRun.objects.filter(pk__in=ids)
                          .values_list("finished_at", flat=True)).timestamp()
                app.control.cancel_consumer(queue, destination=[node], reply=True)
                if round_no:
                    results[mode].append(3 * n / (end - started))
                    print(f"round {round_no} {mode}: {results[mode][-1]:.0f} steps/s",
                          file=sys.stderr)
        off = statistics.median(results["off"])
        print("| mode | steps/s (median of rounds) | rounds | vs off |")
        print("|---|---|---|---|")
        for mode, values in results.items():
            median = statistics.median(values)
            print(f"| {mode} | {median:.0f} | {', '.join(f'{v:.0f}' for v in values)} | "
                  f"{median / off - 1:+.1%} |")
    finally:
        for proc, _ in workers.values():
            proc.terminate()
        for proc, _ in workers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def cpu(n: int, rounds: int) -> None:
    """CPU time per step in this process for each mode, the modes taking turns."""
    folder = tempfile.mkdtemp(prefix="qbench-obs-cpu-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder  # before prometheus-client is imported
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import queuety
    from queuety import publish, signals
    from queuety.runtime import attempt

    call_command("migrate", verbosity=0)
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    builder = queuety.workflow("qbench_obs_cpu")
    for step in STEPS:
        builder = builder.then(step)
    received = []

    def receiver(sender, signal, **arguments):
        received.append(1)

    def block(mode: str) -> tuple[float, float]:
        on = mode != "off"
        for kind in signals.EVENTS.values():
            if on:
                kind.signal.connect(receiver, weak=False, dispatch_uid="qbench-cpu")
            else:
                kind.signal.disconnect(dispatch_uid="qbench-cpu")
        with override_settings(QUEUETY={**getattr(settings, "QUEUETY", {}), "METRICS": on,
                                        "TRACING": mode == "all"}):
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            with publish.captured() as sent:
                for i in range(n):
                    builder.dispatch({"i": i})
                for message in list(sent):
                    attempt.execute_step(message.step_run_id)
            steps = 3 * n
            return ((time.process_time() - cpu_start) / steps * 1e6,
                    (time.perf_counter() - wall_start) / steps * 1e6)

    for mode in MODES:  # warm up
        block(mode)
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            results[mode].append(block(mode))
            exporter.clear()
    off = statistics.median(c for c, _ in results["off"])
    print("| mode | CPU per step, µs (median) | wall per step, µs (median) | CPU vs off |")
    print("|---|---|---|---|")
    for mode, values in results.items():
        median = statistics.median(c for c, _ in values)
        wall = statistics.median(w for _, w in values)
        print(f"| {mode} | {median:.0f} | {wall:.0f} | {median - off:+.0f} µs "
              f"({median / off - 1:+.1%}) |")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
