"""Row helpers shared by the runtime and the use cases: cursors, locks, counts, factories.

The lock order every writer follows: a run's live step rows, then the run row, then (for a
tree) the rows of its children. A worker finishing a step locks its step row and then the run
row; operations that also write live step rows lock them first, so the two never deadlock.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    connection,
)
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Count, Q
from django.db.models.functions import Now

from queuety import exceptions
from queuety.core.budget import Usage
from queuety.core.definition import WorkflowSpec
from queuety.core.landing import Reminder, RunView
from queuety.core.status import LIVE, LIVE_OR_HELD
from queuety.models import RunStatus, StepRun, StepStatus, Worker, WorkflowRun
from queuety.store import sql
from queuety.store.definitions import effective_policy

logger = logging.getLogger("queuety")

#: SQLSTATEs after which the same transaction, run again, may well succeed as it stands.
SERIALIZATION_FAILURES = ("40001", "40P01")

#: The SQLSTATE of a statement PostgreSQL cancelled (its ``statement_timeout`` passed).
QUERY_CANCELED = "57014"


# -- cursors and database errors --------------------------------------------------------------

def hot_cursor() -> CursorWrapper:
    """A cursor for the statements every step runs (dispatch, claim, transition).

    When the site allows prepared statements on its connections (Django's
    ``OPTIONS["prepare_threshold"]``, off by default because transaction-mode poolers such as
    PgBouncer before 1.21 cannot keep them), it binds parameters on the server, so psycopg
    prepares these statements and PostgreSQL stops planning them on every call: the
    transition's plan costs more than its execution. Otherwise, Django's own cursor.

    Once a hot statement failed because the connection's pooler does not keep prepared
    statements (:func:`pooler_mismatch`), this process logs the fix once and prepares them no
    more: Django's own cursor from then on.
    """
    if connection.vendor != "postgresql" or _unprepared or \
            connection.settings_dict.get("OPTIONS", {}).get("prepare_threshold") is None:
        return connection.cursor()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    # Wrapped by Django, so statements pass execute_wrapper hooks and are logged when asked.
    raw = psycopg.Cursor(connection.connection)
    if connection.queries_logged:
        return _HotDebugCursor(raw, connection)
    return _HotCursor(raw, connection)


def execute_hot(statement: str, params: Any) -> Any:
    """Run a hot statement that commits by itself and return its one row.

    A statement a pooler refused for want of its prepared statement never ran (it failed at
    Parse or Bind): it is run once more, unprepared, on a new connection, when this is not
    inside a transaction (whose owner must see the error).
    """
    for tries in (0, 1):
        try:
            with hot_cursor() as cursor:
                cursor.execute(statement, params)
                return cursor.fetchone()
        except DatabaseError as error:
            if tries or connection.in_atomic_block or not warn_pooler_mismatch_once(error):
                raise
            with suppress(Exception):  # Django forgets the connection even if closing fails
                connection.close()
    raise AssertionError("unreachable")  # pragma: no cover


class _HotCursor(CursorWrapper):
    """Django's wrapper of a server-binding cursor: a statement the pooler refused for want
    of its prepared statement is reported (:func:`warn_pooler_mismatch_once`)."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        try:
            return super().execute(sql, params)
        except DatabaseError as error:
            warn_pooler_mismatch_once(error)
            raise


