"""The locked landing path, measured in-process on PostgreSQL: what a run costs when its next
step needs no worker (a wait, a repeat, a start step), where the planner does its work.

    createdb -h 127.0.0.1 -U postgres queuety_landing
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_landing \\
        .venv/bin/python benchmarks/landing.py [--runs 300]

Run it from two checkouts (``PYTHONPATH=<other checkout>`` with this virtualenv) to compare
them in the same conditions. Each run of ``task -> wait_for_signal -> repeat -> task`` is
measured in three phases, publishing captured (no broker): the first step's attempt, whose
transition lands on the wait under the run's row lock; the signal, whose landing settles the
wait and evaluates the repeat; and the last step (the one-statement fast path, for contrast).
Prints the statements of each phase (checked identical across runs) and their median wall
time in milliseconds, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path[:0] = [str(ROOT / "benchmarks")]
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import queuety
    from queuety import publish
    from queuety.runtime import attempt

    call_command("migrate", verbosity=0)
    # The webhook outbox reads its endpoints every 5 s: kept for the run, so that a refresh
    # falling inside one phase does not add a statement the phase does not make.
    from queuety.webhooks import outbox

    outbox.CACHE_SECONDS = 3600.0
    outbox.forget()
    builder = (queuety.workflow("landing_bench").then("qbench.steps.noop")
               .wait_for_signal("go", result_key="go")
               .repeat_until("noop", "go", {"again": False}, max_iterations=3)
               .then("qbench.steps.noop2"))
    shapes: dict[str, list[str]] = {}
    walls: dict[str, list[float]] = defaultdict(list)

    def measure(phase: str, call, keep: bool):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            value = call()
            wall = time.perf_counter() - started
        kinds = [q["sql"].split()[0] for q in captured.captured_queries]
        if keep:
            if phase in shapes and shapes[phase] != kinds:
                raise AssertionError(f"{phase}: statements changed: {shapes[phase]} -> {kinds}")
            shapes[phase] = kinds
            walls[phase].append(wall)
        return value

    for i in range(args.runs + 5):
        keep = i >= 5  # the first runs create the definition row and warm the caches
        with publish.captured() as sent:
            run_id = builder.dispatch({"i": i, "token": uuid.uuid4().hex})
            measure("step 1, lands on the wait (locked)",
                    lambda: attempt.execute_step(sent[0].step_run_id, inline=False), keep)
            measure("signal: settles the wait, evaluates the repeat",
                    lambda: queuety.signal(run_id, "go", {"again": False}), keep)
            measure("last step (one statement)",
                    lambda: attempt.execute_step(sent[-1].step_run_id, inline=False), keep)
        assert queuety.workflow_status(run_id).status == "completed", run_id
    print(json.dumps({phase: {"statements": len(kinds), "kinds": kinds,
                              "wall_ms_p50": round(statistics.median(walls[phase]) * 1000, 3)}
                      for phase, kinds in shapes.items()}, indent=1))


if __name__ == "__main__":
    main()
