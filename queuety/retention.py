"""Retention: archive, then purge, finished runs past ``QUEUETY["RETENTION"]``.

One pass works in batches of one workflow and one finish day (UTC): the batch's runs are
exported into the archive storage (:mod:`queuety.archive`), then deleted with their rows in
one short transaction (row locks on those rows only, never a table lock). A crash between
the two writes the same batch to the same object on the next pass. Their idempotency keys
stay as tombstones (:class:`~queuety.exceptions.RunPurged`) for one more retention period.

Never purged, whatever their age: a run with a step row still live (a cancelled run's
compensations), a run whose ``run_workflow`` parent or ``start_workflows`` starter is live,
and a run a live ``wait_for_workflows`` waits for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.db.models.functions import TruncDate
from django.utils import timezone

from queuety import archive
from queuety import export as exports
from queuety.conf import retention as retention_rules
from queuety.core.retention import RetentionRules
from queuety.core.status import FINISHED, LIVE_OR_HELD, UNFINISHED
from queuety.jobs import unique as unique_jobs
from queuety.models import (
    Artifact,
    DispatchKey,
    Event,
    Signal,
    StepChunk,
    StepRun,
    WorkflowDependency,
    WorkflowRun,
)

logger = logging.getLogger("queuety")

#: Runs archived and deleted per transaction (``manage.py queuety purge``).
BATCH = 500
#: ... and in the sweeper's phase, one batch a sweep: exporting a run for the archive costs
#: about 20 ms, so a batch stays a few seconds, well inside the sweeper's lease.
SWEEP_BATCH = 100


def due_runs(rules: RetentionRules, now: datetime) -> QuerySet[WorkflowRun]:
    """The finished runs past their retention at ``now`` that may go (none when no rule
    purges anything)."""
    clauses = rules.clauses()
    if not clauses:
        return WorkflowRun.objects.none()
    due = Q()
    for clause in clauses:
        cutoff = now - clause.keep
        one = Q(status=clause.status, finished_at__lt=cutoff) & (
            Q(restored_at__isnull=True) | Q(restored_at__lt=cutoff))
        if clause.workflow is not None:
            one &= Q(name=clause.workflow)
        elif clause.excluded:
            one &= ~Q(name__in=clause.excluded)
        due |= one
    live_step = StepRun.objects.filter(run_id=OuterRef("pk"), status__in=LIVE_OR_HELD)
    awaited = WorkflowDependency.objects.filter(
        depends_on=OuterRef("pk"), run__status__in=UNFINISHED)
    return WorkflowRun.objects.filter(due).exclude(
        Q(parent__status__in=UNFINISHED) | Q(started_by__status__in=UNFINISHED)
        | Exists(live_step) | Exists(awaited))


@dataclass
class PurgeReport:
    """What a pass purged (or, dry, would): counts per (workflow, status), the archive
    objects written, tombstones forgotten, and its longest delete transaction."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    objects: list[str] = field(default_factory=list)
    forgotten: int = 0
    longest_delete: float = 0.0

    @property
    def total(self) -> int:
        """Runs purged (or due) in all."""
        return sum(self.counts.values())


def plan(now: datetime | None = None) -> PurgeReport:
    """What a purge pass would do now, per workflow and status; changes nothing."""
    now = now or timezone.now()
    report = PurgeReport()
    for row in due_runs(retention_rules(), now).values("name", "status").annotate(
            n=Count("pk")).order_by("name", "status"):
        report.counts[(row["name"], row["status"])] = row["n"]
    report.forgotten = DispatchKey.objects.filter(forget_at__lt=now).count()
    return report


def purge(now: datetime | None = None, batch: int = BATCH,
          max_batches: int | None = None) -> PurgeReport:
    """Archive and purge every due run (or ``max_batches`` batches), then forget expired
    tombstones; return what was done."""
    now = now or timezone.now()
    rules = retention_rules()
    report = PurgeReport()
    done = 0
    while max_batches is None or done < max_batches:
        if not purge_batch(rules, now, batch, report):
            break
        done += 1
    report.forgotten = forget_tombstones(now, batch)
    return report


def sweep_phase(now: datetime) -> int:
    """The sweeper's purge phase: one batch of :data:`SWEEP_BATCH` runs, and one batch of
    expired tombstones."""
    report = purge(now, batch=SWEEP_BATCH, max_batches=1)
    return report.total + report.forgotten


