"""Resource control under load: concurrency groups, rate limits and keyed groups, measured
with two worker nodes (two ``celery worker -c 4`` processes) from a ledger of step start and
end times (docs/performance.md, "Resource control").

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<a database of your own> \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/<a db of your own> \\
        .venv/bin/python benchmarks/qbench/resources.py [--runs 200] [--nap 0.2]

The database named by DATABASE_URL is DROPPED and created afresh (the shared names
``queuety``, ``test_queuety`` and the main suite's ``queuety_bench`` are refused). The
workers consume a queue of their own (``qbench-res-<random>``); every process this starts is
stopped by its process group on exit. It prints Markdown tables and writes the raw figures to
``benchmarks/results/resources-<timestamp>.json``.

Workloads:

- **group**: ``--runs`` runs of one ``--nap`` s step in a group of limit 8: the peak
  concurrency the ledger shows, throughput against the ideal 8 / nap, and the time from a
  slot's release to the next waiting step's start (p50, p95).
- **rate**: ``--runs`` runs of a 10 ms step in a group with a rate limit of 20 per second:
  the most starts in any 1 s window (the gate's admissions and the handlers' starts) and the
  rate sustained.
- **tenants**: three tenants of a ``tenant:{tenant_id}`` group, limit 2 each, with 100, 20
  and 5 queued runs: each tenant's peak and when its last step finished.
- **shared budget**: the same three tenants, each with a limit of 8 of its own, on a queue
  whose cost budget of 4 they share (``qbench.settings_resources``): the queue's peak and when
  each tenant finished, against taking turns and against oldest first.
- **round trips**: the SQL statements of a plain step boundary (as in the main suite's
  ``roundtrips``) next to a step in a concurrency group.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BENCH_DIR = Path(__file__).resolve().parent.parent
ROOT = BENCH_DIR.parent
REFUSED = {"queuety", "test_queuety", "queuety_bench", "postgres", "template0", "template1"}


def _environment(ledger_dir: str, queue: str) -> dict[str, str]:
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        if not os.environ.get(name):
            sys.exit(f"qbench.resources: set {name} to a database / broker of your own.")
    db = urlsplit(os.environ["DATABASE_URL"]).path.lstrip("/")
    if db in REFUSED:
        sys.exit(f"qbench.resources: refusing to drop database {db!r}; name one of your own.")
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "qbench.settings_resources",
            "CELERY_TASK_DEFAULT_QUEUE": queue, "DJANGO_DEBUG": "0",
            "QUEUETY_LOG_LEVEL": "WARNING", "QUEUETY_PREPARED_STATEMENTS": "1",
            "QBENCH_LEDGER_DIR": ledger_dir, "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(BENCH_DIR), str(ROOT)])}


def _fresh_database() -> None:
    import psycopg

    url = urlsplit(os.environ["DATABASE_URL"])
    db = url.path.lstrip("/")
    admin = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')


def _ledger(ledger_dir: str, name: str) -> list[tuple[float, float, str]]:
    path = Path(ledger_dir) / name
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        started, ended, label, _ = line.split()
        rows.append((float(started), float(ended), label))
    return sorted(rows)


def peak(spans, label=None) -> int:
    mine = [(start, end) for start, end, own in spans if label in (None, own)]
    edges = sorted([(start, 1) for start, _ in mine] + [(end, -1) for _, end in mine])
    running = best = 0
    for _, change in edges:
        running += change
        best = max(best, running)
    return best


def max_in_window(times, window: float) -> int:
    times = sorted(times)
    best = first = 0
    for last, moment in enumerate(times):
        while moment - times[first] >= window:
            first += 1
        best = max(best, last - first + 1)
    return best


def _pct(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def _wait_done(run_ids, timeout: float) -> None:
    from queuety.models import WorkflowRun

    deadline = time.monotonic() + timeout
    while WorkflowRun.objects.filter(pk__in=run_ids).exclude(status="completed").exists():
        if time.monotonic() > deadline:
            left = WorkflowRun.objects.filter(pk__in=run_ids).exclude(status="completed")
            raise RuntimeError(f"{left.count()} runs unfinished after {timeout}s")
        time.sleep(0.1)


def baseline(ledger_dir: str, runs: int, nap: float, name: str) -> dict:
    """The same runs with no group at all: what these 8 processes do on this machine now."""
    import queuety

    flow = queuety.workflow(f"res_bench_{name}").then("qbench.resource_steps.ledgered")
    ids = [flow.dispatch({"nap": nap, "ledger": name}) for _ in range(runs)]
    _wait_done(ids, 60 + runs * nap)
    spans = _ledger(ledger_dir, name)
    elapsed = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    return {"runs": runs, "nap": nap, "peak": peak(spans),
            "throughput_per_s": round(len(spans) / elapsed, 2)}


def group_workload(ledger_dir: str, runs: int, nap: float) -> dict:
    import queuety
    from queuety.models import StepRun

    flow = queuety.workflow("res_bench_group").then(
        "qbench.resource_steps.ledgered", concurrency_group="bench-openai", concurrency_limit=8)
    ids = [flow.dispatch({"nap": nap, "ledger": "group"}) for _ in range(runs)]
    _wait_done(ids, 30 + runs * nap)
    spans = _ledger(ledger_dir, "group")
    starts = sorted(s for s, _, _ in spans)
    ends = sorted(e for _, e, _ in spans)
    elapsed = ends[-1] - starts[0]
    # With at most 8 at once, start k + 8 could only begin once the k-th step had ended: the
    # gap between the two is the time from a slot's release to the next waiting step's start.
    handoffs = [(starts[k + 8] - ends[k]) * 1000 for k in range(len(starts) - 8)]
    attempts = set(StepRun.objects.filter(run_id__in=ids).values_list("attempt", flat=True))
    return {"runs": runs, "nap": nap, "limit": 8, "steps": len(spans), "peak": peak(spans),
            "elapsed_s": round(elapsed, 3), "throughput_per_s": round(len(spans) / elapsed, 2),
            "ideal_per_s": round(8 / nap, 2),
            "of_ideal": round(len(spans) / elapsed / (8 / nap), 3),
            "handoff_ms_p50": round(statistics.median(handoffs), 1),
            "handoff_ms_p95": round(_pct(handoffs, 0.95), 1),
            "attempts_seen": sorted(attempts)}


def rate_workload(ledger_dir: str, runs: int) -> dict:
    import queuety
    from queuety.models import GroupStart

    flow = queuety.workflow("res_bench_rate").then(
        "qbench.resource_steps.ledgered", concurrency_group="bench-rate", rate_limit=(20, 1.0))
    ids = [flow.dispatch({"nap": 0.01, "ledger": "rate"}) for _ in range(runs)]
    _wait_done(ids, 60 + runs / 10)
    spans = _ledger(ledger_dir, "rate")
    starts = [s for s, _, _ in spans]
    admitted = [t.timestamp() for t in GroupStart.objects.filter(group="bench-rate")
                .values_list("started_at", flat=True)]
    sustained = (len(admitted) - 1) / (max(admitted) - min(admitted))
    return {"runs": runs, "limit_per_s": 20, "admissions": len(admitted),
            "max_admissions_in_1s": max_in_window(admitted, 1.0),
            "max_handler_starts_in_1s": max_in_window(starts, 1.0),
            "sustained_per_s": round(sustained, 2)}


def tenant_workload(ledger_dir: str, nap: float) -> dict:
    import queuety

    flow = queuety.workflow("res_bench_tenants").then(
        "qbench.resource_steps.ledgered", concurrency_group="bench-tenant:{tenant_id}",
        concurrency_limit=2)
    queued = {"a": 100, "b": 20, "c": 5}
    began = time.time()
    ids = [flow.dispatch({"nap": nap, "ledger": "tenants", "tenant_id": tenant,
                          "label": tenant})
           for tenant, count in queued.items() for _ in range(count)]
    _wait_done(ids, 60 + 125 * nap)
    spans = _ledger(ledger_dir, "tenants")
    result = {"nap": nap, "limit_per_tenant": 2, "tenants": {}}
    for tenant, count in queued.items():
        mine = [span for span in spans if span[2] == tenant]
        result["tenants"][tenant] = {
            "queued": count, "ran": len(mine), "peak": peak(spans, tenant),
            "finished_after_s": round(max(e for _, e, _ in mine) - began, 2),
            "ideal_s": round(count / 2 * nap, 2)}
    result["peak_all"] = peak(spans)
    return result


def shared_budget_workload(ledger_dir: str, nap: float) -> dict:
    """Three tenants whose own limits leave room, sharing a queue budget of 4: the waiting
    steps of every tenant are woken in turns, so each finishes near its fair share."""
    from django.conf import settings

    import queuety

    budget = settings.QUEUE_BUDGET
    flow = queuety.workflow("res_bench_shared").then(
        "qbench.resource_steps.ledgered", concurrency_group="bench-shared:{tenant_id}",
        concurrency_limit=8, queue=settings.BUDGET_QUEUE)
    queued = {"a": 100, "b": 20, "c": 5}
    began = time.time()
    ids = [flow.dispatch({"nap": nap, "ledger": "shared", "tenant_id": tenant, "label": tenant})
           for tenant, count in queued.items() for _ in range(count)]
    _wait_done(ids, 60 + 125 * nap)
    spans = _ledger(ledger_dir, "shared")
    result = {"nap": nap, "budget": budget, "tenants": {}, "peak_all": peak(spans)}
    total = sum(queued.values())
    for tenant, count in queued.items():
        mine = [span for span in spans if span[2] == tenant]
        # Taking turns, a tenant runs at budget / (tenants still waiting) until it is done.
        smaller = sorted(c for c in queued.values() if c <= count)
        fair = 0.0
        done_before = 0
        for n, c in enumerate(smaller):
            fair += (c - done_before) * (len(queued) - n) / budget * nap
            done_before = c
        result["tenants"][tenant] = {
            "queued": count, "ran": len(mine),
            "finished_after_s": round(max(e for _, e, _ in mine) - began, 2),
            "turns_s": round(fair, 2),
            "oldest_first_s": round(
                sum(c for t, c in queued.items() if list(queued).index(t) <= list(queued).index(
                    tenant)) / budget * nap, 2)}
    result["all_s"] = round(total / budget * nap, 2)
    return result


def round_trips() -> dict:
    """Statements of a plain step boundary and of a step in a concurrency group, in-process
    with publishing captured (as the main suite's ``roundtrips``)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import queuety
    from queuety import publish
    from queuety.runtime import attempt
    from qbench import queuety_bench

    found: dict[str, list[str]] = {}
    plain = queuety_bench.three_steps("qbench-captured")
    gated = (queuety.workflow("qbench-gated")
             .then("qbench.steps.noop", concurrency_group="bench-rt", concurrency_limit=8)
             .then("qbench.steps.noop2", concurrency_group="bench-rt", concurrency_limit=8)
             .then("qbench.steps.noop3", concurrency_group="bench-rt", concurrency_limit=8))
    for name, flow in (("plain", plain), ("in a group", gated)):
        for _ in range(3):  # the last pass, once caches are warm
            with publish.captured() as sent:
                flow.dispatch({"token": uuid.uuid4().hex})
                attempt.execute_step(sent[0].step_run_id, inline=False)
                with CaptureQueriesContext(connection) as captured:
                    attempt.execute_step(sent[1].step_run_id, inline=False)
                attempt.execute_step(sent[2].step_run_id, inline=False)
            found[name] = [q["sql"].split()[0] for q in captured.captured_queries]
    return {name: {"statements": kinds, "round_trips": len(kinds)}
            for name, kinds in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--nap", type=float, default=0.2)
    parser.add_argument("--tenant-nap", type=float, default=0.2)
    args = parser.parse_args()
    ledger_dir = tempfile.mkdtemp(prefix="qbench-res-")
    queue = f"qbench-res-{uuid.uuid4().hex[:8]}"
    environ = _environment(ledger_dir, queue)
    os.environ.update({k: v for k, v in environ.items() if k != "PYTHONPATH"})
    for entry in (str(BENCH_DIR), str(ROOT)):
        sys.path.insert(0, entry)
    _fresh_database()
    import django

    django.setup()
    import project.celery  # noqa: F401 - the project's app becomes the current Celery app
    from django.core.management import call_command

    from qbench import util

    call_command("migrate", verbosity=0)
    results_dir = BENCH_DIR / "results"
    results_dir.mkdir(exist_ok=True)
    util.env.RESULTS_DIR = results_dir
    nodes = []
    try:
        for n in (1, 2):
            command = [sys.executable, "-m", "celery", "-A", "project", "worker", "--pool",
                       "prefork", "--concurrency", "4", "--loglevel", "WARNING",
                       "-Q", f"{queue},{queue}-budget",
                       "-n", f"qbench-res{n}-{uuid.uuid4().hex[:6]}@localhost",
                       "--without-gossip", "--without-mingle", "--without-heartbeat"]
            nodes.append(util.start(command, log=results_dir / "logs" / f"res-node{n}.log",
                                    environ=environ, cwd=ROOT))
        time.sleep(8)  # both nodes up (their 4 pool processes each forked and connected)
        results = {"round_trips": round_trips(),
                   "plain": baseline(ledger_dir, args.runs, args.nap, "plain"),
                   "group": group_workload(ledger_dir, args.runs, args.nap),
                   "plain_fast": baseline(ledger_dir, args.runs, 0.01, "plain_fast"),
                   "rate": rate_workload(ledger_dir, args.runs),
                   "tenants": tenant_workload(ledger_dir, args.tenant_nap),
                   "shared": shared_budget_workload(ledger_dir, args.tenant_nap)}
        results["load_average"] = os.getloadavg()
    finally:
        for proc in nodes:
            util.stop(proc)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (results_dir / f"resources-{stamp}.json").write_text(json.dumps(results, indent=1))
    print(report(results))


def report(r: dict) -> str:
    g, rate, t, rt = r["group"], r["rate"], r["tenants"], r["round_trips"]
    plain, fast = r["plain"], r["plain_fast"]
    lines = [
        f"Load average during the run: {', '.join(f'{x:.1f}' for x in r['load_average'])}"
        f" ({os.cpu_count()} CPUs).",
        "",
        "| workload | measured | bound |",
        "|---|---|---|",
        f"| {g['runs']} runs of a {g['nap']} s step, group limit 8, 2 nodes x 4 processes: "
        f"peak concurrency | {g['peak']} | ≤ 8 |",
        f"| ... throughput | {g['throughput_per_s']}/s = {g['of_ideal']:.0%} of the ideal "
        f"{g['ideal_per_s']}/s | ≥ 90% |",
        f"| ... the same runs in no group, same workers (peak {plain['peak']}) | "
        f"{plain['throughput_per_s']}/s: the group reaches "
        f"{g['throughput_per_s'] / plain['throughput_per_s']:.0%} of it | |",
        f"| ... slot released → next waiting step started | p50 {g['handoff_ms_p50']} ms, "
        f"p95 {g['handoff_ms_p95']} ms | |",
        f"| ... attempts per step | {g['attempts_seen']} | [1] |",
        f"| {rate['runs']} runs, rate limit 20/s: most admissions in any 1 s | "
        f"{rate['max_admissions_in_1s']} (handler starts: {rate['max_handler_starts_in_1s']})"
        " | ≤ 20 |",
        f"| ... sustained | {rate['sustained_per_s']}/s | ≥ 18/s |",
        f"| ... the same 10 ms runs in no group, same workers | {fast['throughput_per_s']}/s "
        "| |",
    ]
    for tenant, row in t["tenants"].items():
        lines.append(f"| tenant {tenant} ({row['queued']} queued, limit 2): peak, finished | "
                     f"{row['peak']}, after {row['finished_after_s']} s (alone: "
                     f"{row['ideal_s']} s) | peak ≤ 2 |")
    shared = r["shared"]
    for tenant, row in shared["tenants"].items():
        lines.append(f"| sharing a queue budget of {shared['budget']}: tenant {tenant} "
                     f"({row['queued']} queued), finished | after {row['finished_after_s']} s "
                     f"(taking turns: {row['turns_s']} s; oldest first: {row['oldest_first_s']}"
                     " s) | |")
    lines.append(f"| ... the queue's peak | {shared['peak_all']} | ≤ {shared['budget']} |")
    lines.append(f"| round trips of a step boundary: plain / in a group | "
                 f"{rt['plain']['round_trips']} ({' '.join(rt['plain']['statements'])}) / "
                 f"{rt['in a group']['round_trips']} "
                 f"({' '.join(rt['in a group']['statements'])}) | plain: 2 |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
