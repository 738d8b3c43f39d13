"""Retention with archives, measured in-process on PostgreSQL: purge throughput with the
archive (export + JSON Lines into a FileSystemStorage) against the same purge without it,
and the longest delete transaction of each.

    createdb -h 127.0.0.1 -U postgres queuety_retention_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/queuety_retention_bench \\
        .venv/bin/python benchmarks/retention.py [--runs 1000] [--batch 500]

Makes ``--runs`` finished runs of each of two workflows (two steps each, run in this process,
messages captured), says they finished ten days ago, then purges one workflow without an
archive (the baseline) and the other with one, each with ``queuety.retention.purge``.
Prints, as JSON: runs/s of each, their ratio, the longest delete transaction of each (ms, from
its start to its commit), the dry run's time, and the archive's bytes per run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="Runs per workflow.")
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path[:0] = [str(ROOT / "benchmarks")]
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    import django

    django.setup()
    from django.conf import settings as django_settings
    from django.core.management import call_command
    from django.test import override_settings
    from django.utils import timezone

    import queuety
    from queuety import publish, retention
    from queuety.models import StepRun, WorkflowRun
    from queuety.runtime import attempt
    from tests.settings import QUEUETY

    call_command("migrate", verbosity=0)
    tag = uuid.uuid4().hex[:8]
    names = {side: f"retention_bench_{side}_{tag}" for side in ("bare", "archived")}
    started = time.perf_counter()
    for name in names.values():
        flow = queuety.workflow(name).then("qbench.steps.noop").then("qbench.steps.noop2")
        with publish.captured():
            ids = [flow.dispatch({"i": i, "note": "x" * 200}) for i in range(args.runs)]
        for _ in range(2):  # each step in this process, as a worker would
            due = StepRun.objects.filter(run_id__in=ids, status="pending").values_list(
                "pk", flat=True)
            with publish.captured():
                for pk in list(due):
                    attempt.execute_step(pk, inline=False)
        old = timezone.now() - timedelta(days=10)
        WorkflowRun.objects.filter(name=name).update(finished_at=old)
    print(f"made {2 * args.runs} finished runs in {time.perf_counter() - started:.1f}s",
          file=sys.stderr)

    figures: dict[str, object] = {"runs": args.runs, "batch": args.batch}
    with tempfile.TemporaryDirectory() as folder:
        storages = {**django_settings.STORAGES, "archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": folder}}}
        for side, archive_to in (("bare", None), ("archived", "archive")):
            with override_settings(STORAGES=storages, QUEUETY={
                    **QUEUETY, "RETENTION": {names[side]: "7d"}, "ARCHIVE_STORAGE": archive_to}):
                began = time.perf_counter()
                planned = retention.plan()
                figures[f"{side}_dry_run_ms"] = round((time.perf_counter() - began) * 1000, 1)
                assert planned.counts[(names[side], "completed")] == args.runs, planned.counts
                began = time.perf_counter()
                report = retention.purge(batch=args.batch)
                seconds = time.perf_counter() - began
            assert report.total == args.runs, report.counts
            figures[f"{side}_runs_per_s"] = round(args.runs / seconds, 1)
            figures[f"{side}_longest_delete_ms"] = round(report.longest_delete * 1000, 1)
        size = sum(path.stat().st_size for path in Path(folder).rglob("*.jsonl"))
        figures["archive_bytes_per_run"] = round(size / args.runs)
    figures["archived_vs_bare_throughput"] = round(
        float(figures["archived_runs_per_s"]) / float(figures["bare_runs_per_s"]), 3)
    figures["archived_vs_bare_longest_delete"] = round(
        float(figures["archived_longest_delete_ms"])
        / max(float(figures["bare_longest_delete_ms"]), 0.001), 3)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
