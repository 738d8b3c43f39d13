"""The deploy check on 100,000 live runs, measured in-process on PostgreSQL.

    createdb -h 127.0.0.1 -U postgres queuety_deploy_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_deploy_bench \\
        .venv/bin/python benchmarks/deploy_check.py [--live 100000] [--finished 200000]

Loads ``--live`` live runs (running, waiting for a signal or for workflows, paused) spread over
five definitions, one of which names a handler that no longer imports, and ``--finished``
completed runs beside them (bulk inserts, in the database's own rows; nothing runs), then
times ``queuety.deploy_check.deploy_check()`` (what ``manage.py queuety deploy-check`` and the
system check ``queuety.E005`` do): the first call (imports included) and the median of
``--rounds`` more. Prints, as JSON, the statements it ran, the wall times and the plan of the
grouped count. The rows are deleted again at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATUSES = ("running", "waiting_for_signal", "waiting_for_workflows", "paused")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", type=int, default=100_000)
    parser.add_argument("--finished", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import queuety
    from queuety import deploy_check
    from queuety.models import WorkflowDefinition, WorkflowRun
    from queuety.store.definitions import definition_id

    call_command("migrate", verbosity=0)
    steps = "qbench.steps"
    specs = [(queuety.workflow(f"deploy_bench_{n}").then(f"{steps}.noop")
              .wait_for_approval().then(f"{steps}.noop2").compensate_with(f"{steps}.noop3")
              .build()) for n in range(4)]
    broken = queuety.workflow("deploy_bench_renamed").then(f"{steps}.noop").build().to_dict()
    broken["steps"][0]["handler"] = f"{steps}.renamed_away"  # a deploy renamed it
    named = [(definition_id(spec), spec.name) for spec in specs] + [(
        WorkflowDefinition.objects.create(name="deploy_bench_renamed", definition=broken,
                                          definition_hash="f" * 64).pk, "deploy_bench_renamed")]
    ids = [pk for pk, _ in named]
    loaded = time.perf_counter()
    load(WorkflowRun, named, args.live, STATUSES)
    load(WorkflowRun, named, args.finished, ("completed",))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queuety_workflowrun")
    loading = time.perf_counter() - loaded

    def timed():
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            report = deploy_check.deploy_check()
            return time.perf_counter() - started, report, captured.captured_queries

    first, report, queries = timed()
    walls = [timed()[0] for _ in range(args.rounds)]
    assert sum(sum(d.live.values()) for d in report.definitions) >= args.live
    assert [d.name for d in report.definitions if not d.ok] == ["deploy_bench_renamed"]
    grouped = queries[0]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + grouped)
        plan = [row[0] for row in cursor.fetchall()]
    print(json.dumps({
        "live_runs": args.live, "finished_runs": args.finished, "definitions": len(ids),
        "load_seconds": round(loading, 1), "statements": len(queries),
        "first_call_ms": round(first * 1000, 1),
        "median_ms": round(statistics.median(walls) * 1000, 1),
        "queries_ms": [float(q["time"]) * 1000 for q in queries],
        "grouped_count_plan": plan,
    }, indent=1))
    with connection.cursor() as cursor:  # the loaded runs have no rows of their own
        cursor.execute("DELETE FROM queuety_workflowrun WHERE definition_id = ANY(%s)", [ids])


def load(model, definitions: list[tuple[int, str]], count: int,
         statuses: tuple[str, ...]) -> None:
    """Insert ``count`` runs, spread over ``definitions`` and ``statuses``, in batches."""
    batch = 10_000
    for start in range(0, count, batch):
        model.objects.bulk_create([
            model(definition_id=definitions[n % len(definitions)][0],
                  name=definitions[n % len(definitions)][1],
                  status=statuses[n % len(statuses)], state={"n": n}, current_step=1,
                  total_steps=3)
            for n in range(start, min(start + batch, count))])


if __name__ == "__main__":
    main()