class _HotDebugCursor(CursorDebugWrapper):
    """Logs a hot statement as written (placeholders and all): after a prepared execution,
    psycopg has no interpolated query text for Django to report."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(sql, params):
            try:
                return super(CursorDebugWrapper, self).execute(sql, params)
            except DatabaseError as error:
                warn_pooler_mismatch_once(error)
                raise


# -- prepared statements behind a pooler ------------------------------------------------------

#: What PostgreSQL answers, through PgBouncer in transaction mode (1.18 measured), when a
#: connection's prepared statements were made on another server session: the statement is
#: missing there (26000), another client made one of that name there (42P05), or another
#: client's statement of that name takes a different number of parameters (08P01). In every
#: case the statement failed at Parse or Bind, before it executed.
_POOLER_MISMATCH = {
    "26000": re.compile(r"prepared statement .* does not exist"),
    "42P05": re.compile(r"prepared statement .* already exists"),
    "08P01": re.compile(r"bind message supplies \d+ parameters?, but prepared statement .* "
                        r"requires \d+|bind message has \d+ parameter formats but \d+ "
                        r"parameters"),
}

#: Set once this process met a pooler mismatch: the hot cursor prepares nothing more, and the
#: ERROR naming the fix is not logged again (a process forked after inherits both).
_unprepared = False


def pooler_mismatch(error: BaseException, alias: str = "default") -> str | None:
    """The fix, when ``error`` (a database error Django raised, or the driver's) says that
    prepared statements do not survive the connection's pooler; None for any other error.

    Pure inspection of the error and its ``__cause__`` (SQLSTATE and message), for any
    database: the SQLSTATEs and messages are PostgreSQL's, seen through PgBouncer in
    transaction mode before 1.21.
    """
    for candidate in (error, error.__cause__):
        sqlstate = getattr(candidate, "sqlstate", None)
        if sqlstate in _POOLER_MISMATCH and _POOLER_MISMATCH[sqlstate].search(str(candidate)):
            return (
                "Queuety's database connection goes through a pooler that does not keep "
                "prepared statements (PgBouncer in transaction mode before 1.21, or without "
                f"max_prepared_statements): remove OPTIONS['prepare_threshold'] from "
                f"DATABASES[{alias!r}] (the demo settings: unset QUEUETY_PREPARED_STATEMENTS), "
                "or run PgBouncer 1.21 or later with max_prepared_statements set, or connect "
                "to PostgreSQL directly (docs/deploy/running-workers.md, 'Behind PgBouncer')."
            )
    return None


def warn_pooler_mismatch_once(error: BaseException) -> bool:
    """Whether ``error`` is a pooler mismatch (:func:`pooler_mismatch`). The first one a
    process meets is logged at ERROR with the fix, and turns prepared statements off for the
    rest of the process (:func:`hot_cursor`); later ones are not logged again."""
    global _unprepared
    fix = pooler_mismatch(error, connection.alias)
    if fix is None:
        return False
    if not _unprepared:
        _unprepared = True
        logger.error("%s This process (pid %s) prepares no statement from now on. The "
                     "statement failed with %s, SQLSTATE %s: %s", fix, os.getpid(),
                     type(error.__cause__ or error).__name__,
                     getattr(error, "sqlstate", None) or sqlstate_of(error), str(error).strip())
    return True


def json_value(value: Any) -> Any:
    """A JSON column read by a raw statement: decoded where the driver returned text."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def sqlstate_of(error: BaseException) -> str | None:
    """The PostgreSQL SQLSTATE of a database error Django raised (None when it carries none,
    as for a lost connection or another backend)."""
    return getattr(error.__cause__, "sqlstate", None)


def is_refusal(error: BaseException) -> bool:
    """A database error that trying the same statement again would not fix: the schema does
    not match the code (class 42), the data or a constraint refused it (22, 23), or a pooler
    that drops prepared statements refused it again after this process stopped preparing.
    A statement timeout, a lock timeout or a read-only standby may pass: not refusals."""
    if isinstance(error, ProgrammingError | DataError | IntegrityError | NotSupportedError):
        return True
    return pooler_mismatch(error) is not None and not is_transient(error)


def is_transient(error: BaseException) -> bool:
    """A database error after which the same transition may well succeed: on PostgreSQL a
    serialization failure, a deadlock, or a lost or refused connection (no SQLSTATE, classes
    08 and 57P: PgBouncer's own errors, such as ``query_wait_timeout``, are 08P01 too); on
    SQLite a busy or locked database.

    A pooler mismatch (:func:`pooler_mismatch`, whatever its class: 26000 and 42P05 are
    ProgrammingErrors, the bind parameter-count error an 08P01) is not a lost connection. The
    statement failed before it executed; it is transient only once this process stopped
    preparing (:func:`warn_pooler_mismatch_once`, which the hot cursor calls) and only the hot
    statements were prepared (no ``server_side_binding``): then the same transition, on a new
    connection (close this one: its statement cache matches no server session), runs
    unprepared and succeeds.
    """
    if pooler_mismatch(error) is not None:
        return _unprepared and connection.settings_dict.get("OPTIONS", {}).get(
            "server_side_binding") is not True
    if not isinstance(error, OperationalError | InterfaceError):
        return False
    if connection.vendor == "sqlite":
        name: str = getattr(error.__cause__, "sqlite_errorname", "")
        return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    sqlstate = sqlstate_of(error)
    return sqlstate is None or sqlstate in SERIALIZATION_FAILURES or sqlstate.startswith(
        ("08", "57P"))


def limit_statements(seconds: float | None, *, reset: bool = False) -> None:
    """Bound each statement of the current transaction to ``seconds`` on PostgreSQL
    (``SET LOCAL statement_timeout``, at least 1 ms); nothing elsewhere (SQLite has no such
    limit) or without ``seconds``. With ``reset``, put the session's own limit back for the
    rest of the transaction. Call it inside ``transaction.atomic()``: the limit ends with the
    transaction."""
    if connection.vendor != "postgresql" or (seconds is None and not reset):
        return
    with connection.cursor() as cursor:
        if seconds is None:
            cursor.execute("SET LOCAL statement_timeout = DEFAULT")
        else:
            cursor.execute(f"SET LOCAL statement_timeout = {max(1, round(seconds * 1000))}")


# -- runs -------------------------------------------------------------------------------------

def get_run(run_id: Any) -> WorkflowRun:
    """Return run ``run_id``.

    Raises:
        RunNotFound: no run has that id (also for an id that is not a number).
    """
    try:
        return WorkflowRun.objects.get(pk=run_id)
    except (WorkflowRun.DoesNotExist, ValueError, TypeError):
        raise exceptions.RunNotFound(run_id) from None


def lock_run(run_id: Any, *, steps_first: bool = False,
             fields: Iterable[str] | None = None) -> WorkflowRun:
    """Lock run ``run_id``'s row for this transaction and return it (only ``fields``, if given).

    With ``steps_first``, its live step rows are locked before it: the lock order of a worker
    finishing a step, for operations that write live step rows too.

    Raises:
        RunNotFound: no run has that id.
    """
    if steps_first:
        list(StepRun.objects.select_for_update().filter(run_id=run_id, kind="step",
                                                        status__in=LIVE).values_list("pk"))
    runs = WorkflowRun.objects.select_for_update()
    if fields is not None:
        runs = runs.only(*fields)
    try:
        return runs.get(pk=run_id)
    except (WorkflowRun.DoesNotExist, ValueError, TypeError):
        raise exceptions.RunNotFound(run_id) from None


def bound_lock_waits(seconds: float) -> None:
    """Make this transaction's lock waits fail after ``seconds`` (PostgreSQL's
    ``SET LOCAL lock_timeout``, which ends with the transaction: safe behind PgBouncer).

    For the sweeper: a row another transaction holds for long (a site's own code) must cost
    one run's phase, never the whole sweep, whose lease would then pass from worker to worker
    each blocked on the same row.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)",
                           [f"{int(seconds * 1000)}ms"])


def lock_free_runs(ids: Iterable[int], statuses: Iterable[str]) -> list[tuple[int, str]]:
    """Lock, for this transaction, those of runs ``ids`` whose status is one of ``statuses``,
    skipping the rows another transaction holds; return ``(id, status)`` of each, by id.

    It never waits for a lock, so it cannot close a deadlock cycle however many rows it takes:
    the bulk operations lock a chunk of runs this way, then handle the skipped ones alone.
    """
    return list(WorkflowRun.objects.select_for_update(skip_locked=True)
                .filter(pk__in=list(ids), status__in=list(statuses)).order_by("pk")
                .values_list("pk", "status"))


#: The columns the step boundary reads of a run it locks.
BOUNDARY_FIELDS = ("name", "definition_id", "status", "state", "current_step", "transitions",
                   "cost_units", "started_workflows", "error")


#: The columns a landing reads of the run it moves (:func:`run_view`): lock with these.
RUN_VIEW_FIELDS = (*BOUNDARY_FIELDS, "wait_expires_at", "state_writes", "loops", "groups",
                   "migration", "remind_at", "waiting_since", "reminders")


def run_view(run: WorkflowRun, now: datetime) -> RunView:
    """The landing's snapshot of ``run``, locked (or created) by this transaction at ``now``
    and read with :data:`RUN_VIEW_FIELDS`; reading it makes no query.

    Raises:
        ValueError: ``run`` was read without some of those columns (a deferred column would
            be read again, one query each, with no lock of its own).
    """
    missing = run.get_deferred_fields() & set(RUN_VIEW_FIELDS)
    if missing:
        raise ValueError(f"Run {run.pk} was locked without the columns {sorted(missing)} a "
                         "landing reads; lock it with fields=rows.RUN_VIEW_FIELDS.")
    return RunView(run.pk, run.status, run.current_step, run.transitions, run.wait_expires_at,
                   run.state, usage_of(run), dict(run.state_writes or {}), dict(run.loops or {}),
                   dict(run.groups or {}), now, run.migration, reminder_of(run))


def reminder_of(run: WorkflowRun) -> Reminder | None:
    """The reminders of the wait ``run`` is parked at, as its row holds them."""
    if run.waiting_since is None:
        return None
    return Reminder(run.remind_at, run.waiting_since, run.reminders)


def usage_of(run: WorkflowRun) -> Usage:
    """The budget counters a run has used (its state's size is not counted here)."""
    return Usage(run.transitions, run.cost_units, run.started_workflows)


def stop_live_steps(run_id: int, now: datetime) -> int:
    """Cancel a run's live and held step rows; a processing attempt then finds its row
    cancelled when it finishes and discards its outcome. Returns how many."""
    return StepRun.objects.filter(run_id=run_id, kind="step", status__in=LIVE_OR_HELD
                                  ).update(status=StepStatus.CANCELLED, finished_at=now)


def waiters_of(run_id: int) -> tuple[list[int], tuple[str, str] | None]:
    """The runs waiting for run ``run_id`` (its parent and the runs whose wait names it), and
    its ``(workflow, key)`` when it has a key; one statement."""
    waiters, keyed = [], None
    with connection.cursor() as cursor:
        cursor.execute(sql.WAITERS, [run_id, run_id, run_id])
        for waiter, name, key in cursor.fetchall():
            if key is not None:
                keyed = (name, key)
            else:
                waiters.append(waiter)
    return waiters, keyed


def awaited_runs(ids: list[int], *, lock: bool) -> list[tuple[int, str, dict[str, Any]]]:
    """``(id, status, state)`` of the runs ``ids``; with ``lock`` on PostgreSQL marked awaited
    and read FOR SHARE (see :data:`queuety.store.sql.AWAITED_FOR_SHARE`)."""
    if lock and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql.MARK_AWAITED, [ids])
            cursor.execute(sql.AWAITED_FOR_SHARE, [ids])
            return [(pk, status, json_value(data)) for pk, status, data in cursor.fetchall()]
    return list(WorkflowRun.objects.filter(pk__in=ids).values_list("pk", "status", "state"))


def finished_dependencies() -> list[int]:
    """Runs parked at a workflow wait one of whose awaited runs finished (up to 200)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.FINISHED_DEPENDENCIES)
        return [row[0] for row in cursor.fetchall()]


def tree_attempts(run_id: int) -> int:
    """Step attempts made or due in the tree below run ``run_id``, serialised with every other
    check of that tree until this transaction ends (parallel branches failing at once).

    Holders never wait for a row lock of another run after taking the advisory lock, so it
    cannot close a deadlock cycle. SQLite serialises writers anyway.
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(sql.ATTEMPTS_LOCK, [sql.ATTEMPTS_LOCK_KEY, run_id])
        cursor.execute(sql.TREE_ATTEMPTS, [run_id])
        used: int = cursor.fetchone()[0]
    return used


# -- step rows --------------------------------------------------------------------------------

def lock_live_step(step_run_id: int) -> StepRun | None:
    """Lock step row ``step_run_id`` for this transaction if it is still pending or
    processing; None otherwise."""
    return StepRun.objects.select_for_update().filter(pk=step_run_id, status__in=LIVE).first()


def lock_due_unpublished(now: datetime, silent_since: datetime,
                         limit: int = 1000) -> list[tuple[int, int, float | None, int, str]]:
    """Lock (skipping rows another sweeper holds) the due pending rows of running runs, and
    the due cleanup rows, whose message never went out or went out before ``silent_since``;
    return ``(id, definition id, timeout, step index, kind)`` of each. Call in a
    transaction."""
    return list(
        StepRun.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(Q(run__status=RunStatus.RUNNING) | ~Q(kind="step"),
                status=StepStatus.PENDING, available_at__lte=now)
        .filter(Q(published_at__isnull=True) | Q(published_at__lt=silent_since))
        .values_list("pk", "run__definition_id", "timeout", "step_index", "kind")[:limit])


def new_step_run(run_pk: int, spec: WorkflowSpec, index: int, *, seq: int, now: datetime,
                 published: bool = True) -> StepRun:
    """Create the pending row of task step ``index`` of a run, due at ``now``."""
    step = spec.steps[index]
    return StepRun.objects.create(
        run_id=run_pk, seq=seq, step_index=index, step_name=step.name,
        max_attempts=effective_policy(spec, index).max_attempts, timeout=step.timeout,
        available_at=now, published_at=now if published else None,
    )


def fanout_counts(run_id: int, seq: int, index: int) -> tuple[int, int, int]:
    """Rows of one pass of a fan-out step: (all, completed, failed)."""
    counts = dict(StepRun.objects.filter(run_id=run_id, kind="step", seq=seq, step_index=index)
                  .values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    return (sum(counts.values()), counts.get(StepStatus.COMPLETED, 0),
            counts.get(StepStatus.FAILED, 0))


def fanout_rows(run_id: int, seq: int, index: int) -> list[dict[str, Any]]:
    """The branches or items of one pass of a fan-out step, in order, as the join reads them."""
    rows = (StepRun.objects.filter(run_id=run_id, kind="step", seq=seq, step_index=index)
            .order_by("branch").values("branch", "status", "output", "error", "input",
                                       "finished_at"))
    return [{"index": r["branch"], "item": (r["input"] or {}).get("item"),
             "status": r["status"], "output": r["output"],
             "error": None if not r["error"] else {k: r["error"].get(k) for k in
                                                  ("type", "message")},
             "finished_at": r["finished_at"]} for r in rows]


# -- workers ----------------------------------------------------------------------------------

def record_worker(name: str, processes: list[str], started_at: datetime) -> None:
    """Say that worker ``name`` (its main process) is alive, with its pool ``processes``.

    Stamped with the database's clock, as the sweeper compares it: a worker whose own clock
    is behind is not taken for a lost one.
    """
    Worker.objects.update_or_create(name=name, defaults={
        "processes": processes, "started_at": started_at, "beat_at": Now()})


def forget_worker(name: str) -> None:
    """Remove worker ``name`` from the registry (it shut down cleanly)."""
    Worker.objects.filter(name=name).delete()


def forget_workers(ids: list[int]) -> None:
    """Remove the lost workers ``ids`` from the registry (what they held was taken back)."""
    Worker.objects.filter(pk__in=ids).delete()


def registered_workers(names: set[str]) -> set[str]:
    """Those of the worker ``names`` that are in the registry (alive, or not yet found lost)."""
    return set(Worker.objects.filter(name__in=names).values_list("name", flat=True))


def lock_lost_workers(lost_after: timedelta, limit: int) -> list[Worker]:
    """Lock, for this transaction, the workers that have not beaten for ``lost_after`` by the
    database's clock (those another sweeper holds are skipped)."""
    return list(Worker.objects.select_for_update(skip_locked=True)
                .filter(beat_at__lt=Now() - lost_after).order_by("beat_at")[:limit])


def lock_pending_sent_before(moment: datetime,
                             limit: int = 1000
                             ) -> list[tuple[int, int, float | None, datetime, int, str]]:
    """Lock (skipping rows another sweeper holds) the pending rows of running runs, and the
    pending cleanup rows, whose message a worker lost at ``moment`` may have held: sent by
    then (``published_at`` is the send time of a due row's message) or due after it (a
    back-off's or a delay's message waits in the worker that reserved it, and its
    ``published_at`` is its due time). Return ``(id, definition id, timeout, due at, step
    index, kind)``."""
    return list(
        StepRun.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(Q(run__status=RunStatus.RUNNING) | ~Q(kind="step"),
                status=StepStatus.PENDING, published_at__isnull=False)
        .filter(Q(published_at__lte=moment) | Q(available_at__gt=moment))
        .values_list("pk", "run__definition_id", "timeout", "available_at", "step_index",
                     "kind")[:limit])


def append_chunk(params: list[Any]) -> bool:
    """Run :data:`queuety.store.sql.APPEND_CHUNK`; False when the attempt no longer owns its
    step row (nothing was written)."""
    with hot_cursor() as cursor:
        cursor.execute(sql.APPEND_CHUNK, params)
        return bool(cursor.rowcount)


def add_tags(run_id: int, tags: dict[str, str]) -> None:
    """Merge ``tags`` (checked) into run ``run_id``'s tags, a key's new value replacing its
    old one; in the caller's transaction (a step's transition, which holds the row's lock).
    No revision bump: tags are no part of the run's state."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("UPDATE queuety_workflowrun SET tags = tags || %s::jsonb "
                           "WHERE id = %s", [json.dumps(tags), run_id])
        return
    held = WorkflowRun.objects.filter(pk=run_id).values_list("tags", flat=True).first() or {}
    WorkflowRun.objects.filter(pk=run_id).update(tags={**held, **tags})
