"""The claim's cost with the paused-queue test folded into it, against the claim as it was
before queues could be paused (its text, kept here as the baseline), in the same run, on
PostgreSQL, in-process.

    createdb -h 127.0.0.1 -U postgres queuety_claim_pause
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_claim_pause \\
        .venv/bin/python benchmarks/claim_pause.py [--claims 1000] [--pauses 0]

``2 * --claims`` runs are dispatched (their messages captured); their first step rows are
claimed once each, alternating between the two statements so that both see the same cache
and load.
``--pauses`` paused queues (none the row's) fill the table the claim tests. By default the
claims run in one transaction, so the figures are the statements' own work, not the commit's
WAL flush (``--autocommit`` measures that too). Prints, as JSON,
each statement's median and p95 time in microseconds and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The claim before queue pauses (queuety.store.sql.CLAIM_POSTGRES at 0021_wait_reminders).
BASELINE = """
UPDATE queuety_steprun AS s SET status = 'processing', attempt = attempt + 1, claimed_at = %s,
       heartbeat_at = %s, claimed_by = %s, throttled_by = NULL
  FROM queuety_workflowrun AS r
 WHERE s.id = %s AND s.status = 'pending' AND s.available_at <= %s
   AND r.id = s.run_id AND (r.status = 'running' OR s.kind <> 'step')
RETURNING s.run_id, s.step_index, s.seq, s.attempt, r.definition_id, r.state, r.revision,
          r.transitions, r.cost_units, r.started_workflows, s.kind, s.branch, s.timeout,
          r.trace_context
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--pauses", type=int, default=0)
    parser.add_argument("--autocommit", action="store_true",
                        help="Commit each claim (then the WAL flush dominates both figures).")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path[:0] = [str(ROOT / "benchmarks")]
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    import queuety
    from queuety import publish
    from queuety.models import QueuePause, StepRun
    from queuety.store import sql

    call_command("migrate", verbosity=0)
    tag = uuid.uuid4().hex[:8]
    flow = queuety.workflow(f"claim_pause_{tag}").then("qbench.steps.noop")
    with publish.captured():
        run_ids = [flow.dispatch({"i": i}) for i in range(2 * args.claims)]
    pending = list(StepRun.objects.filter(run_id__in=run_ids).order_by("pk")
                   .values_list("pk", flat=True))
    QueuePause.objects.bulk_create([QueuePause(queue=f"bench-{tag}-{i}", paused_at=timezone.now())
                                    for i in range(args.pauses)])
    statements = {"baseline": (BASELINE, False), "with pause test": (sql.CLAIM_POSTGRES, True)}
    timings: dict[str, list[float]] = {name: [] for name in statements}
    try:
        with (nullcontext() if args.autocommit else transaction.atomic()), \
                connection.cursor() as cursor:
            for i, pk in enumerate(pending):
                name = "baseline" if i % 2 else "with pause test"
                text, with_queue = statements[name]
                now = timezone.now()
                params = [now, now, "bench", pk, now, *(["q"] if with_queue else [])]
                began = time.perf_counter()
                cursor.execute(text, params)
                claimed = cursor.fetchone()
                timings[name].append(time.perf_counter() - began)
                assert claimed is not None, f"step run id={pk} was not claimed"
    finally:
        QueuePause.objects.filter(queue__startswith=f"bench-{tag}-").delete()
    result = {name: {"median_us": round(statistics.median(values) * 1e6, 1),
                     "p95_us": round(statistics.quantiles(values, n=20)[-1] * 1e6, 1)}
              for name, values in timings.items()}
    ratio = result["with pause test"]["median_us"] / result["baseline"]["median_us"]
    print(json.dumps({"claims": args.claims, "pauses": args.pauses,
                      "autocommit": args.autocommit, **result,
                      "ratio_of_medians": round(ratio, 3)}, indent=1))


if __name__ == "__main__":
    main()
