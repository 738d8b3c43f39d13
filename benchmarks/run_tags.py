"""The tag filter of ``GET runs/`` on a big runs table, measured in-process on PostgreSQL: the
p50 and p95 of the first page (``queries.runs_matching(tags=...)[:51]``, the query
``GET runs/?tag=customer:42`` runs) for one customer, a customer and a plan, a common tag,
and, as the baseline measured in the same run, the unfiltered first page.

    createdb -h 127.0.0.1 -U postgres queuety_runtags
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_runtags \\
        .venv/bin/python benchmarks/run_tags.py [--runs 1000000] [--repeat 50] [--keep]

The database is migrated, then loaded by tests/run_tag_data.py (one
``INSERT ... SELECT generate_series``, then ANALYZE): ``--runs`` runs (default 20,000; the
issue's figure is for 1,000,000), about 100 per customer. ``--keep`` measures the runs an
earlier call loaded. Prints JSON: the load's time, the table's and index's sizes, and per case
the p50/p95 milliseconds, the rows answered, the plan's scans, and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = 51


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=50,
                        help="Timed repetitions of each query (after one warm-up).")
    parser.add_argument("--keep", action="store_true",
                        help="Measure the runs already loaded by an earlier call.")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from tests import run_tag_data

    call_command("migrate", verbosity=0)
    report: dict[str, Any] = {"runs": args.runs}
    if args.keep:
        loaded = _loaded()
    else:
        started = time.perf_counter()
        loaded = run_tag_data.load(runs=args.runs, per_customer=100)
        report["load_seconds"] = round(time.perf_counter() - started, 1)
    report["sizes"] = _sizes()
    report["pages"] = measure(loaded, args.repeat)
    print(json.dumps(report, indent=2))


def _loaded() -> Any:
    from queuety.models import WorkflowDefinition, WorkflowRun
    from tests import run_tag_data

    name = WorkflowDefinition.objects.filter(name__startswith="tag", name__endswith="_wf") \
        .latest("pk").name
    prefix = name[:-len("wf")]
    customers = WorkflowRun.objects.filter(name=name).count() // 100
    return run_tag_data.Loaded(name, prefix, max(1, customers))


def _sizes() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_size_pretty(pg_relation_size(c.oid)) FROM pg_class c "
                       "WHERE c.relname IN ('queuety_workflowrun', 'queuety_run_tags')")
        return dict(cursor.fetchall())


def cases(loaded: Any) -> dict[str, Any]:
    from queuety import queries

    return {name: queries.runs_matching(tags=tags)[:PAGE] for name, tags in {
        "baseline: no filter": None,
        "tag=customer:<one of 1 in 100 runs>": {"customer": loaded.customer(7)},
        "tag=customer & tag=plan": {"customer": loaded.customer(11), "plan": "pro"},
        "tag=plan:team (a third of the runs)": {"plan": "team"},
        "tag=customer:<none>": {"customer": "nobody"},
    }.items()}


def measure(loaded: Any, repeat: int) -> dict[str, Any]:
    """p50/p95 milliseconds of each case, its rows, its plan's scans and its ratio to the
    unfiltered page's p50."""
    from django.db import connection

    found: dict[str, Any] = {}
    for name, queryset in cases(loaded).items():
        sql, params = queryset.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            timings = []
            for attempt in range(repeat + 1):
                started = time.perf_counter()
                cursor.execute(sql, params)
                rows = len(cursor.fetchall())
                if attempt:  # the first is the warm-up
                    timings.append((time.perf_counter() - started) * 1000)
        timings.sort()
        found[name] = {"p50_ms": round(statistics.median(timings), 2),
                       "p95_ms": round(timings[int(0.95 * (len(timings) - 1))], 2),
                       "rows": rows, "scans": _scans(plan[0]["Plan"])}
    base = found["baseline: no filter"]["p50_ms"] or 0.01
    for entry in found.values():
        entry["p50_vs_baseline"] = round(entry["p50_ms"] / base, 2)
    return found


def _scans(node: dict[str, Any]) -> list[str]:
    here = [f"{node['Node Type']} {node.get('Index Name') or ''}".strip()] \
        if node.get("Relation Name") == "queuety_workflowrun" or \
        str(node.get("Index Name", "")).startswith("queuety_") else []
    for child in node.get("Plans", ()):
        here += _scans(child)
    return here


if __name__ == "__main__":
    main()
