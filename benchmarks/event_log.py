"""The cross-run event log on a big event table, measured in-process on PostgreSQL: the p50
and p95 of each filter's first page (as ``GET events/`` and ``manage.py queuety log`` read
it), of a page deep in the table (a cursor ten days back) and of a ``--follow`` poll.

    createdb -h 127.0.0.1 -U postgres queuety_eventlog
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_eventlog \\
        .venv/bin/python benchmarks/event_log.py [--events 10000000] [--runs 100000] \\
        [--repeat 30] [--keep]

The database is migrated, then loaded by tests/event_log_data.py (one
``INSERT ... SELECT generate_series``, then ANALYZE): ``--events`` events over ``--runs`` runs
of 20 workflows, one every 0.25 s back from now (10,000,000 events span about 29 days). A
second call with ``--keep`` measures the rows already there. Prints JSON: the load's time,
the table's and indexes' sizes, and per filter the p50/p95 milliseconds, the rows answered and
the plan's scans of the event table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = 51


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=30,
                        help="Timed repetitions of each query (after one warm-up).")
    parser.add_argument("--keep", action="store_true",
                        help="Measure the events already loaded by an earlier call.")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    report: dict[str, Any] = {"events": args.events, "runs": args.runs}
    if not args.keep:
        from tests import event_log_data

        started = time.perf_counter()
        loaded = event_log_data.load(events=args.events, runs=args.runs, spacing=0.25,
                                     batch=10_000)
        report["load_seconds"] = round(time.perf_counter() - started, 1)
        prefix = loaded.prefix
    else:
        prefix = _prefix()
    report["sizes"] = _sizes()
    report["pages"] = measure(prefix, args.repeat)
    print(json.dumps(report, indent=2))


def _prefix() -> str:
    from queuety.models import WorkflowDefinition

    name = WorkflowDefinition.objects.filter(name__startswith="evlog_").latest("pk").name
    return name[:name.index("_", len("evlog_")) + 1]


def _sizes() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_size_pretty(pg_relation_size(c.oid)) FROM pg_class c "
                       "WHERE c.relname LIKE 'queuety_event%%' ORDER BY c.relname")
        return dict(cursor.fetchall())


def cases(prefix: str) -> dict[str, Any]:
    """Each filter's first page, and a deep page and a follow poll, as querysets."""
    from django.utils import timezone

    from queuety import events_query
    from queuety.events_query import EventFilters
    from queuety.models import WorkflowRun

    runs = WorkflowRun.objects.filter(name__startswith=prefix)
    run = runs.order_by("pk").values_list("pk", flat=True)[500]
    now = timezone.now()
    filters = {
        "no filter": EventFilters(),
        "event=step_failed": EventFilters(kind="step_failed"),
        "run": EventFilters(run_id=run),
        "workflow": EventFilters(workflow=f"{prefix}wf3"),
        "workflow (one run)": EventFilters(workflow=f"{prefix}rare"),
        "error_type": EventFilters(error_type="myapp.errors.RateLimited"),
        "since=1h": EventFilters(since=now - timedelta(hours=1)),
        "event and since=1h": EventFilters(kind="step_retried", since=now - timedelta(hours=1)),
        "workflow and event": EventFilters(workflow=f"{prefix}wf1", kind="step_failed"),
        "error_type and workflow": EventFilters(error_type="KeyError",
                                                workflow=f"{prefix}wf2"),
    }
    pages: dict[str, Any] = {name: events_query.events_matching(f)[:PAGE]
                             for name, f in filters.items()}
    deep = now - timedelta(days=10)
    pages["event, a page 10 days back"] = events_query.events_matching(
        EventFilters(kind="step_completed")).filter(created_at__lt=deep)[:PAGE]
    pages["follow poll"] = events_query.after(events_query.events_matching(EventFilters()),
                                              now - timedelta(seconds=5), 0)[:500]
    return pages


def measure(prefix: str, repeat: int) -> dict[str, Any]:
    """p50/p95 milliseconds of each case, its rows, and the scans of its plan."""
    from django.db import connection

    found: dict[str, Any] = {}
    for name, queryset in cases(prefix).items():
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
    return found


def _scans(node: dict[str, Any]) -> list[str]:
    here = [f"{node['Node Type']} {node.get('Index Name') or ''}".strip()] \
        if node.get("Relation Name") == "queuety_event" or "Index Name" in node and \
        str(node.get("Index Name", "")).startswith("queuety_event") else []
    for child in node.get("Plans", ()):
        here += _scans(child)
    return here


if __name__ == "__main__":
    main()
