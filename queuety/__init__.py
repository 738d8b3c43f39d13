"""Queuety for Django: durable workflows whose steps run on Celery workers.

The public API::

    import queuety

    run_id = queuety.workflow("order").then(Validate).then(charge_card).dispatch({"id": 7})
    queuety.workflow_status(run_id).status     # "running", "completed", "failed", ...

Importing this package does not import Django; the functions that touch the database import
the modules that do the work (``queuety.queries``, ``inbox``, ``operations``, ``timeline``,
``export``) when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from queuety import verifiers as verifiers
from queuety.core.budget import Budget, BudgetView
from queuety.core.builder import WorkflowBuilder, workflow
from queuety.core.diff import DefinitionDiff
from queuety.core.engine import DEFAULT, Route
from queuety.core.handlers import Step, StepContext
from queuety.core.keyed import Batch
from queuety.core.machine import MachineBuilder, machine
from queuety.core.retry import RetryPolicy
from queuety.core.status import WorkflowStatus
from queuety.exceptions import (
    AlreadyAnswered,
    ArtifactNotFound,
    BudgetExceeded,
    BulkOperationNotFound,
    ChildRunFailed,
    IdempotencyConflict,
    InvalidArtifact,
    InvalidMigration,
    InvalidPayload,
    InvalidProgress,
    InvalidSchedule,
    InvalidSignalData,
    InvalidSignature,
    InvalidStateEdit,
    InvalidStepOutput,
    InvalidTransition,
    NotAMachine,
    PermanentError,
    QueuetyError,
    RunConflict,
    RunNotFound,
    RunNotWaiting,
    RunPurged,
    StepTimeout,
    UnknownDefinition,
    UnknownStep,
    UnknownWorkflow,
    UnmatchedRoute,
    WaitExpired,
    WorkerLost,
    WorkflowDefinitionError,
    WorkflowWaitFailed,
)
from queuety.registry import RegisteredWorkflow, register, registered
from queuety.version import __version__ as __version__

__all__ = [
    "DEFAULT",
    "AlreadyAnswered",
    "ArtifactNotFound",
    "Batch",
    "Budget",
    "BudgetExceeded",
    "BudgetView",
    "ChildRunFailed",
    "DefinitionDiff",
    "IdempotencyConflict",
    "InvalidMigration",
    "InvalidPayload",
    "InvalidSchedule",
    "InvalidStateEdit",
    "InvalidProgress",
    "InvalidArtifact",
    "InvalidSignalData",
    "InvalidSignature",
    "InvalidStepOutput",
    "InvalidTransition",
    "PermanentError",
    "QueuetyError",
    "RegisteredWorkflow",
    "RetryPolicy",
    "Route",
    "RunConflict",
    "RunNotFound",
    "NotAMachine",
    "MachineBuilder",
    "RunNotWaiting",
    "RunPurged",
    "Step",
    "StepContext",
    "StepTimeout",
    "UnknownDefinition",
    "UnknownStep",
    "UnknownWorkflow",
    "UnmatchedRoute",
    "WaitExpired",
    "WorkerLost",
    "WorkflowBuilder",
    "WorkflowDefinitionError",
    "WorkflowStatus",
    "WorkflowWaitFailed",
    "alias",
    "approve",
    "artifact",
    "artifacts",
    "cancel",
    "chunks",
    "delete_artifact",
    "diff_definitions",
    "export_workflow",
    "fork",
    "inbound",
    "job_options",
    "chain",
    "batch",
    "list_workflows",
    "migrate_runs",
    "bulk",
    "bulk_status",
    "cancel_bulk",
    "BulkOperationNotFound",
    "pause",
    "pause_definition",
    "pause_queue",
    "queue_stats",
    "register",
    "registered",
    "put_artifact",
    "reject",
    "replay_workflow",
    "queue_budgets",
    "resource_groups",
    "resume",
    "resume_definition",
    "resume_queue",
    "retry",
    "edit_state",
    "rewind",
    "schedule",
    "signal",
    "signal_or_start",
    "start",
    "submit_input",
    "trigger",
    "fire",
    "verifiers",
    "workflow",
    "workflow_state_at",
    "workflow_status",
    "machine",
    "machine_status",
    "workflow_timeline",
]

if TYPE_CHECKING:  # for annotations only: importing it would import Django
    from datetime import timedelta

    from queuety.bulk_actions import BulkProgress
    from queuety.hooks.declare import InboundHook
    from queuety.inbox import SignalReceipt
    from queuety.keyed import SignalOrStart
    from queuety.outputs import ChunkPage
    from queuety.quarantine import BulkResult
    from queuety.queues import QueueStats
    from queuety.run_migration import MigrationReport
    from queuety.schedules import Schedule
    from queuety.triggers.declare import Trigger
    from queuety.triggers.fire import Fired
    from queuety.verifiers import Verifier


def alias(old: str, new: str) -> None:
    """Run the handler at dotted path ``new`` wherever a stored definition names ``old``.

    For a deploy that renames or moves a handler while runs still wait at (or before) a step
    naming it: their definitions keep the old path, and so their hash; the worker imports
    ``new`` instead. It covers every path a definition holds (steps, branches, ``for_each``
    items, compensations, hooks, reducers, conditions, ``retry_on`` classes). Declare it where
    every worker and ``manage.py`` process runs it: an app's ``workflows.py`` or
    ``AppConfig.ready()``, or the module that now holds the handler when the old path's module
    is still there (importing it then declares the alias). ``QUEUETY["HANDLER_ALIASES"]`` does
    the same from the settings, and wins for a path aliased in both. ``manage.py queuety
    deploy-check`` reports each aliased path with its target.

    Raises:
        ValueError: a path is not a dotted import path, ``old`` is ``new``, or the alias
            closes a loop with those already in force; nothing is changed.
    """
    from queuety.core import imports

    imports.alias(old, new)


def machine_status(run_id: int) -> Any:
    """Return the ``MachineStatus`` of state machine run ``run_id``: ``.state``,
    ``.history``, ``.status``, ``.data`` (docs/guide/state-machines.md).

    Raises:
        RunNotFound: no run has that id.
        NotAMachine: the run is not a state machine's.
    """
    from queuety import machines

    return machines.machine_status(run_id)


def workflow_status(run_id: int) -> WorkflowStatus:
    """Return a :class:`WorkflowStatus` snapshot of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
    """
    from queuety import queries

    return queries.workflow_status(run_id)


def job_options(**options: Any) -> Any:
    """Give a task of Django's tasks framework Queuety's options for its jobs (``retry``,
    ``timeout``, ``cost_units``, ``concurrency_group``, ``concurrency_limit``, ``rate_limit``,
    ``queue``); put it over ``@task`` (docs/guide/tasks.md).

    Raises:
        WorkflowDefinitionError: an unknown option or a bad value.
    """
    from queuety.jobs import options as jobs

    return jobs.job_options(**options)


def chain(*tasks: Any, catch: Any = None) -> Any:
    """Tasks of Django's tasks framework to run one after another, each given the return value
    of the one before; ``.enqueue(*args, **kwargs)`` starts it with the first task's arguments
    and returns a ``ChainResult`` (docs/guide/tasks.md, "Chains").

    Raises:
        TypeError: no tasks, or something that is not a task a chain can run.
    """
    from queuety.jobs import chains

    return chains.chain(*tasks, catch=catch)


def batch(items: list[Any], *, then: Any = None, catch: Any = None,
          finally_: Any = None) -> Any:
    """Jobs (tasks of Django's tasks framework, with their arguments) to enqueue together and
    follow as one, with callbacks run exactly once; ``.enqueue()`` returns a ``BatchResult``
    (docs/guide/tasks.md, "Batches").

    Raises:
        TypeError: no items, or an item that is not a task with its arguments.
    """
    from queuety.jobs import batches

    return batches.batch(items, then=then, catch=catch, finally_=finally_)


def start(name: str, payload: dict[str, Any] | None = None, *,
          idempotency_key: str | None = None, key: str | None = None,
          debounce: float | None = None, singleton: bool = False,
          on_conflict: str | None = None, signal: str = "input",
          batch: Batch | None = None, tags: Mapping[str, str] | None = None) -> int:
    """Start a run of the workflow registered as ``name`` (see :func:`register`); return its
    id. With an ``idempotency_key`` already used, return the original run's id instead.
    ``tags`` (``{"customer": "42"}``) label the run, merged over the builder's
    ``.with_tags()`` (docs/guide/operating-runs.md, "Tags").

    Flow control per ``key`` (docs/guide/triggers-and-events.md, "Signal-with-start and flow
    control per key"): ``debounce=seconds`` starts one run once the key has been quiet that
    long, with the last payload (every call returns that pending run's id);
    ``singleton=True`` with ``on_conflict`` ``"reject"`` (the default: :class:`RunConflict`),
    ``"queue"``, ``"replace"`` or ``"signal"`` (the payload goes to the live run as signal
    ``signal``; its id is returned) while a run of the key is live; ``batch=Batch(...)``
    collects the payloads of a key into one run whose state is ``{"items": [...]}`` (every
    call returns the batch's run id).

    Raises:
        UnknownWorkflow: nothing is registered as ``name`` (the error lists what is).
        InvalidPayload: the payload is not a JSON object, or the flow-control options are
            malformed or do not fit together. BudgetExceeded: it is over the workflow's
            ``max_state_bytes``. Nothing is written.
        RunConflict: ``singleton=True, on_conflict="reject"`` found a live run of ``key``.
    """
    from queuety import registry
    from queuety.core.keyed import flow_options

    flow = flow_options(name, key=key, debounce=debounce, singleton=singleton,
                        on_conflict=on_conflict, signal=signal, batch=batch)
    return registry.start_run(name, payload, idempotency_key=idempotency_key, flow=flow,
                              tags=tags)[0]


def signal_or_start(workflow: str | WorkflowBuilder, key: str, signal: str,
                    payload: Any = None) -> SignalOrStart:
    """Deliver signal ``signal`` with ``payload`` to the live run of ``workflow`` (a
    registered name or a builder) with ``key``, or start such a run (empty state) and deliver
    it as its first signal; return ``run_id``, ``started`` and the signal's ``receipt``.

    Concurrent calls of one key start one run, and store their signals in the order they
    commit.

    Raises:
        UnknownWorkflow: ``workflow`` is a name nothing is registered as.
        InvalidPayload: ``key`` is malformed, or no wait of the workflow listens for ``signal``.
        InvalidSignalData: the payload is not JSON, too large, or fails the wait's schema.
    """
    from queuety import keyed, registry

    spec = workflow.build() if isinstance(workflow, WorkflowBuilder) else \
        registry.get(workflow).spec
    return keyed.signal_or_start(spec, key, signal, payload)


def inbound(name: str, *, verify: Verifier, start: Any = None, signal: str | None = None,
            run: Any = None, key: Any = None, payload: Any = None, event_id: Any = None,
            debounce: float | None = None, singleton: bool = False,
            on_conflict: str | None = None, batch: Batch | None = None) -> InboundHook:
    """Declare inbound webhook ``name``, served at ``POST hooks/<name>/`` under the API's
    URLs: each delivery signed as ``verify`` checks starts workflow ``start`` (a registered
    name or a builder) with the event, sends signal ``signal`` to the run ``run(event)``
    names, or (``signal=`` with ``start=`` and ``key=``) to the live run of its key, started
    first if none is live. ``key(event)`` is the run's key, for signal-with-start and the
    flow control ``debounce=``, ``singleton=``/``on_conflict=`` and ``batch=`` (as
    :func:`start` takes them). The provider's delivery id (or ``event_id(event)``)
    deduplicates its retries.

    Declare hooks in an app's ``workflows.py``; see docs/guide/triggers-and-events.md.

    Raises:
        WorkflowDefinitionError: the declaration is incomplete or contradictory (the error
            says which option to fix).
    """
    from queuety.hooks import declare

    return declare.inbound(name, verify=verify, start=start, signal=signal, run=run, key=key,
                           payload=payload, event_id=event_id, debounce=debounce,
                           singleton=singleton, on_conflict=on_conflict, batch=batch)


def trigger(model: Any, *, on: str, start: Any = None, signal: str | None = None,
            run: Any = None, payload: Any = None, key: Any = None, when: Any = None,
            name: str | None = None, **flow: Any) -> Trigger:
    """Declare a trigger: each row of ``model`` (a model class or ``"app_label.Model"``)
    ``on`` ``"created"``, ``"updated"``, ``"deleted"`` or ``"saved"`` starts workflow
    ``start`` (a registered name or a builder), or sends signal ``signal`` to the run
    ``run(instance)`` names, in the save's own transaction. ``payload(instance)``,
    ``key(instance)`` and ``when(instance)`` shape, key and filter it; ``debounce=``,
    ``singleton=``, ``on_conflict=`` and ``batch=`` are flow control per key, as
    :func:`start` takes them.

    Declare triggers in an app's ``workflows.py``; see docs/guide/triggers-and-events.md.

    Raises:
        WorkflowDefinitionError: the declaration is incomplete or contradictory (the error
            says which option to fix).
    """
    from queuety.triggers import fire as fired

    return fired.trigger(model, on=on, start=start, signal=signal, run=run, payload=payload,
                         key=key, when=when, name=name, **flow)


def fire(instance: Any, event: str) -> list[Fired]:
    """Fire the triggers of ``instance``'s model for ``event`` (``"created"``, ``"updated"``
    or ``"deleted"``), as a save would: for ``bulk_create``, ``QuerySet.update()`` and raw
    SQL, which send no per-row signal. Call it in the write's transaction.

    Raises:
        TriggerFailed: a trigger failed; ValueError: an unknown event or an unsaved instance.
    """
    from queuety.triggers import fire as fired

    return fired.fire(instance, event)


def schedule(name: str, *, workflow: str, cron: str | None = None,
             every: timedelta | int | None = None, payload: dict[str, Any] | None = None,
             overlap: str = "allow", timezone: str | None = None,
             enabled: bool = True) -> Schedule:
    """Create or update schedule ``name``, a django-celery-beat ``PeriodicTask`` that starts
    the registered ``workflow`` on ``cron`` (``"0 3 * * *"``) or ``every`` (a timedelta).

    ``overlap`` is ``"allow"``, ``"skip"`` (start nothing while the schedule's previous run is
    live) or ``"buffer"`` (start one once it finishes). See ``queuety.schedules.schedule``.

    Raises:
        InvalidSchedule, UnknownWorkflow, InvalidPayload, BudgetExceeded: nothing is saved.
    """
    from queuety import schedules

    return schedules.schedule(name, workflow=workflow, cron=cron, every=every,
                              payload=payload, overlap=overlap, timezone=timezone,
                              enabled=enabled)


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


def list_workflows(status: str | None = None, limit: int = 50) -> list[WorkflowStatus]:
    """Return up to ``limit`` runs, newest first, optionally only those with ``status``."""
    from queuety import queries

    return queries.list_workflows(status=status, limit=limit)


def resource_groups() -> list[dict[str, Any]]:
    """Every concurrency group with a step in flight or waiting: ``group``, ``in_flight``,
    ``limit``, ``waiting``, ``woken``, ``running_cost``, ``cost_budget``, ``rate_limit`` and
    ``recent_starts`` (docs/guide/resources.md)."""
    from queuety import queries

    return queries.resource_groups()


def queue_budgets() -> list[dict[str, Any]]:
    """Every queue with a cost budget, or with a step still holding or waiting for one:
    ``queue``, ``budget``, ``running``, ``running_cost`` and ``waiting``
    (docs/guide/resources.md)."""
    from queuety import queries

    return queries.queue_budgets()


def signal(run_id: int, name: str, data: Any = None) -> SignalReceipt:
    """Send signal ``name`` with JSON ``data`` to run ``run_id``; return a receipt.

    A signal sent before its wait is reached is kept until the wait consumes it.

    Raises:
        RunNotFound, RunNotWaiting, InvalidSignalData, BudgetExceeded: nothing is recorded.
    """
    from queuety import inbox

    return inbox.send_signal(run_id, name, data)


def approve(run_id: int, data: Any = None, *, signal: str | None = None) -> SignalReceipt:
    """Approve the run's current ``wait_for_approval()`` or ``wait_for_decision()``.

    Raises:
        RunNotWaiting: the run is not waiting for an approval (``AlreadyAnswered`` if its
            wait was answered already).
    """
    from queuety import inbox

    return inbox.reply(run_id, "approve", data, signal=signal)


def reject(run_id: int, data: Any = None, *, signal: str | None = None) -> SignalReceipt:
    """Reject the run's current ``wait_for_decision()``."""
    from queuety import inbox

    return inbox.reply(run_id, "reject", data, signal=signal)


def submit_input(run_id: int, data: Any = None, *, signal: str | None = None) -> SignalReceipt:
    """Answer the run's current ``wait_for_input()``; ``data`` must match its schema as sent.

    Raises:
        InvalidSignalData: ``errors`` lists each failing path; the run keeps waiting.
    """
    from queuety import inbox

    return inbox.reply(run_id, "input", data, signal=signal)


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


def workflow_timeline(run_id: int, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
    """Return the run's events, oldest first."""
    from queuety import timeline

    return timeline.timeline(run_id, limit, offset)


def workflow_state_at(run_id: int, step: int | str) -> dict[str, Any]:
    """Return the public state right after ``step`` (index or name) last completed."""
    from queuety import timeline

    return timeline.state_at(run_id, step)


def export_workflow(run_id: int) -> dict[str, Any]:
    """Return the run as a versioned JSON document (``format_version`` 2: with its
    artifacts and chunks)."""
    from queuety import export

    return export.export(run_id)


def replay_workflow(document: Any) -> int:
    """Start a run that continues where an exported one stood; return its id."""
    from queuety import export

    return export.replay(document)


def diff_definitions(a: str | int, b: str | int) -> DefinitionDiff:
    """Return what changed from stored definition ``a`` to stored definition ``b``: steps
    added, removed and moved, options and handlers changed per step, child workflows, and the
    workflow's own fields (version, budgets, retry, deadline, queue, hooks, ...).

    ``a`` and ``b`` are definition ids, hashes, or unique hash prefixes of at least 8
    characters. The stored JSON is compared, so a definition whose code is gone is still
    diffable; two definitions of different workflows are too (``same_workflow`` is False).
    The diff has ``to_dict()`` (JSON-ready) and ``to_text()``.

    Raises:
        UnknownDefinition: ``a`` or ``b`` matches no stored definition, or a prefix matches
            more than one.
    """
    from queuety import definition_diff

    return definition_diff.diff_definitions(a, b)


def put_artifact(run_id: int, key: str, content: Any, kind: str = "json",
                 metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Store (or replace) artifact ``key`` of run ``run_id`` from outside a step; return its
    summary. Inside a step, use ``context.put_artifact(key, content, kind, metadata)``.

    ``kind``: ``json`` (any JSON value), ``text`` or ``markdown`` (a string), ``bytes``.

    Raises:
        RunNotFound, InvalidArtifact: nothing is written.
    """
    from queuety import outputs

    return outputs.put_artifact(run_id, key, content, kind, metadata)


def artifacts(run_id: int, *, with_content: bool = False) -> list[dict[str, Any]]:
    """Return the run's artifacts by key (without their content unless ``with_content``)."""
    from queuety import outputs

    return outputs.artifacts(run_id, with_content=with_content)


def artifact(run_id: int, key: str) -> dict[str, Any]:
    """Return artifact ``key`` of the run, with its ``content``.

    Raises:
        RunNotFound, ArtifactNotFound.
    """
    from queuety import outputs

    return outputs.artifact(run_id, key)


def delete_artifact(run_id: int, key: str) -> None:
    """Delete artifact ``key`` of the run.

    Raises:
        RunNotFound, ArtifactNotFound.
    """
    from queuety import outputs

    outputs.delete_artifact(run_id, key)


def chunks(run_id: int, step: int | str, *, after: int = -1) -> ChunkPage:
    """Return the chunks streaming step ``step`` (name or position) stored so far, readable
    while it runs; ``after``: only those past that index.

    Raises:
        RunNotFound, UnknownStep.
    """
    from queuety import outputs

    return outputs.chunks(run_id, step, after=after)
