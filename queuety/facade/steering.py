"""Steering runs: cancel, pause, resume, retry, edit, rewind, fork, migrate, bulk actions by
filter, and pausing definitions and queues (re-exported by ``queuety``).

Importing this module does not import Django: each function imports the module that does
the work when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations only: importing it would import Django
    from datetime import timedelta

    from queuety.bulk_actions import BulkProgress
    from queuety.quarantine import BulkResult
    from queuety.queues import QueueStats
    from queuety.run_migration import MigrationReport


def migrate_runs(workflow: str, to: Any = "latest", *, from_definition: str | int | None = None,
                 step_map: dict[str, str] | None = None, state: Any = None,
                 runs: Any = None, dry_run: bool = False, actor: str = "") -> MigrationReport:
    """Move the live runs of ``workflow`` onto definition ``to`` (``"latest"``: the one
    registered now; or a hash, hash prefix or id), each at a step boundary under its lock:
    its current step mapped by name or ``step_map``, its state through ``state(state, run)``,
    its budgets and counters kept. ``dry_run`` reports what each run would do and changes
    nothing. See docs/guide/deploying.md and ``queuety.run_migration.migrate_runs``.

    Raises:
        UnknownDefinition, UnknownWorkflow, InvalidMigration: nothing was changed.
    """
    from queuety import run_migration

    return run_migration.migrate_runs(workflow, to, from_definition=from_definition,
                                      step_map=step_map, state=state, runs=runs,
                                      dry_run=dry_run, actor=actor)


def cancel(run_id: int) -> None:
    """Cancel a run; its compensations and ``on_cancel`` handler then run durably.

    Raises:
        InvalidTransition: the run is already completed or cancelled.
    """
    from queuety import operations

    operations.cancel(run_id)


def pause(run_id: int) -> None:
    """Pause a running or waiting run (a step in flight finishes; nothing new starts)."""
    from queuety import operations

    operations.pause(run_id)


def resume(run_id: int) -> str:
    """Resume a paused run where it stands; return its new status."""
    from queuety import operations

    return operations.resume(run_id)


def bulk(action: str, *, workflow: str | None = None, definition: str | int | None = None,
         status: str | None = None, tags: dict[str, str] | None = None,
         older_than: timedelta | None = None, error_type: str | None = None,
         version: str | None = None, waiting: str | None = None, dry_run: bool = False,
         step: int | str | None = None, to: Any = None, step_map: dict[str, str] | None = None,
         state: str | None = None, user: Any = None, actor: str = "") -> BulkProgress:
    """Act on every run the filter matches (``cancel``, ``pause``, ``resume``, ``retry``,
    ``rewind`` or ``migrate``) as a durable bulk operation a worker processes in chunks, in
    batches of runs of about 100 ms a transaction (each run in a savepoint); return its progress at once (``bulk_status()``
    reads it later, ``cancel_bulk()`` stops it).

    The filter is the runs list's (``GET runs/``): all given keys must match; ``tags`` every
    pair; ``older_than`` runs created longer ago than that, counted from now. Runs dispatched
    after the call are never acted on. A run the action does not apply to is skipped, counted
    by reason. ``rewind`` needs ``step`` (index or name: each run goes back to just after it);
    ``migrate`` needs the ``workflow`` filter and takes ``to`` (default ``"latest"``),
    ``step_map`` and ``state`` (a dotted path) as ``migrate_runs()`` does (its target resolved
    once, now). ``user``: only the runs their ``QUEUETY["RUN_SCOPE"]`` reaches and their
    ``RUN_ACCESS`` allows (default: all). ``dry_run`` counts the matching
    runs, records the request and changes nothing. See docs/guide/operating-runs.md.

    Raises:
        ValueError: an unknown action, argument or filter value; nothing was recorded.
        UnknownDefinition, UnknownWorkflow, InvalidMigration: as ``migrate_runs()``.
    """
    from queuety import bulk_actions

    arguments = {"step": step, "to": to, "step_map": step_map, "state": state}
    filters = {"workflow": workflow, "definition": definition, "status": status,
               "tags": tags, "older_than": older_than, "error_type": error_type,
               "version": version, "waiting": waiting}
    return bulk_actions.start(
        action, filters, {key: value for key, value in arguments.items() if value is not None},
        dry_run=dry_run, user=user, actor=actor)


def bulk_status(op_id: int) -> BulkProgress:
    """The progress of bulk operation ``op_id`` (``queuety.bulk()``).

    Raises:
        BulkOperationNotFound: no operation has that id.
    """
    from queuety import bulk_actions

    return bulk_actions.status(op_id)


def cancel_bulk(op_id: int) -> BulkProgress:
    """Stop bulk operation ``op_id``: no run after the one in hand is acted on; those acted
    on already stay as they are.

    Raises:
        BulkOperationNotFound: no operation has that id.
    """
    from queuety import bulk_actions

    return bulk_actions.cancel(op_id)


def pause_definition(ref: str | int, *, actor: str = "") -> BulkResult:
    """Pause every running or waiting run of one definition: ``ref`` is its id, its hash or a
    unique prefix of it (at least 8 characters). Safe to run again.

    Returns a :class:`~queuety.quarantine.BulkResult`: ``done`` (runs paused), ``skipped`` by
    reason (``already_paused``, ``waiting_for_workflows``, ``finished``, ...) and ``failed``
    (run id: error). Each run's ``workflow_paused`` event records ``actor`` and the hash.

    Raises:
        UnknownDefinition: ``ref`` names no definition; nothing is changed.
    """
    from queuety import quarantine

    return quarantine.pause_definition(ref, actor=actor)


def resume_definition(ref: str | int, *, actor: str = "") -> BulkResult:
    """Resume every paused run of one definition (``ref`` as for :func:`pause_definition`),
    each as :func:`resume` does. A run whose resume raises (a budget breach, say) is listed
    in ``failed`` and the others are still resumed.

    Raises:
        UnknownDefinition: ``ref`` names no definition. WorkflowDefinitionError: the stored
            definition no longer loads here. Nothing is changed in either case.
    """
    from queuety import quarantine

    return quarantine.resume_definition(ref, actor=actor)


def pause_queue(name: str, *, actor: str = "", reason: str = "") -> QueueStats:
    """Pause Celery queue ``name`` site-wide: no step of it starts until
    :func:`resume_queue`; its steps wait throttled (``throttled_by`` reason ``queue
    paused``), nothing failed and no attempt counted. Safe to repeat. Returns the queue's
    :class:`~queuety.queues.QueueStats`.

    Raises:
        QueuetyError: ``name`` is not a queue name.
    """
    from queuety import queues

    return queues.pause_queue(name, actor=actor, reason=reason)


def resume_queue(name: str, *, actor: str = "") -> int:
    """Resume Celery queue ``name``: the steps its pause held are published again and start
    (each through its resource gate). Safe to repeat. Returns how many steps it released."""
    from queuety import queues

    return queues.resume_queue(name, actor=actor)


def queue_stats() -> list[QueueStats]:
    """Every known queue's :class:`~queuety.queues.QueueStats`: paused or not, steps waiting
    and running, the oldest wait, and steps finished over the last 5 minutes."""
    from queuety import queues

    return queues.queue_stats()


def retry(run_id: int, *, from_step: str | int | None = None, actor: str = "") -> None:
    """Run a failed run again from its failed step, or ``from_step`` (``operations.retry``)."""
    from queuety import operations

    operations.retry(run_id, from_step=from_step, actor=actor)


def edit_state(run_id: int, patch: dict[str, Any], *, reason: str, actor: str = ""
               ) -> list[dict[str, Any]]:
    """Merge-patch a paused or failed run's state; the changes (``state_edits.edit_state``)."""
    from queuety import state_edits

    return state_edits.edit_state(run_id, patch, reason=reason, actor=actor).changes


def rewind(run_id: int, step: int | str) -> None:
    """Go back to the state recorded right after ``step`` and continue from the next step."""
    from queuety import operations

    operations.rewind(run_id, step)


def fork(run_id: int) -> int:
    """Start a new run from this run's current state and step; return its id."""
    from queuety import operations

    return operations.fork(run_id)
