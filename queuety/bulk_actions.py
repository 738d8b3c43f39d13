"""Bulk actions by filter: ``queuety.bulk()`` cancels, pauses, resumes, retries, rewinds or
migrates every run the runs list's filter matches, as a durable operation.

An operation is a :class:`~queuety.models.BulkOperation` row: the audit record (who, when,
the filter, the action's arguments) and the progress. A Celery task (``queuety.bulk_operation``)
processes it under a lease: it reads the matching runs by ascending id in chunks of
``QUEUETY["BULK_CHUNK_SIZE"]`` (keyset: ``id > cursor``, bounded by the highest run id at the
start, so runs dispatched later are left alone) and acts on each run in a transaction of its
own, the same per-run operation a single run gets (``queuety.operations``,
``queuety.run_migration``): no lock on more than one run tree at a time, however many match.
The operation's cursor and counts move in that same transaction, so a processor that dies
resumes (the sweeper re-sends the task once its lease lapses: ``queuety.runtime.bulk_recovery``) after the last run it changed,
and never acts on a run twice. Every chunk is narrowed by the requesting user's
``RUN_SCOPE`` (``queuety.scope``), and each run by ``RUN_ACCESS``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import OperationalError, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone

from queuety import exceptions, operations, publish, queries, run_migration, scope
from queuety.conf import settings
from queuety.models import BulkOperation, WorkflowRun

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
        matched = _matching(stored, user, timezone.now()).count()
    with transaction.atomic():
        op = BulkOperation.objects.create(
            action=action, arguments=arguments, filter=stored, dry_run=dry_run,
            requested_by=user, for_user=user is not None, actor=actor)
        if dry_run:
            BulkOperation.objects.filter(pk=op.pk).update(
                status=BulkOperation.DONE, matched=matched, finished_at=op.created_at)
        else:
            bound = _matching(stored, user, op.created_at).aggregate(
                high=Max("pk"), n=Count("pk"))
            BulkOperation.objects.filter(pk=op.pk).update(
                max_run_id=bound["high"] or 0, matched=bound["n"])
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
    _plan(stored["workflow"], given, "")  # an unknown target or step: nothing recorded


def _plan(workflow: str, arguments: Mapping[str, Any], actor: str
          ) -> run_migration.MigrationPlan:
    return run_migration.plan_migration(workflow, arguments.get("to", "latest"),
                                        arguments.get("step_map"), arguments.get("state"),
                                        actor)


def _matching_keys(stored: Mapping[str, Any], as_of: datetime) -> dict[str, Any]:
    keys = {key: value for key, value in stored.items() if key != "older_than"}
    if "older_than" in stored:
        keys["older_than"] = timedelta(seconds=stored["older_than"])
        keys["as_of"] = as_of
    if "tags" in keys and not keys["tags"]:
        del keys["tags"]
    return keys


def _matching(stored: Mapping[str, Any], user: Any, as_of: datetime
              ) -> QuerySet[WorkflowRun]:
    """The runs ``stored`` matches inside ``user``'s scope (``older_than`` counted back from
    ``as_of``: the operation's start, so a resumed operation matches what it matched)."""
    runs = queries.runs_matching(**_matching_keys(stored, as_of))
    return scope.scoped_runs(user, runs.order_by())


def status(op_id: int) -> BulkProgress:
    """The progress of bulk operation ``op_id``.

    Raises:
        BulkOperationNotFound: no operation has that id.
    """
    op = BulkOperation.objects.filter(pk=op_id).first()
    if op is None:
        raise exceptions.BulkOperationNotFound(op_id)
    return progress_of(op)


def cancel(op_id: int) -> BulkProgress:
    """Stop bulk operation ``op_id``: the run in hand finishes, no other is acted on. Runs
    already acted on stay as they are. Cancelling a finished operation changes nothing.

    Raises:
        BulkOperationNotFound: no operation has that id.
    """
    BulkOperation.objects.filter(
        pk=op_id, status__in=(BulkOperation.PENDING, BulkOperation.RUNNING)).update(
        status=BulkOperation.CANCELLED, finished_at=timezone.now(), lease_token="")
    return status(op_id)


class _LeaseLost(Exception):
    """The operation was cancelled, or another worker took its lease over."""


@dataclass
class _Counts:
    acted: int
    skipped: int
    reasons: dict[str, int]


