"""Bulk actions by filter: ``queuety.bulk()`` cancels, pauses, resumes, retries, rewinds or
migrates every run the runs list's filter matches, as a durable operation.

An operation is a :class:`~queuety.models.BulkOperation` row: the audit record (who, when,
the filter, the action's arguments) and the progress. A Celery task (``queuety.bulk_operation``)
processes it under a lease: it reads the matching runs by ascending id in chunks of
``QUEUETY["BULK_CHUNK_SIZE"]`` (keyset: ``id > cursor``, bounded by the highest run id at the
start, so runs dispatched later are left alone) and acts on them in batches, one transaction
of about 100 ms each (``BATCH_SECONDS``), each run in a savepoint, with the same per-run
operation a single run gets (``queuety.operations``, ``queuety.run_migration``). A batch's
first statement takes the operation's row (a claimer waits for it) and its last moves the
cursor, counts and heartbeat, so a processor that dies resumes (the sweeper re-sends the
task once its lease lapses: ``queuety.runtime.bulk_recovery``) after the last run it
changed, and never acts on a run twice. Every chunk is narrowed by the requesting user's
``RUN_SCOPE`` (``queuety.scope``), and each run by ``RUN_ACCESS``.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, OperationalError, transaction
from django.db.models import Case, Count, F, Max, Q, QuerySet, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from queuety import exceptions, operations, publish, queries, run_migration, scope
from queuety.conf import settings
from queuety.models import BulkOperation, WorkflowRun
from queuety.store import rows

logger = logging.getLogger("queuety")

#: The actions ``queuety.bulk()`` takes, and the arguments each accepts besides the filter.
ACTIONS: dict[str, tuple[str, ...]] = {
    "cancel": (), "pause": (), "resume": (), "retry": (), "rewind": ("step",),
    "migrate": ("to", "step_map", "state"),
}
#: The filter keys (those of ``queuety.queries.runs_matching``, and ``tags``).
FILTER_KEYS = ("workflow", "definition", "status", "version", "waiting", "tags",
               "older_than", "error_type")


@dataclass(frozen=True)
class BulkProgress:
    """What a bulk operation did so far (``queuety.bulk_status()``)."""

    id: int
    action: str
    status: str
    dry_run: bool
    filter: dict[str, Any]
    arguments: dict[str, Any]
    requested_by: str
    matched: int
    acted: int
    skipped: int
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    error: str = ""
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def processed(self) -> int:
        """Runs dealt with so far (acted on or skipped)."""
        return self.acted + self.skipped

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape the API answers and the CLI prints."""
        return {"id": self.id, "action": self.action, "status": self.status,
                "dry_run": self.dry_run, "filter": self.filter, "arguments": self.arguments,
                "requested_by": self.requested_by, "matched": self.matched,
                "acted": self.acted, "skipped": self.skipped, "processed": self.processed,
                "skipped_reasons": self.skipped_reasons, "error": self.error,
                "created_at": self.created_at, "started_at": self.started_at,
                "finished_at": self.finished_at}


def progress_of(op: BulkOperation) -> BulkProgress:
    """The :class:`BulkProgress` of an operation row."""
    return BulkProgress(
        op.pk, op.action, op.status, op.dry_run, op.filter, op.arguments, op.actor,
        op.matched, op.acted, op.skipped, dict(op.skipped_reasons), op.error,
        op.created_at, op.started_at, op.finished_at)


