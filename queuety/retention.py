"""Retention: archive, then purge, finished runs past ``QUEUETY["RETENTION"]``.

One pass works in batches of one workflow and one finish day (UTC): the batch's runs are
exported into the archive storage (:mod:`queuety.archive`), then deleted with their rows in
one short transaction (row locks on those rows only, never a table lock). The delete
re-checks each run under its lock: still due, and unchanged since its export (its
fingerprint); any other run stays for a later pass, which archives it again into a new
object (objects are never overwritten, so a crash between the two loses nothing either).
One pass at a time: a pass holds a PostgreSQL advisory lock (:data:`LOCK_ID`). Their idempotency keys
stay as tombstones (:class:`~queuety.exceptions.RunPurged`) for one more retention period.

Never purged, whatever their age: a run with a step row still live (a cancelled run's
compensations), a run whose ``run_workflow`` parent or ``start_workflows`` starter is live,
and a run a live ``wait_for_workflows`` waits for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from queuety import archive, exceptions
from queuety import export as exports
from queuety.conf import retention as retention_rules
from queuety.core.retention import RetentionRules
from queuety.core.status import LIVE_OR_HELD, UNFINISHED
from queuety.models import (
    UNIQUE_KEY_PREFIX,
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


def _clause_filters(rules: RetentionRules, now: datetime) -> list[Q]:
    """One filter per rule clause: a status, finished before the clause's cutoff (and not
    restored since), of one workflow or of all but some."""
    filters = []
    for clause in rules.clauses():
        cutoff = now - clause.keep
        one = Q(status=clause.status, finished_at__lt=cutoff) & (
            Q(restored_at__isnull=True) | Q(restored_at__lt=cutoff))
        if clause.workflow is not None:
            one &= Q(name=clause.workflow)
        elif clause.excluded:
            one &= ~Q(name__in=clause.excluded)
        filters.append(one)
    return filters


def _kept(runs: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """``runs`` without those that must stay whatever their age (see the module's text)."""
    live_step = StepRun.objects.filter(run_id=OuterRef("pk"), status__in=LIVE_OR_HELD)
    awaited = WorkflowDependency.objects.filter(
        depends_on=OuterRef("pk"), run__status__in=UNFINISHED)
    return runs.exclude(
        Q(parent__status__in=UNFINISHED) | Q(started_by__status__in=UNFINISHED)
        | Exists(live_step) | Exists(awaited))


def due_runs(rules: RetentionRules, now: datetime) -> QuerySet[WorkflowRun]:
    """The finished runs past their retention at ``now`` that may go (none when no rule
    purges anything)."""
    filters = _clause_filters(rules, now)
    if not filters:
        return WorkflowRun.objects.none()
    due = Q()
    for one in filters:
        due |= one
    return _kept(WorkflowRun.objects.filter(due))


def first_due_queries(rules: RetentionRules, now: datetime) -> list[QuerySet[Any]]:
    """The queries a pass (and each sweeper tick) starts with: per rule clause, its due run
    that finished first. Each is ordered by ``finished_at`` under one status, which the
    ``queuety_run_finished`` index (status, finished_at) walks from its start, so a tick
    with nothing due reads a few index entries, not the table."""
    return [_kept(WorkflowRun.objects.filter(one)).order_by("finished_at")
            .values("name", "finished_at")[:1] for one in _clause_filters(rules, now)]


def _oldest_due(rules: RetentionRules, now: datetime) -> dict[str, Any] | None:
    """The name and finish instant of the due run that finished first, or None."""
    found = [row for query in first_due_queries(rules, now) for row in query]
    return min(found, key=lambda row: row["finished_at"]) if found else None


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
    tombstones; return what was done.

    Raises:
        PurgeRunning: another pass holds the purge lock; nothing was done.
    """
    now = now or timezone.now()
    rules = retention_rules()
    report = PurgeReport()
    with _purge_lock():
        done = 0
        while max_batches is None or done < max_batches:
            if not purge_batch(rules, now, batch, report):
                break
            done += 1
        report.forgotten = forget_tombstones(now, batch)
    return report


#: The PostgreSQL advisory lock one purge pass holds (any 64-bit number of Queuety's own).
LOCK_ID = 0x51554555_50524753  # "QUEU" "PRGS"


@contextmanager
def _purge_lock() -> Iterator[None]:
    """Hold the purge lock for one pass (session level, so each batch still commits on its
    own), or raise :class:`PurgeRunning`: two passes at once would export runs the other is
    deleting."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_ID])
        if not cursor.fetchone()[0]:
            raise exceptions.PurgeRunning
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_ID])


def sweep_phase(now: datetime) -> int:
    """The sweeper's purge phase: one batch of :data:`SWEEP_BATCH` runs, and one batch of
    expired tombstones; nothing while another pass (the CLI's) runs."""
    try:
        report = purge(now, batch=SWEEP_BATCH, max_batches=1)
    except exceptions.PurgeRunning:
        return 0
    return report.total + report.forgotten


