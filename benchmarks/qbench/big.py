"""Status queries on a database holding 1,000,000 runs (``benchmarks/run --big``).

``queuety_big`` is re-created and migrated with the working tree's code, then loaded with one
``INSERT ... SELECT generate_series``: every row copies a template run created through the ORM
(so columns added later get their defaults) and points at one real ``WorkflowDefinition``.
85 % completed, 10 % failed, 5 % running. Then, on random ids: ``workflow_status()``,
``call_command("queuety", "workflow", "status", id)`` in-process, the CLI as a new process each
time, and ``list_workflows(status="running")``; ``manage.py version`` gives the process
start-up cost for scale.

Usage (the driver does it): python -m qbench.big --runs 1000000
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import subprocess
import sys
import time

from qbench import env
from qbench.util import percentile


def _timed(call, count: int, warmup: int = 20) -> tuple[float, float]:
    samples = []
    for i in range(warmup + count):
        started = time.perf_counter()
        call()
        if i >= warmup:
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), percentile(samples, 95)


def load(runs: int) -> dict:
    """Fill queuety_big with ``runs`` runs; return timing and size."""
    from django.db import connection

    import queuety
    from queuety.models import WorkflowRun
    from queuety.store.definitions import definition_id

    spec = (queuety.workflow("qbench_big").then("qbench.steps.noop")
            .then("qbench.steps.noop2").then("qbench.steps.noop3").build())
    template = WorkflowRun.objects.create(definition_id=definition_id(spec),
                                          name=spec.name, state={}, total_steps=3)
    columns = [f.column for f in WorkflowRun._meta.concrete_fields if not f.primary_key]
    overrides = {
        "state": "jsonb_build_object('i', g, 'token', md5(g::text))",
        "status": "CASE WHEN g %% 20 = 0 THEN 'running' WHEN g %% 10 = 5 THEN 'failed' "
                  "ELSE 'completed' END",
        "current_step": "CASE WHEN g %% 20 = 0 THEN 1 WHEN g %% 10 = 5 THEN 2 ELSE 3 END",
        "transitions": "CASE WHEN g %% 20 = 0 THEN 1 WHEN g %% 10 = 5 THEN 2 ELSE 3 END",
        "revision": "3",
        "error": "CASE WHEN g %% 10 = 5 AND g %% 20 <> 0 THEN jsonb_build_object("
                 "'type', 'ValueError', 'message', 'boom ' || g, 'step', 'noop3') END",
        "created_at": "now() - make_interval(secs => %(runs)s - g)",
        "updated_at": "now() - make_interval(secs => %(runs)s - g)",
        "finished_at": "CASE WHEN g %% 20 <> 0 THEN now() - make_interval(secs => %(runs)s - g) "
                       "END",
    }
    select = ", ".join(overrides.get(c, f't."{c}"') for c in columns)
    names = ", ".join(f'"{c}"' for c in columns)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO queuety_workflowrun ({names}) "
            f"SELECT {select} FROM queuety_workflowrun AS t, generate_series(1, %(runs)s - 1) AS g "
            "WHERE t.id = %(template)s", {"runs": runs, "template": template.pk})
        cursor.execute("VACUUM ANALYZE queuety_workflowrun")
        cursor.execute("SELECT count(*), pg_size_pretty(pg_total_relation_size("
                       "'queuety_workflowrun')) FROM queuety_workflowrun")
        count, size = cursor.fetchone()
    return {"runs": count, "load_seconds": time.perf_counter() - started, "table_size": size}


def measure(calls: int = 2000, cli_calls: int = 10) -> dict:
    from django.core.management import call_command
    from django.db import connection

    import queuety

    with connection.cursor() as cursor:
        cursor.execute("SELECT min(id), max(id) FROM queuety_workflowrun")
        low, high = cursor.fetchone()
    pick = random.Random(7)
    result: dict = {"calls": calls, "cli_calls": cli_calls}
    result["status_p50_ms"], result["status_p95_ms"] = _timed(
        lambda: queuety.workflow_status(pick.randint(low, high)), calls)
    result["command_p50_ms"], result["command_p95_ms"] = _timed(
        lambda: call_command("queuety", "workflow", "status", str(pick.randint(low, high)),
                             stdout=io.StringIO()), min(calls, 500))
    result["list_p50_ms"], result["list_p95_ms"] = _timed(
        lambda: queuety.list_workflows(status="running", limit=50), 100)

    def cli(*args: str) -> None:
        subprocess.run([sys.executable, str(env.ROOT / "manage.py"), *args], check=True,
                       capture_output=True, env=env.django_env(env.BIG_DB), timeout=120)

    result["cli_p50_ms"], result["cli_p95_ms"] = _timed(
        lambda: cli("queuety", "workflow", "status", str(pick.randint(low, high))),
        cli_calls, warmup=1)
    result["python_startup_ms"], _ = _timed(lambda: cli("version"), cli_calls, warmup=1)
    return result


def run(runs: int = 1_000_000) -> dict:
    """Driver entry: re-create queuety_big, then load and measure in a subprocess."""
    from qbench import setup, util

    setup.recreate(env.BIG_DB)
    setup.migrate(env.BIG_DB)
    return util.run_json([sys.executable, "-m", "qbench.big", "--runs", str(runs)],
                         environ=env.django_env(env.BIG_DB),
                         log=env.RESULTS_DIR / "logs" / "big.log", timeout=3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    args = parser.parse_args()
    env.setup_django(env.BIG_DB)
    result = load(args.runs)
    result.update(measure())
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
