"""Starting runs and talking to them: the public functions that dispatch, signal, declare inbound
hooks, triggers and schedules (re-exported by ``queuety``).

Importing this module does not import Django: each function imports the module that does
the work when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from queuety.core.builder import WorkflowBuilder
from queuety.core.keyed import Batch

if TYPE_CHECKING:  # for annotations only: importing it would import Django
    from datetime import timedelta

    from queuety.hooks.declare import InboundHook
    from queuety.inbox import SignalReceipt
    from queuety.keyed import SignalOrStart
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