def start(action: str, filters: Mapping[str, Any], arguments: Mapping[str, Any] | None = None,
          *, dry_run: bool = False, user: Any = None, actor: str = "") -> BulkProgress:
    """Record a bulk operation and send it to a worker (``queuety.bulk()``; see it). A dry
    run only counts the runs the filter matches (within ``user``'s scope), records that
    and changes nothing.

    Raises:
        ValueError: an unknown action, filter key or argument, or a bad filter value.
        UnknownDefinition, UnknownWorkflow, InvalidMigration: migrate's target is wrong.
    """
    stored, arguments = check(action, filters, arguments or {})
    if dry_run:
        # Read before writing: a filter that fails to evaluate records nothing.
        matched = _count(_matching(stored, user, timezone.now()), user)
    with transaction.atomic():
        op = BulkOperation.objects.create(
            action=action, arguments=arguments, filter=stored, dry_run=dry_run,
            requested_by=user, for_user=user is not None, actor=actor)
        if dry_run:
            BulkOperation.objects.filter(pk=op.pk).update(
                status=BulkOperation.DONE, matched=matched, finished_at=op.created_at)
        else:
            runs = _matching(stored, user, op.created_at)
            bound = runs.aggregate(high=Max("pk"), n=Count("pk"))
            BulkOperation.objects.filter(pk=op.pk).update(
                max_run_id=bound["high"] or 0,
                matched=bound["n"] if _unchecked(user) else _count(runs, user))
            transaction.on_commit(lambda: publish.bulk_operation(op.pk))
    logger.info("Bulk %s id=%s%s recorded by %s for filter %s", action, op.pk,
                " (dry run)" if dry_run else "", actor or "-", stored)
    return status(op.pk)