def process(op_id: int, *, max_chunks: int | None = None, release: bool = True) -> str:
    """Work on bulk operation ``op_id`` under a lease until it is done (the task's body);
    return its status as left. ``max_chunks`` stops after that many chunks (``release``
    False: holding the lease, as a worker that died would).

    An operation another worker holds a live lease on is left to it (``"running"``).
    """
    token = _claim(op_id)
    if token is None:
        return BulkOperation.objects.filter(pk=op_id).values_list("status", flat=True).first() \
            or "missing"
    op = BulkOperation.objects.get(pk=op_id)
    user = op.requested_by
    if op.for_user and user is None:
        return _finish(op_id, token, BulkOperation.FAILED, "The user who requested the "
                       "operation no longer exists, so its run scope is unknown; nothing "
                       "more was acted on.")
    counts = _Counts(op.acted, op.skipped, dict(op.skipped_reasons))
    act = _action(op)
    chunks = 0
    cursor = op.cursor
    try:
        while max_chunks is None or chunks < max_chunks:
            ids = list(_matching(op.filter, user, op.created_at)
                       .filter(pk__gt=cursor, pk__lte=op.max_run_id)
                       .order_by("pk").values_list("pk", flat=True)[:settings.BULK_CHUNK_SIZE])
            if not ids:
                return _finish(op_id, token, BulkOperation.DONE)
            for run_id in ids:
                _one(op_id, token, run_id, user, act, counts)
            cursor = ids[-1]
            chunks += 1
    except _LeaseLost:
        logger.info("Bulk operation id=%s stopped: cancelled, or taken over.", op_id)
        return BulkOperation.objects.values_list("status", flat=True).get(pk=op_id)
    if release:
        BulkOperation.objects.filter(pk=op_id, lease_token=token).update(lease_token="")
    return BulkOperation.RUNNING


def _claim(op_id: int) -> str | None:
    """Take the operation's lease (free, or lapsed); its token, or None."""
    now = timezone.now()
    token = uuid.uuid4().hex
    lapsed = now - timedelta(seconds=settings.BULK_LEASE)
    claimed = BulkOperation.objects.filter(
        Q(lease_token="") | Q(heartbeat_at__lt=lapsed), pk=op_id, dry_run=False,
        status__in=(BulkOperation.PENDING, BulkOperation.RUNNING),
    ).update(status=BulkOperation.RUNNING, lease_token=token, heartbeat_at=now,
             started_at=Coalesce("started_at", now))
    return token if claimed else None


def _finish(op_id: int, token: str, final: str, error: str = "") -> str:
    BulkOperation.objects.filter(pk=op_id, lease_token=token).update(
        status=final, finished_at=timezone.now(), lease_token="", error=error)
    logger.info("Bulk operation id=%s %s", op_id, final)
    return final


def _one(op_id: int, token: str, run_id: int, user: Any,
         act: Callable[[int], str | None], counts: _Counts) -> None:
    """Act on one run and move the operation's cursor and counts, in one transaction (a
    deadlock with a step's transition: the run is tried again, up to 3 times)."""
    for attempt in range(3):
        try:
            with transaction.atomic():
                reason = _skip_reason(run_id, user) or _attempt(act, run_id)
                tally = _Counts(counts.acted + (reason is None),
                                counts.skipped + (reason is not None), dict(counts.reasons))
                if reason is not None:
                    tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
                moved = BulkOperation.objects.filter(
                    pk=op_id, lease_token=token, status=BulkOperation.RUNNING).update(
                    cursor=run_id, acted=tally.acted, skipped=tally.skipped,
                    skipped_reasons=tally.reasons, heartbeat_at=timezone.now())
                if not moved:
                    raise _LeaseLost  # rolls this run's change back with it
            counts.acted, counts.skipped, counts.reasons = tally.acted, tally.skipped, \
                tally.reasons
            return
        except OperationalError as error:
            if attempt == 2 or "deadlock" not in str(error):
                raise
            logger.warning("Bulk operation id=%s hit a deadlock on run id=%s; trying again.",
                           op_id, run_id)


def _skip_reason(run_id: int, user: Any) -> str | None:
    if settings.RUN_ACCESS is None or user is None:
        return None
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None:
        return "the run no longer exists"
    return None if scope.may_access(user, run) else "RUN_ACCESS does not let the user act on it"


def _attempt(act: Callable[[int], str | None], run_id: int) -> str | None:
    """Run the action on one run in a savepoint; the reason it did not apply, or None."""
    try:
        with transaction.atomic():
            return act(run_id)
    except exceptions.InvalidTransition as refused:
        return gist(str(refused))
    except exceptions.RunNotFound:
        return "the run no longer exists"
    except (exceptions.QueuetyError, LookupError, ValueError) as refused:
        # A definition that no longer loads, rewind's step that is not in this run: that
        # run is skipped with the reason, the others go on (else a lease taken over again
        # and again would stop at the same run forever).
        return str(refused).rstrip(".")


def gist(message: str) -> str:
    """An :class:`InvalidTransition` message without its run id, so runs refused for one
    reason count together: ``Cannot cancel workflow run 7: it is already completed.`` ->
    ``it is already completed``."""
    _, sep, why = message.partition(": ")
    return (why if sep else message).strip().rstrip(".")


def _action(op: BulkOperation) -> Callable[[int], str | None]:
    """The per-run operation of ``op``: acts on one run, or returns why it did not apply."""
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
