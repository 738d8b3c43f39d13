"""Bulk cancel, measured in-process on PostgreSQL: one ``queuety.bulk("cancel", ...)``
operation over every waiting run of a workflow (default 2,000; ``--runs 50000`` for the
issue's figure), against a baseline of ``queuety.cancel()`` called run by run in the same run.

    createdb -h 127.0.0.1 -U postgres queuety_bulkbench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_bulkbench \\
        CELERY_BROKER_URL=redis://127.0.0.1:6379/3 \\
        .venv/bin/python benchmarks/bulk_cancel.py [--runs 50000] [--chunk 500]

The runs wait for an approval (dispatch lands them there; no worker is needed). The
operation is recorded by ``queuety.bulk()`` (its task message goes to a queue of its own,
deleted at the end) and processed here by ``queuety.bulk_actions.process``, as the worker's
task would. Prints, as JSON: runs/s of the operation and of the baseline, their ratio, and
the longest transaction (a batch of runs, sized to last about 100 ms: the operation's only
lock holder, the batch's run trees and the operation row, from BEGIN to COMMIT).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--baseline", type=int, default=200,
                        help="Runs cancelled one by one for the baseline rate.")
    parser.add_argument("--chunk", type=int, default=500, help="QUEUETY['BULK_CHUNK_SIZE'].")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    queue = os.environ["CELERY_TASK_DEFAULT_QUEUE"] = f"qbench-bulk-{uuid.uuid4().hex[:6]}"
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import override_settings

    import queuety
    from queuety import bulk_actions
    from queuety.models import WorkflowRun
    from tests.settings import QUEUETY

    call_command("migrate", verbosity=0)
    tag = uuid.uuid4().hex[:8]
    flow = queuety.workflow(f"bulk_bench_{tag}").wait_for_approval().then("tests.workflows.step_a")
    started = time.perf_counter()
    baseline_ids = [flow.dispatch({"i": -i}) for i in range(args.baseline)]
    for i in range(args.runs):
        flow.dispatch({"i": i})
    print(f"dispatched {args.runs + args.baseline} runs in "
          f"{time.perf_counter() - started:.1f}s", file=sys.stderr)

    started = time.perf_counter()
    for run_id in baseline_ids:
        queuety.cancel(run_id)
    baseline_rate = len(baseline_ids) / (time.perf_counter() - started)

    held: list[float] = []
    batch = bulk_actions._batch  # noqa: SLF001 - timed, not changed: each call is one transaction
    sizes: list[int] = []

    def timed(*a: object, **k: object) -> int:
        began = time.perf_counter()
        try:
            done = batch(*a, **k)  # type: ignore[arg-type]
            sizes.append(done)
            return done
        finally:
            held.append(time.perf_counter() - began)

    bulk_actions._batch = timed  # noqa: SLF001
    with override_settings(QUEUETY={**QUEUETY, "BULK_CHUNK_SIZE": args.chunk}):
        op = queuety.bulk("cancel", workflow=f"bulk_bench_{tag}", status="waiting_for_signal")
        started = time.perf_counter()
        final = bulk_actions.process(op.id, time_slice=3600.0)
        elapsed = time.perf_counter() - started
    progress = queuety.bulk_status(op.id)
    left = WorkflowRun.objects.filter(name=f"bulk_bench_{tag}",
                                      status="waiting_for_signal").count()
    _drop_queue(queue)
    rate = progress.acted / elapsed
    print(json.dumps({
        "runs": args.runs, "chunk": args.chunk, "status": final, "matched": progress.matched,
        "acted": progress.acted, "skipped": progress.skipped, "left_waiting": left,
        "seconds": round(elapsed, 2), "runs_per_second": round(rate, 1),
        "baseline_runs_per_second": round(baseline_rate, 1),
        "ratio_to_baseline": round(rate / baseline_rate, 2),
        "longest_transaction_ms": round(max(held) * 1000, 1),
        "median_transaction_ms": round(sorted(held)[len(held) // 2] * 1000, 2),
        "transactions": len(held), "largest_batch": max(sizes, default=0),
    }, indent=2))


def _drop_queue(queue: str) -> None:
    from project.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)


if __name__ == "__main__":
    main()