def purge_batch(rules: RetentionRules, now: datetime, batch: int,
                report: PurgeReport) -> bool:
    """Archive and delete one batch (one workflow, one finish day); False when none is due."""
    due = due_runs(rules, now)
    first = due.order_by("pk").annotate(day=TruncDate("finished_at", tzinfo=UTC)) \
        .values("name", "day").first()
    if first is None:
        return False
    start = datetime.combine(first["day"], datetime.min.time(), tzinfo=UTC)
    ids = list(due.filter(name=first["name"], finished_at__gte=start,
                          finished_at__lt=start + timedelta(days=1))
               .order_by("pk").values_list("pk", flat=True)[:batch])
    if not ids:  # the first run left between the two reads (another purger took it)
        return True
    storage = archive.archive_storage()
    if storage is not None:
        documents = [exports.export(run_id) for run_id in ids]
        report.objects.append(archive.write_batch(storage, first["name"], first["day"],
                                                  documents))
    began = time.monotonic()
    purged = _delete(rules, ids, now)
    report.longest_delete = max(report.longest_delete, time.monotonic() - began)
    for status, count in purged.items():
        key = (first["name"], status)
        report.counts[key] = report.counts.get(key, 0) + count
    return True


def _delete(rules: RetentionRules, ids: list[int], now: datetime) -> dict[str, int]:
    """Delete runs ``ids`` (still finished: checked under their row locks) and their rows in
    one transaction; mark their dispatch keys as tombstones. Return the counts per status."""
    with transaction.atomic():
        runs = list(WorkflowRun.objects.select_for_update(skip_locked=True).filter(
            pk__in=ids, status__in=FINISHED).values("pk", "name", "status", "idempotency_key"))
        gone = [run["pk"] for run in runs]
        if not gone:
            return {}
        # Children first, one statement per table by its run index (the events before the
        # step rows they name); the runs' own delete then has none of them to load, and still
        # applies the on_delete of any model of the site's that points at a run.
        marks = ", ".join(["%s"] * len(gone))
        with connection.cursor() as cursor:
            for model in (Event, StepChunk, Artifact, Signal, WorkflowDependency, StepRun):
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(model._meta.db_table)} "
                               f"WHERE run_id IN ({marks})", gone)
        # A live child of a purged parent stays, unlinked (it wakes no one when it ends).
        WorkflowRun.objects.filter(parent_id__in=gone).update(parent=None)
        WorkflowRun.objects.filter(started_by_id__in=gone).update(started_by=None)
        _tombstone(rules, runs, now)
        WorkflowRun.objects.filter(pk__in=gone).delete()
    counts: dict[str, int] = {}
    for run in runs:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    return counts


def _tombstone(rules: RetentionRules, runs: list[dict[str, Any]], now: datetime) -> None:
    """Mark the keys of purged ``runs`` purged, each kept one more retention period of its
    run (from now). A unique job's key goes with its job: its contract is that the next
    enqueue of a purged job's key starts a new job (``queuety.jobs.unique``)."""
    by_keep: dict[tuple[str, timedelta | None], list[str]] = {}
    jobs = [run["idempotency_key"] for run in runs
            if (run["idempotency_key"] or "").startswith(unique_jobs.PREFIX)]
    if jobs:
        DispatchKey.objects.filter(key__in=jobs).delete()
    for run in runs:
        if run["idempotency_key"] and run["idempotency_key"] not in jobs:
            keep = rules.keep(run["name"], run["status"])
            by_keep.setdefault((run["name"], keep), []).append(run["idempotency_key"])
    for (name, keep), keys in by_keep.items():
        DispatchKey.objects.filter(key__in=keys).update(
            purged_at=now, purged_workflow=name,
            forget_at=None if keep is None else now + keep)


def forget_tombstones(now: datetime, batch: int = BATCH) -> int:
    """Delete up to ``batch`` tombstones whose time has passed; return how many."""
    keys = list(DispatchKey.objects.filter(forget_at__lt=now).order_by("forget_at")
                .values_list("pk", flat=True)[:batch])
    if keys:
        DispatchKey.objects.filter(pk__in=keys, forget_at__lt=now).delete()
    return len(keys)