def check(action: str, filters: Mapping[str, Any], arguments: Mapping[str, Any]
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The filter as stored (JSON: ``older_than`` in seconds, unset keys left out) and the
    action's arguments, checked.

    Raises:
        ValueError, UnknownDefinition, UnknownWorkflow, InvalidMigration: as :func:`start`.
    """
    if action not in ACTIONS:
        raise ValueError(f"Unknown bulk action {action!r}; use one of {', '.join(ACTIONS)}.")
    unknown = sorted(set(filters) - set(FILTER_KEYS))
    if unknown:
        raise ValueError(f"Unknown filter key(s) {', '.join(unknown)}; a bulk action filters "
                         f"on {', '.join(FILTER_KEYS)}.")
    stored = {key: value for key, value in filters.items() if value is not None}
    if not stored:
        raise ValueError("A bulk action needs at least one filter key (one of "
                         f"{', '.join(FILTER_KEYS)}); with none it would act on every run. "
                         "To mean every run of a status, give that status.")
    older = stored.get("older_than")
    if isinstance(older, timedelta):
        stored["older_than"] = older.total_seconds()
    elif older is not None and (isinstance(older, bool) or not isinstance(older, int | float)):
        raise ValueError(f"older_than must be a timedelta (got {older!r}).")
    tags = stored.get("tags")
    if tags is not None and (not isinstance(tags, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in tags.items())):
        raise ValueError(f"tags must be a dict of strings to strings (got {tags!r}).")
    allowed = ACTIONS[action]
    extra = sorted(set(arguments) - set(allowed))
    if extra:
        raise ValueError(f"Bulk {action} takes no argument {', '.join(extra)}"
                         + (f"; it takes {', '.join(allowed)}." if allowed else "."))
    given = {key: value for key, value in arguments.items() if value is not None}
    if action == "rewind" and not isinstance(given.get("step"), int | str):
        raise ValueError("Bulk rewind needs step=: the step (index or name) each run goes "
                         "back to just after.")
    if action == "migrate":
        _check_migrate(stored, given)
    queries.runs_matching(**_matching_keys(stored, timezone.now()))  # bad values: ValueError
    return stored, given


def _check_migrate(stored: dict[str, Any], given: dict[str, Any]) -> None:
    if not isinstance(stored.get("workflow"), str):
        raise ValueError("Bulk migrate needs the workflow filter: runs move onto another "
                         "definition of their own workflow.")
    given.setdefault("to", "latest")
    # An unknown target or step: nothing recorded. The target is resolved once, here: "latest"
    # is what it is at the start, however many deploys happen while the operation runs.
    given["definition_id"] = _plan(stored["workflow"], given, "").to_pk


def _plan(workflow: str, arguments: Mapping[str, Any], actor: str
          ) -> run_migration.MigrationPlan:
    return run_migration.plan_migration(
        workflow, arguments.get("definition_id") or arguments.get("to", "latest"),
        arguments.get("step_map"), arguments.get("state"), actor)


def _matching_keys(stored: Mapping[str, Any], as_of: datetime) -> dict[str, Any]:
    keys = {key: value for key, value in stored.items() if key != "older_than"}
    if "older_than" in stored:
        keys["older_than"] = timedelta(seconds=stored["older_than"])
        keys["as_of"] = as_of
    if "tags" in keys and not keys["tags"]:
        del keys["tags"]
    return keys


def _unchecked(user: Any) -> bool:
    """Whether no ``RUN_ACCESS`` check applies to ``user``'s runs (so SQL counts them)."""
    return settings.RUN_ACCESS is None or user is None


def _count(runs: QuerySet[WorkflowRun], user: Any) -> int:
    """How many of ``runs`` ``user`` may act on: with a ``RUN_ACCESS``, each run is asked
    about (a count of runs it hides would tell the user they exist)."""
    if _unchecked(user):
        return runs.count()
    return sum(scope.may_access(user, run) for run in runs.iterator(chunk_size=2000))


def operations_of(user: Any) -> QuerySet[BulkOperation]:
    """The bulk operations ``user`` may see: all of them, but with a ``RUN_SCOPE`` only
    those they requested, and with a ``RUN_ACCESS`` alone only those too unless they are a
    superuser (another's filter and counts are of runs they may not see)."""
    found = BulkOperation.objects.all()
    if user is None:
        return found
    if scope.is_scoped() or (settings.RUN_ACCESS is not None
                             and not getattr(user, "is_superuser", False)):
        return found.filter(requested_by_id=getattr(user, "pk", None))
    return found


def recent(user: Any, limit: int = 20) -> list[BulkProgress]:
    """The ``limit`` most recent bulk operations, newest first: every one for ``user`` None
    (an operator), else those ``user`` requested (however they started them)."""
    found = BulkOperation.objects.order_by("-pk")
    if user is not None:
        found = found.filter(requested_by_id=user.pk)
    return [progress_of(op) for op in found[:limit]]


def _matching(stored: Mapping[str, Any], user: Any, as_of: datetime
              ) -> QuerySet[WorkflowRun]:
    """The runs ``stored`` matches inside ``user``'s scope (``older_than`` counted back from
    ``as_of``: the operation's start, so a resumed operation matches what it matched)."""
    runs = queries.runs_matching(**_matching_keys(stored, as_of))
    return scope.scoped_runs(user, runs.order_by())


def status(op_id: int, *, requested_by: Any = None) -> BulkProgress:
    """The progress of bulk operation ``op_id`` (with ``requested_by``, only if that user
    requested it).

    Raises:
        BulkOperationNotFound: no operation has that id (that the user requested).
    """
    found = BulkOperation.objects.filter(pk=op_id)
    if requested_by is not None:
        found = found.filter(requested_by_id=requested_by.pk)
    op = found.first()
    if op is None:
        raise exceptions.BulkOperationNotFound(op_id)
    return progress_of(op)


def cancel(op_id: int) -> BulkProgress:
    """Stop bulk operation ``op_id``: the batch of runs in hand (a transaction of about
    100 ms) finishes, no other run is acted on. Runs already acted on stay as they are.
    Cancelling a finished operation changes nothing.

    Raises:
        BulkOperationNotFound: no operation has that id.
    """
    BulkOperation.objects.filter(
        pk=op_id, status__in=(BulkOperation.PENDING, BulkOperation.RUNNING)).update(
        status=BulkOperation.CANCELLED, finished_at=timezone.now(), lease_token="")
    return status(op_id)


#: Leases taken over with no progress in between before an operation is marked failed.
MAX_STALLS = 5
#: How long one task works on an operation before it sends the task again to continue
#: (seconds): a long operation does not hold a worker slot for its whole length.
TIME_SLICE = 20.0
#: How long a batch's transaction should last (seconds); its size adapts to that.
BATCH_SECONDS = 0.1
#: Longest wait for a run's (or the operation's) row lock before giving up on it (seconds).
LOCK_WAIT = 5.0
#: At most this many distinct skip reasons are counted; the rest count under ``other``.
MAX_REASONS = 20
OTHER = "other"
#: SQLSTATEs after which the same run may well succeed alone in a new transaction: a
#: deadlock, a serialization failure, a lock wait or a statement over its time.
_BUSY = {"40P01": "a deadlock", "40001": "a serialization failure",
         "55P03": "its row stayed locked", "57014": "a statement ran out of time"}


class _LeaseLost(Exception):
    """The operation was cancelled, or another worker took its lease over."""


class _Busy(Exception):
    """A run's change failed in a way that trying it again alone may fix (see ``_BUSY``)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


#: ``_apply``'s answer for a run ``RUN_ACCESS`` hides: not counted at all.
_HIDDEN = object()


@dataclass
class _Counts:
    acted: int
    skipped: int
    reasons: dict[str, int]

    def add(self, reason: str | None) -> None:
        if reason is None:
            self.acted += 1
            return
        self.skipped += 1
        key = reason_key(reason)
        if key not in self.reasons and len(self.reasons) >= MAX_REASONS:
            key = OTHER
        self.reasons[key] = self.reasons.get(key, 0) + 1


def process(op_id: int, *, max_chunks: int | None = None, release: bool = True,
            time_slice: float = TIME_SLICE) -> str:
    """Work on bulk operation ``op_id`` under a lease (the task's body); return its status as
    left. After ``time_slice`` seconds it lets the lease go and sends the task again to go
    on. ``max_chunks`` stops after that many chunks (``release`` False: holding the lease,
    as a worker that died would).

    An operation another worker holds a live lease on is left to it (``"running"``).
    """
    token = _claim(op_id)
    if token is None:
        return BulkOperation.objects.filter(pk=op_id).values_list("status", flat=True).first() \
            or "missing"
    op = BulkOperation.objects.get(pk=op_id)
    failed = _cannot_go_on(op)
    if failed:
        return _finish(op_id, token, BulkOperation.FAILED, failed)
    try:
        act = _action(op)
    except exceptions.QueuetyError as error:
        return _finish(op_id, token, BulkOperation.FAILED,
                       f"Bulk operation {op_id} cannot act: {error}")
    try:
        left = _chunks(op, token, act, max_chunks, time.monotonic() + time_slice)
    except _LeaseLost:
        logger.info("Bulk operation id=%s stopped: cancelled, or taken over.", op_id)
        return BulkOperation.objects.values_list("status", flat=True).get(pk=op_id)
    except Exception as error:
        _record_error(op_id, token, error)
        raise
    if left != BulkOperation.RUNNING:
        return left
    if release:
        BulkOperation.objects.filter(pk=op_id, lease_token=token).update(lease_token="")
        if max_chunks is None:
            publish.bulk_operation(op_id)  # the next time slice
    return BulkOperation.RUNNING


def _cannot_go_on(op: BulkOperation) -> str:
    """Why ``op`` must stop as failed now (a full sentence), or ""."""
    if op.for_user and op.requested_by is None:
        return (f"Bulk operation {op.pk} failed: the user who requested it no longer exists, "
                "so its run scope is unknown; nothing more was acted on.")
    if op.stalls >= MAX_STALLS:
        return (f"Bulk operation {op.pk} failed: its lease was taken over {op.stalls} times "
                f"with no run dealt with after run id {op.cursor} (a worker died or failed "
                f"there each time); the last error: {op.error or 'none was recorded'}. "
                "Runs acted on stay as they are; start the operation again once it is fixed.")
    return ""


def _chunks(op: BulkOperation, token: str, act: Callable[[int], str | None],
            max_chunks: int | None, deadline: float) -> str:
    """Process ``op``'s chunks until it is done (its final status), out of time or out of
    ``max_chunks`` (``running``)."""
    counts = _Counts(op.acted, op.skipped, dict(op.skipped_reasons))
    cursor, chunks, size = op.cursor, 0, 10
    while max_chunks is None or chunks < max_chunks:
        ids = _chunk(op, token, cursor)
        if not ids:
            return _finish(op.pk, token, BulkOperation.DONE)
        while ids:
            started = time.monotonic()
            done = _batch(op.pk, token, ids[:size], op.requested_by, act, counts)
            cursor, ids = ids[done - 1], ids[done:]
            # Sized so that one transaction (the run rows it locks) lasts ~BATCH_SECONDS.
            took = max(time.monotonic() - started, 1e-3)
            size = max(1, min(200, int(size * BATCH_SECONDS / took) if done == size
                               else size))
        chunks += 1
        if time.monotonic() > deadline:
            break
    return BulkOperation.RUNNING


def _chunk(op: BulkOperation, token: str, cursor: int) -> list[int]:
    """The next chunk's run ids after ``cursor``, the lease renewed before and after (a
    query bounded to half the lease, so it cannot outlast it)."""
    _renew(op.pk, token)
    with transaction.atomic():
        rows.limit_statements(settings.BULK_LEASE / 2)
        ids = list(chunk_of(op.filter, op.requested_by, op.created_at, cursor=cursor,
                            high=op.max_run_id))
    _renew(op.pk, token)
    return ids


def chunk_of(stored: Mapping[str, Any], user: Any, as_of: datetime, *, cursor: int,
             high: int) -> QuerySet[WorkflowRun]:
    """The ids of the next chunk of runs ``stored`` matches for ``user``: after ``cursor``,
    up to ``high``, ascending (``(name, id)``, ``(definition_id, id)`` or ``(status, -id)``
    serve it as an index range scan in that order, with no sort)."""
    return (_matching(stored, user, as_of).filter(pk__gt=cursor, pk__lte=high)
            .order_by("pk").values_list("pk", flat=True)[:settings.BULK_CHUNK_SIZE])


def _renew(op_id: int, token: str) -> None:
    """Move the lease's heartbeat on, or raise ``_LeaseLost``."""
    if not BulkOperation.objects.filter(pk=op_id, lease_token=token,
                                        status=BulkOperation.RUNNING).update(
            heartbeat_at=timezone.now()):
        raise _LeaseLost


def _claim(op_id: int) -> str | None:
    """Take the operation's lease (free, or lapsed: a stall counted); its token, or None. A
    batch in progress holds the row: the claim waits for it (bounded), then finds the
    heartbeat it left fresh."""
    now = timezone.now()
    token = uuid.uuid4().hex
    lapsed = now - timedelta(seconds=settings.BULK_LEASE)
    try:
        with transaction.atomic():
            rows.bound_lock_waits(LOCK_WAIT)
            claimed = BulkOperation.objects.filter(
                Q(lease_token="") | Q(heartbeat_at__lt=lapsed), pk=op_id, dry_run=False,
                status__in=(BulkOperation.PENDING, BulkOperation.RUNNING),
            ).update(status=BulkOperation.RUNNING, lease_token=token, heartbeat_at=now,
                     started_at=Coalesce("started_at", now),
                     stalls=Case(When(lease_token="", then=F("stalls")),
                                 default=F("stalls") + 1))
    except OperationalError as error:
        if rows.sqlstate_of(error) != "55P03":
            raise
        return None  # a live batch holds it for longer than a batch should: it is alive
    return token if claimed else None


def _finish(op_id: int, token: str, final: str, error: str = "") -> str:
    BulkOperation.objects.filter(pk=op_id, lease_token=token).update(
        status=final, finished_at=timezone.now(), lease_token="", error=error)
    logger.info("Bulk operation id=%s %s%s", op_id, final, f": {error}" if error else "")
    return final


def _record_error(op_id: int, token: str, error: BaseException) -> None:
    """Keep the error that stopped this worker on the operation (best effort: the database
    may be what failed), for the operation's ``error`` once it is marked failed."""
    logger.exception("Bulk operation id=%s stopped on an error; the sweeper sends it again "
                     "once its lease lapses.", op_id)
    try:
        BulkOperation.objects.filter(pk=op_id, lease_token=token).update(
            error=f"{type(error).__name__}: {error}"[:2000])
    except Exception:  # noqa: BLE001 - the original error is the one to raise
        logger.warning("Bulk operation id=%s: could not record the error.", op_id)


def _batch(op_id: int, token: str, ids: list[int], user: Any,
           act: Callable[[int], str | None], counts: _Counts) -> int:
    """Act on runs ``ids`` (each in a savepoint) and move the operation's cursor and counts,
    in one transaction whose first statement takes the operation's row (a claimer waits for
    it); return how many runs it dealt with. A run that fails in a way that may pass ends
    the batch before it; alone, it is tried three times, then skipped with the reason."""
    for attempt in range(3):
        tally = _Counts(counts.acted, counts.skipped, dict(counts.reasons))
        done = 0
        with transaction.atomic():
            rows.bound_lock_waits(LOCK_WAIT)
            _renew(op_id, token)
            for run_id in ids:
                try:
                    reason = _apply(run_id, user, act)
                except _Busy as busy:
                    if done or attempt < 2:
                        logger.warning("Bulk operation id=%s: run id=%s hit %s; trying it "
                                       "again.", op_id, run_id, busy.why)
                        break
                    reason = f"{busy.why}, three times"
                if reason is not _HIDDEN:
                    tally.add(reason)  # type: ignore[arg-type]
                done += 1
            if done:
                BulkOperation.objects.filter(pk=op_id, lease_token=token).update(
                    cursor=ids[done - 1], acted=tally.acted, skipped=tally.skipped,
                    skipped_reasons=tally.reasons, heartbeat_at=timezone.now(), stalls=0)
        if done:
            counts.acted, counts.skipped, counts.reasons = tally.acted, tally.skipped, \
                tally.reasons
            return done
    return 0  # not reached: the third attempt alone always deals with the run


def _apply(run_id: int, user: Any, act: Callable[[int], str | None]) -> Any:
    """Act on one run in a savepoint: None, the reason it did not apply, or ``_HIDDEN``.

    Raises:
        _Busy: see ``_BUSY``.
        DatabaseError: the database itself failed (a lost connection): the task stops.
    """
    try:
        with transaction.atomic():
            if not _unchecked(user):
                run = WorkflowRun.objects.filter(pk=run_id).first()
                if run is None:
                    return "the run no longer exists"
                if not scope.may_access(user, run):
                    return _HIDDEN
            return act(run_id)
    except exceptions.InvalidTransition as refused:
        return gist(str(refused))
    except exceptions.RunNotFound:
        return "the run no longer exists"
    except (exceptions.QueuetyError, LookupError, ValueError) as refused:
        # A definition that no longer loads, rewind's step that is not in this run: that
        # run is skipped with the reason, the others go on.
        return str(refused).rstrip(".")
    except DatabaseError as error:
        why = _BUSY.get(rows.sqlstate_of(error) or "")
        if why is not None:
            raise _Busy(why) from error
        if not rows.is_refusal(error):
            raise
        logger.warning("Bulk action on run id=%s refused by the database: %s", run_id, error)
        return f"the database refused the change ({type(error).__name__})"
    except Exception as error:  # noqa: BLE001 - one bad run must not stall the operation
        logger.exception("Bulk action on run id=%s raised.", run_id)
        return f"an unexpected error ({type(error).__name__})"


_RUN_ID = re.compile(r"\b(?:[Ww]orkflow )?[Rr]un (?:id=|#)?\d+\b")


def reason_key(reason: str) -> str:
    """A skip reason without run ids, so runs skipped for one reason count under one key:
    ``Run 7 is already on that definition`` -> ``the run is already on that definition``."""
    return _RUN_ID.sub("the run", reason).strip()


def gist(message: str) -> str:
    """An :class:`InvalidTransition` message without its run id, so runs refused for one
    reason count together: ``Cannot cancel workflow run 7: it is already completed.`` ->
    ``it is already completed``."""
    _, sep, why = message.partition(": ")
    return (why if sep else message).strip().rstrip(".")


def _action(op: BulkOperation) -> Callable[[int], str | None]:
    """The per-run operation of ``op``: acts on one run, or returns why it did not apply.

    Raises:
        QueuetyError: migrate's target definition no longer loads.
    """
    actor = f"bulk operation {op.pk} ({op.actor or 'operator'})"
    arguments = op.arguments
    if op.action == "rewind":
        step = arguments["step"]
        return lambda run_id: operations.rewind(run_id, step, actor=actor)
    if op.action == "migrate":
        plan = _plan(op.filter["workflow"], arguments, actor)
        return lambda run_id: _migrate(run_id, plan)
    simple: dict[str, Callable[..., Any]] = {
        "cancel": operations.cancel, "pause": operations.pause, "resume": operations.resume,
        "retry": operations.retry}
    operation = simple[op.action]

    def act(run_id: int) -> None:
        operation(run_id, actor=actor)
    return act


def _migrate(run_id: int, plan: run_migration.MigrationPlan) -> str | None:
    if WorkflowRun.objects.filter(pk=run_id, definition_id=plan.to_pk,
                                  migration__isnull=True).exists():
        return "it is on the target definition already"
    move = run_migration.move_run(run_id, plan)
    if move.outcome in (run_migration.SKIPPED, run_migration.FAILED):
        return f"{move.outcome}: {move.reason}".rstrip(".")
    return None
