"""Quarantining a definition, measured in-process on PostgreSQL: pausing and resuming all of
its 10,000 live runs, and pausing them again (nothing to do).

    createdb -h 127.0.0.1 -U postgres queuety_quarantine
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_quarantine \\
        .venv/bin/python benchmarks/quarantine.py [--runs 10000] [--chunk N] [--publish]

Half the runs wait for an approval, half are running with their first task step due (its
message captured at dispatch, so no worker takes it). ``pause_definition`` then pauses them
all; a second call pauses nothing; ``resume_definition`` resumes them all (the waits are
evaluated, the task rows published again). Publishing is captured unless ``--publish`` sends
the messages to CELERY_BROKER_URL (onto a queue of its own, emptied afterwards). Prints, as
JSON, the wall time of each call, its statements, and how long the longest chunk held its
rows locked (from the lock to the commit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=None,
                        help="Runs per transaction (default: quarantine.CHUNK for a pause, "
                             "RESUME_CHUNK for a resume).")
    parser.add_argument("--publish", action="store_true",
                        help="Send the resumed steps' messages to the broker.")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    # tests.settings takes its Celery queue from here: published messages land on a queue of
    # their own, which is emptied at the end.
    queue = os.environ["CELERY_TASK_DEFAULT_QUEUE"] = f"qbench-quarantine-{uuid.uuid4().hex[:6]}"
    sys.path[:0] = [str(ROOT / "benchmarks")]
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    import queuety
    from queuety import publish, quarantine
    from queuety.models import StepRun, WorkflowRun
    from queuety.runtime import attempt
    from queuety.store import rows

    call_command("migrate", verbosity=0)
    tag = uuid.uuid4().hex[:8]
    flow = (queuety.workflow(f"quarantine_bench_{tag}").then("qbench.steps.noop")
            .wait_for_approval().then("qbench.steps.noop2"))
    started = time.perf_counter()
    with publish.captured():
        for i in range(args.runs):
            run_id = flow.dispatch({"i": i})
    print(f"dispatched {args.runs} runs in {time.perf_counter() - started:.1f}s",
          file=sys.stderr)
    definition = WorkflowRun.objects.get(pk=run_id).definition
    # Half of them land on the wait (their first step run in-process), half stay running.
    rows_due = list(StepRun.objects.filter(run__definition_id=definition.pk, status="pending")
                    .order_by("pk").values_list("pk", flat=True))
    with publish.captured():
        for pk in rows_due[: len(rows_due) // 2]:
            attempt.execute_step(pk, inline=False)
    print("before:", count_statuses(WorkflowRun, definition.pk), file=sys.stderr)

    held: list[float] = []
    locking = rows.lock_free_runs

    def timed_lock(ids, wanted):
        taken = locking(ids, wanted)
        began = time.perf_counter()
        transaction.on_commit(lambda: held.append(time.perf_counter() - began))
        return taken

    rows.lock_free_runs = timed_lock
    results = {}
    for name, call in (("pause", quarantine.pause_definition),
                       ("pause again", quarantine.pause_definition),
                       ("resume", quarantine.resume_definition)):
        held.clear()
        statements: list[str] = []

        def counted(execute, sql, params, many, context, seen=statements):
            seen.append(sql)
            return execute(sql, params, many, context)

        capture = nullcontext([]) if args.publish and name == "resume" else publish.captured()
        with connection.execute_wrapper(counted), capture as sent:
            began = time.perf_counter()
            result = call(definition.pk, actor="benchmark",
                          **({} if args.chunk is None else {"chunk_size": args.chunk}))
            wall = time.perf_counter() - began
        results[name] = {"wall_s": round(wall, 3), "done": result.done,
                         "skipped": result.skipped, "failed": len(result.failed),
                         "runs_per_s": round(result.done / wall) if result.done else None,
                         "statements": len(statements),
                         "chunks": len(held),
                         "longest_lock_ms": round(max(held) * 1000, 1) if held else None,
                         "messages_captured": len(sent)}
        print(name, results[name], file=sys.stderr)
    print("after:", count_statuses(WorkflowRun, definition.pk), file=sys.stderr)
    if args.publish:
        from project.celery import app

        with app.connection_for_write() as conn:
            purged = conn.default_channel.queue_purge(queue)
        print(f"purged {purged} messages from {queue}", file=sys.stderr)
    print(json.dumps({"runs": args.runs, "chunk": args.chunk, "publish": args.publish,
                      **results}, indent=1))


def count_statuses(model, definition_id: int) -> dict[str, int]:
    from django.db.models import Count

    return dict(model.objects.filter(definition_id=definition_id).values_list("status")
                .annotate(n=Count("pk")).values_list("status", "n"))


if __name__ == "__main__":
    main()
