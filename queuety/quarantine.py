"""Quarantine a definition: pause every live run of one stored definition, resume them in bulk.

A deploy that changes a workflow leaves the runs of its old definition where they stand.
Pausing them all keeps workers from moving them while the change is checked, and resuming
puts them back to work. Ten thousand runs take one call. Both calls read the definition's
unfinished runs once, then work through them by id in chunks (:data:`CHUNK`,
:data:`RESUME_CHUNK`), one transaction per chunk, so no lock is held for long:

- **pause** locks the chunk's running and waiting runs, skipping any row a worker holds at that
  moment, and pauses them with one UPDATE and one INSERT of events
  (:func:`queuety.operations.pause_locked`, which is what ``operations.pause`` writes for one);
- **resume** locks the chunk's paused runs the same way and resumes each one through
  :func:`queuety.operations.resume` in a savepoint of its own. Its step is published, and a
  wait may settle on the signals stored meanwhile. A run whose resume raises (a budget breach,
  say) is rolled back alone and reported, and the others proceed.

A run a worker held is handled alone once the chunks are done: ``operations.pause`` or
``resume`` waits for its lock. A run that finished or changed meanwhile is counted as skipped, by its status then.
Runs started meanwhile (by a process still running the old code) are picked up in another
round. Each event records ``"definition": <hash>`` besides ``by``, so the run's timeline says
why it was paused. Both calls can be run again: a second pause pauses nothing more and counts
the runs as ``already_paused``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import QuerySet

from queuety import exceptions, operations
from queuety.core.status import FINISHED
from queuety.models import RunStatus, WorkflowDefinition, WorkflowRun
from queuety.store import rows
from queuety.store.definitions import find_definition, load_spec

logger = logging.getLogger("queuety")

#: Runs per transaction when pausing: one UPDATE and one INSERT for them all, so a chunk holds
#: its rows for 50 to 80 ms.
CHUNK = 500
#: Runs per transaction when resuming. Each resume is a landing of its own (some 6 ms on a
#: busy 2-core machine, benchmarks/quarantine.py), and the chunk's rows stay locked until the
#: last one is done: 0.3 to 0.8 s for 50. Larger chunks resumed no faster there.
RESUME_CHUNK = 50

#: How many times the definition's unfinished runs are read. The first read finds the runs
#: to act on; each later one finds only the runs started since the previous read.
ROUNDS = 5

#: Why a run was left as it was: its status, then, for each action.
PAUSE_SKIPS: dict[str, str] = {RunStatus.PAUSED: "already_paused",
                               RunStatus.WAITING_FOR_WORKFLOWS: "waiting_for_workflows",
                               **{status: "finished" for status in FINISHED}}
RESUME_SKIPS: dict[str, str] = {RunStatus.RUNNING: "not_paused",
                                RunStatus.WAITING_FOR_SIGNAL: "not_paused",
                                RunStatus.WAITING_FOR_WORKFLOWS: "not_paused",
                                **{status: "finished" for status in FINISHED}}


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkResult:
    """What :func:`pause_definition` or :func:`resume_definition` did to the runs of one
    definition."""

    action: str
    """``"pause"`` or ``"resume"``."""
    definition_id: int
    definition_hash: str
    workflow: str
    done: int
    """Runs paused (or resumed) by this call."""
    skipped: dict[str, int]
    """Runs left as they were, by reason: ``already_paused``, ``waiting_for_workflows``
    (pause only), ``not_paused`` (resume only), ``finished`` (not counted with ``include``:
    it would have to read each of them); ``not_permitted`` (``include`` refused them),
    ``deleted`` (purged meanwhile), ``changed`` (their status changed back and forth
    meanwhile)."""
    failed: dict[int, str]
    """Runs whose operation raised, by id, with the error's message; nothing was written for
    them."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document the command line and the API print: ``paused`` (or
        ``resumed``), ``skipped`` and ``failed`` (a list of ``{"run_id", "error"}``)."""
        return {"action": self.action,
                "definition": {"id": self.definition_id, "hash": self.definition_hash,
                               "workflow": self.workflow},
                "paused" if self.action == "pause" else "resumed": self.done,
                "skipped": dict(sorted(self.skipped.items())),
                "failed": [{"run_id": pk, "error": error}
                           for pk, error in sorted(self.failed.items())]}


#: Narrows the runs a bulk action reads, in SQL (``queuety.scope.scoped_runs`` for a user).
Scope = Callable[[QuerySet[WorkflowRun]], QuerySet[WorkflowRun]]


@dataclass(slots=True)
class _Tally:
    done: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Context:
    """What every run of one call is done with."""

    actor: str
    reason: dict[str, Any]
    include: Callable[[WorkflowRun], bool] | None
    scope: Scope | None = None


@dataclass(frozen=True, slots=True)
class _Action:
    name: str
    eligible: tuple[str, ...]
    skips: dict[str, str]
    batch: Callable[[list[tuple[int, str]], _Context, _Tally], list[int]]
    """Act on a chunk's locked runs inside its transaction; return the runs to do alone
    after it commits."""
    one: Callable[[int, _Context], object]
    """Act on one run in a transaction of its own (``InvalidTransition`` if it moved on)."""


def pause_definition(ref: str | int, *, actor: str = "", chunk_size: int = CHUNK,
                     include: Callable[[WorkflowRun], bool] | None = None,
                     scope: Scope | None = None) -> BulkResult:
    """Pause every running run, and every run waiting for a signal, of the definition ``ref``
    names (its id, its hash or a unique prefix of it).

    A step in flight finishes; nothing new starts. Runs waiting for other workflows are left
    (``waiting_for_workflows``): pause the runs they wait for, or pause again once they woke.
    With ``include``, only the runs it accepts are paused (the others: ``not_permitted``).
    With ``scope``, only the runs it keeps are read at all: the others are neither changed
    nor counted.

    Raises:
        UnknownDefinition: ``ref`` names no definition; nothing is changed.
    """
    definition = find_definition(ref)
    return _sweep(_PAUSE, definition, actor, chunk_size, _Context(
        actor, {"definition": definition.definition_hash}, include, scope))


def resume_definition(ref: str | int, *, actor: str = "", chunk_size: int = RESUME_CHUNK,
                      include: Callable[[WorkflowRun], bool] | None = None,
                      scope: Scope | None = None) -> BulkResult:
    """Resume every paused run of the definition ``ref`` names, as ``queuety.resume()`` does
    for each: its step is published again; a wait is evaluated against the signals stored
    meanwhile. Runs paused one by one are resumed too. ``include`` and ``scope``: as for
    :func:`pause_definition`.

    Raises:
        UnknownDefinition: ``ref`` names no definition. WorkflowDefinitionError: the stored
            definition no longer loads here (a class it names was removed). Nothing is
            changed in either case.
    """
    definition = find_definition(ref)
    load_spec(definition.pk)  # refused once, for the definition, rather than once per run
    return _sweep(_RESUME, definition, actor, chunk_size, _Context(
        actor, {"definition": definition.definition_hash}, include, scope))


def _sweep(action: _Action, definition: WorkflowDefinition, actor: str, chunk_size: int,
           context: _Context) -> BulkResult:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1 (got {chunk_size}).")
    tally = _Tally()
    runs = WorkflowRun.objects.filter(definition_id=definition.pk)
    if context.scope is not None:
        runs = context.scope(runs)
    # Finished runs are counted, not read: a definition may have millions of them. Counted
    # before the unfinished ones are read, so no run is counted twice (one that finishes in
    # between is not counted at all: it needed nothing).
    if context.include is None:
        tally.skipped["finished"] += runs.filter(status__in=FINISHED).count()
    after = 0
    for _ in range(ROUNDS):
        found = list(runs.filter(pk__gt=after).exclude(status__in=FINISHED).order_by("pk")
                     .values_list("pk", "status"))
        if not found:
            break
        after = found[-1][0]
        alone = [pk for chunk in _chunks(found, chunk_size)
                 for pk in _chunk(action, chunk, context, tally)]
        # After every chunk, so a row held for long holds up no other: the operation waits
        # for each one's lock and says what became of the run.
        for pk in alone:
            _alone(action, pk, context, tally)
    else:
        logger.warning("Runs of definition id=%s keep being started; %s them again once no "
                       "process starts it.", definition.pk, action.name)
    result = BulkResult(action=action.name, definition_id=definition.pk,
                        definition_hash=definition.definition_hash, workflow=definition.name,
                        done=tally.done, skipped={k: n for k, n in tally.skipped.items() if n},
                        failed=dict(tally.failed))
    logger.info("Definition id=%s hash=%s %s by %s: %s done, skipped %s, %s failed",
                definition.pk, definition.definition_hash[:12], action.name, actor or "-",
                result.done, result.skipped, len(result.failed))
    return result


def _chunks(items: Sequence[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _chunk(action: _Action, chunk: list[tuple[int, str]], context: _Context,
           tally: _Tally) -> list[int]:
    """Act on one chunk of ``(id, status)`` pairs, as read before it; return the runs to do
    alone."""
    ids = []
    for pk, status in chunk:
        if status in action.eligible:
            ids.append(pk)
        else:
            tally.skipped[action.skips[status]] += 1
    if context.include is not None:
        ids = _permitted(ids, context.include, tally)
    if not ids:
        return []
    with transaction.atomic():
        locked = rows.lock_free_runs(ids, action.eligible)
        alone = action.batch(locked, context, tally)
    # Not locked: a worker (or an operator) held the row, or the run left the status since
    # it was read.
    taken = {pk for pk, _ in locked}
    return [pk for pk in ids if pk not in taken] + alone


def _permitted(ids: list[int], include: Callable[[WorkflowRun], bool],
               tally: _Tally) -> list[int]:
    runs = {run.pk: run for run in WorkflowRun.objects.filter(pk__in=ids)}
    kept = []
    for pk in ids:
        run = runs.get(pk)
        if run is None:
            tally.skipped["deleted"] += 1
        elif include(run):
            kept.append(pk)
        else:
            tally.skipped["not_permitted"] += 1
    return kept


def _alone(action: _Action, pk: int, context: _Context, tally: _Tally) -> None:
    try:
        action.one(pk, context)
    except exceptions.InvalidTransition:
        status = WorkflowRun.objects.filter(pk=pk).values_list("status", flat=True).first()
        tally.skipped["deleted" if status is None else action.skips.get(status, "changed")] += 1
    except exceptions.RunNotFound:
        tally.skipped["deleted"] += 1
    except exceptions.QueuetyError as error:
        tally.failed[pk] = str(error)
    except DatabaseError as error:
        if rows.sqlstate_of(error) not in rows.SERIALIZATION_FAILURES:
            raise
        tally.failed[pk] = (f"PostgreSQL aborted the {action.name} of run {pk} to break a "
                            "deadlock; nothing was written. Run the command again.")
    else:
        tally.done += 1


def _pause_batch(locked: list[tuple[int, str]], context: _Context, tally: _Tally) -> list[int]:
    operations.pause_locked(locked, actor=context.actor, reason=context.reason)
    tally.done += len(locked)
    return []


def _resume_batch(locked: list[tuple[int, str]], context: _Context,
                  tally: _Tally) -> list[int]:
    again = []
    for pk, _ in locked:
        try:
            # Its own atomic block is a savepoint inside the chunk's transaction: a resume that
            # raises rolls back alone (its messages unsent), and the chunk goes on.
            operations.resume(pk, actor=context.actor, reason=context.reason)
        except exceptions.QueuetyError as error:
            tally.failed[pk] = str(error)
        except DatabaseError as error:
            # PostgreSQL broke a deadlock with a worker by aborting this resume: rolled back to
            # its savepoint, the chunk's transaction goes on, and the run is resumed alone
            # after.
            if rows.sqlstate_of(error) not in rows.SERIALIZATION_FAILURES:
                raise
            again.append(pk)
        else:
            tally.done += 1
    return again


_PAUSE = _Action(
    "pause", operations.PAUSABLE, PAUSE_SKIPS, _pause_batch,
    lambda pk, context: operations.pause(pk, actor=context.actor, reason=context.reason))
_RESUME = _Action(
    "resume", (RunStatus.PAUSED,), RESUME_SKIPS, _resume_batch,
    lambda pk, context: operations.resume(pk, actor=context.actor, reason=context.reason))