@dataclass(frozen=True)
class Batch:
    """One batch: runs ``ids`` of ``workflow`` that finished on ``day`` (UTC)."""

    workflow: str
    day: date
    ids: list[int]


def select_batch(rules: RetentionRules, now: datetime, batch: int) -> Batch | None:
    """The next batch: up to ``batch`` due runs of the workflow and finish day of the run
    that finished first; None when nothing is due."""
    first = _oldest_due(rules, now)
    if first is None:
        return None
    day = first["finished_at"].astimezone(UTC).date()
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    ids = list(due_runs(rules, now).filter(
        name=first["name"], finished_at__gte=start, finished_at__lt=start + timedelta(days=1))
        .order_by("pk").values_list("pk", flat=True)[:batch])
    return Batch(first["name"], day, ids)


def fingerprints(ids: list[int]) -> dict[int, tuple[Any, ...]]:
    """What would tell that a run changed: its revision and updated_at, and its newest
    event, signal, chunk and artifact. Taken before the export; a run whose fingerprint
    differs at the delete is kept (the export may miss the change) for the next pass."""
    def newest(model: Any, column: str = "id") -> Subquery:
        return Subquery(model.objects.filter(run_id=OuterRef("pk")).order_by(f"-{column}")
                        .values(column)[:1])

    rows = WorkflowRun.objects.filter(pk__in=ids).annotate(
        last_event=newest(Event), last_signal=newest(Signal), last_chunk=newest(StepChunk),
        last_artifact=newest(Artifact, "updated_at"),
    ).values_list("pk", "revision", "updated_at", "status", "last_event", "last_signal",
                  "last_chunk", "last_artifact")
    return {row[0]: tuple(row[1:]) for row in rows}


def purge_batch(rules: RetentionRules, now: datetime, batch: int,
                report: PurgeReport) -> bool:
    """Archive and delete one batch (one workflow, one finish day); False when none is due."""
    chosen = select_batch(rules, now, batch)
    if chosen is None:
        return False
    if not chosen.ids:  # the first run left between the two reads
        return True
    before = fingerprints(chosen.ids)
    storage = archive.archive_storage()
    if storage is not None:
        documents = [exports.export(run_id) for run_id in chosen.ids]
        report.objects.append(archive.write_batch(storage, chosen.workflow, chosen.day,
                                                  documents))
    began = time.monotonic()
    purged = delete_batch(rules, before, now)
    report.longest_delete = max(report.longest_delete, time.monotonic() - began)
    for status, count in purged.items():
        key = (chosen.workflow, status)
        report.counts[key] = report.counts.get(key, 0) + count
    # Nothing deleted (every run locked elsewhere or changed): end the pass, not spin on it.
    return bool(purged)


def delete_batch(rules: RetentionRules, before: dict[int, tuple[Any, ...]],
                 now: datetime) -> dict[str, int]:
    """Delete the runs of ``before`` (their fingerprints, :func:`fingerprints`) that are
    still due and unchanged, checked under their row locks (a run locked elsewhere is
    skipped), with their rows, in one transaction; mark their dispatch keys as tombstones.
    Return the counts per status."""
    with transaction.atomic():
        locked = list(due_runs(rules, now).filter(pk__in=list(before))
                      .select_for_update(skip_locked=True, of=("self",))
                      .values_list("pk", flat=True))
        now_seen = fingerprints(locked)
        runs = list(WorkflowRun.objects.filter(pk__in=[
            pk for pk in locked if now_seen.get(pk) == before[pk]]).values(
            "pk", "name", "status", "idempotency_key"))
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
    enqueue of a purged job's key starts a new job (``queuety.jobs.unique``).

    Only a key that still names its purged run is touched (key and run id): a key reused
    since (a unique job's after its ``unique_for``, a key forgotten and taken again before
    an old run was restored) belongs to the newer run."""
    by_keep: dict[tuple[str, timedelta | None], Q] = {}
    jobs = Q(pk__in=[])
    for run in runs:
        key = run["idempotency_key"]
        if not key:
            continue
        own = Q(key=key, run_id=run["pk"])
        if key.startswith(UNIQUE_KEY_PREFIX):
            jobs |= own
        else:
            keep = rules.keep(run["name"], run["status"])
            by_keep[(run["name"], keep)] = by_keep.get((run["name"], keep), Q(pk__in=[])) | own
    DispatchKey.objects.filter(jobs).delete()
    for (name, keep), keys in by_keep.items():
        DispatchKey.objects.filter(keys).update(
            purged_at=now, purged_workflow=name,
            forget_at=None if keep is None else now + keep)


def forget_tombstones(now: datetime, batch: int = BATCH) -> int:
    """Delete up to ``batch`` tombstones whose time has passed; return how many."""
    keys = list(DispatchKey.objects.filter(forget_at__lt=now).order_by("forget_at")
                .values_list("pk", flat=True)[:batch])
    if keys:
        DispatchKey.objects.filter(pk__in=keys, forget_at__lt=now).delete()
    return len(keys)
