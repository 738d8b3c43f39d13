"""Keyed runs: signal-with-start and flow control per key (``debounce``, ``singleton``,
``batch``).

Every keyed start is one transaction that first takes the key's advisory lock
(``queuety.store.keys.lock_key``), so the starts of one key are serialised across processes
and each decides from what the previous one committed; starts of other keys never wait. The
design is durable: each decision is a run row (or a change to one), never a timer in memory.

- ``signal_or_start``: the key's oldest live run gets the signal; without one, a run is
  started and gets it as its first signal (stored, or settling the wait it parks at).
- ``debounce``: the first start writes a run whose first step is due ``debounce`` seconds
  later; each later start of the key, while that step has not been claimed, replaces the
  run's state with its payload and pushes the due time (the row is changed by a conditional
  update, so the claim and the push never both win). Every start returns the pending run's id.
- ``batch``: the same pending run collects the payloads as ``{"items": [...]}``; it closes
  (its first step becomes due now) at ``max_items``, or at ``max_wait`` after its first item.
- ``singleton``: while a run of the key is live, ``reject`` raises :class:`RunConflict`,
  ``signal`` delivers the payload to it, ``replace`` cancels it (with its compensations) and
  starts the new run, ``queue`` starts a run whose first step is held until the live one
  finishes (``queuety.runtime.finish.notify_finished`` releases it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from queuety import dispatch, exceptions, inbox, operations, publish
from queuety.conf import settings
from queuety.core import keyed
from queuety.core.definition import WaitStep, WorkflowSpec, check_payload
from queuety.core.keyed import FlowOptions
from queuety.core.landing import lands_on_task
from queuety.models import Event
from queuety.store import keys
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")

#: Seconds before its max_wait that a batch takes no more items (the next one opens), or a
#: tenth of max_wait if less: longer than a keyed start's transaction, so a claim that begins
#: meanwhile never misses its item.
BATCH_CLOSING = 1.0


@dataclass(frozen=True, slots=True)
class SignalOrStart:
    """What :func:`signal_or_start` did."""

    run_id: int
    started: bool
    """True when no run of the key was live and this call started ``run_id``."""
    receipt: inbox.SignalReceipt
    """The delivered signal (its id, whether it settled a wait, the run's status)."""


def signal_or_start(spec: WorkflowSpec, key: str, signal: str, payload: Any = None, *,
                    sent_by: str = "") -> SignalOrStart:
    """Deliver signal ``signal`` with ``payload`` to the live run of ``key`` of ``spec``'s
    workflow, or start one (empty state) and deliver it as its first signal.

    Race-safe: concurrent calls of one key start one run, and their signals are stored in
    the order the calls commit.

    Raises:
        InvalidPayload: ``key`` is malformed, or no wait of the workflow listens for ``signal``
            (nothing is started).
        InvalidSignalData: as ``queuety.signal()``; nothing is started or stored.
    """
    options = keyed.flow_options(spec.name, key=key)
    assert options is not None
    _check_listens(spec, key, signal)
    with transaction.atomic():
        keys.lock_key(spec.name, options.key)
        live = _active(spec.name, options.key)
        started = live is None
        run_id = live if live is not None else dispatch.dispatch_run(
            spec, None, key=options.key).run_id
        receipt = inbox.send_signal(run_id, signal, payload, sent_by=sent_by)
    return SignalOrStart(run_id, started, receipt)


def _check_listens(spec: WorkflowSpec, key: str, signal: str) -> None:
    """Refuse a keyed start whose signal no wait of the workflow listens for."""
    if not any(isinstance(step, WaitStep) and signal in step.wait.signals
               for step in spec.steps):
        raise exceptions.InvalidPayload(
            f"No wait of workflow {spec.name!r} listens for signal {signal!r}, so "
            f"a keyed start for key {key!r} would send a signal no run uses; nothing "
            "was started.")


def live_runs(workflow: str, key: str) -> list[int]:
    """The ids of the unfinished (live or pending) runs of ``key`` of ``workflow``, oldest
    first."""
    return keys.live_runs(workflow, key)


def _active(workflow: str, key: str) -> int | None:
    """The oldest live run of ``key``, its row locked (so it cannot finish before this
    transaction commits); None when none is live."""
    return next((run_id for run_id in keys.live_runs(workflow, key) if keys.lock_live(run_id)),
                None)


def start(spec: WorkflowSpec, payload: dict[str, Any] | None, options: FlowOptions, *,
          idempotency_key: str | None = None) -> int:
    """Start a run of ``spec`` under the flow control ``options``; return the run's id.

    That is the new run's id; under ``debounce`` or ``batch``, the pending run's (the same
    for every start it absorbs); with ``on_conflict="signal"`` or ``"existing"`` and a live
    run, the live run's.
    :func:`start_run` says besides whether this start wrote a new run; see there.
    """
    return start_run(spec, payload, options, idempotency_key=idempotency_key).run_id


def start_run(spec: WorkflowSpec, payload: dict[str, Any] | None, options: FlowOptions, *,
              idempotency_key: str | None = None,
              on_conflict: str = "report") -> dispatch.Dispatched:
    """:func:`start`, with ``reused`` True when the start wrote no new run: it joined a
    pending run (``debounce``, ``batch``), signalled a live one, or reused its idempotency key.

    Raises:
        RunConflict: ``singleton=True, on_conflict="reject"`` and a run of the key is live.
        InvalidPayload: the options do not fit the workflow (``debounce``, ``batch`` and
            ``on_conflict="queue"`` need a first task step; ``idempotency_key`` combines
            with ``key`` alone), or the payload is not a JSON object.
    """
    _check_fits(spec, options, idempotency_key)
    with transaction.atomic():
        keys.lock_key(spec.name, options.key)
        if options.mode == "debounce":
            return _debounce(spec, payload, options)
        if options.mode == "batch":
            return _batch(spec, payload, options)
        if options.mode == "singleton":
            return _singleton(spec, payload, options)
        return dispatch.dispatch_run(spec, payload, idempotency_key=idempotency_key,
                                     on_conflict=on_conflict, key=options.key)


def _check_fits(spec: WorkflowSpec, options: FlowOptions, idempotency_key: str | None) -> None:
    if idempotency_key is not None and options.mode is not None:
        raise exceptions.InvalidPayload(
            f"A start of workflow {spec.name!r} with {options.mode}= cannot take an "
            "idempotency_key too: the key already decides which starts share a run. Pass one "
            "of them.")
    if options.mode == "singleton" and options.on_conflict == "signal":
        _check_listens(spec, options.key, options.signal)
    delayed = options.mode in ("debounce", "batch") or options.on_conflict == "queue"
    if delayed and not lands_on_task(spec, 0):
        what = "on_conflict='queue'" if options.mode == "singleton" else f"{options.mode}="
        raise exceptions.InvalidPayload(
            f"{what} needs a workflow whose first step is a task step (its start is a due "
            f"time or a hold on that step); workflow {spec.name!r} starts with "
            f"{spec.steps[0].kind} step {spec.steps[0].name!r}.")


def _debounce(spec: WorkflowSpec, payload: dict[str, Any] | None, options: FlowOptions) -> dispatch.Dispatched:
    assert options.debounce is not None
    state = dispatch.first_state(spec, payload)
    due = keyed.debounce_due(timezone.now(), options.debounce)
    pending = keys.not_started(spec.name, options.key)
    on_broker = options.debounce <= settings.MAX_ETA
    if pending is not None and keys.push_due(pending[1], due, on_broker):
        run_id, step_run_id, definition_pk = pending
        keys.write_state(run_id, state)
        if on_broker:
            publish.publish_on_commit([publish.message_for(
                load_spec(definition_pk), step_run_id, 0, options.debounce)])
        Event.objects.create(run_id=run_id, kind="debounce_extended",
                             data={"due": due.isoformat(), "state": state})
        return dispatch.Dispatched(run_id, True)
    return dispatch.dispatch_run(spec, payload, delay=options.debounce, key=options.key)


def _batch(spec: WorkflowSpec, payload: dict[str, Any] | None, options: FlowOptions) -> dispatch.Dispatched:
    batch = options.batch
    assert batch is not None and batch.max_wait is not None
    item = {} if payload is None else payload
    pending = keys.not_started(spec.name, options.key)
    if pending is not None:
        run_id, step_run_id, definition_pk = pending
        items = [*keys.run_state(run_id).get("items", []), item]
        full = batch.is_full(len(items))
        now = timezone.now()
        # A batch not yet full keeps its due time (max_wait from its first item); either way
        # the conditional update locks the row, or finds it due or claimed: closed. One due
        # within BATCH_CLOSING is closed too (see keys.push_due: a kept due time needs it).
        margin = min(BATCH_CLOSING, batch.max_wait / 10)
        if keys.push_due(step_run_id, now if full else None, True, margin=margin):
            keys.write_state(run_id, check_payload(spec.name, keyed.batch_state(items)))
            if full:
                publish.publish_on_commit([publish.message_for(load_spec(definition_pk),
                                                               step_run_id, 0)])
            Event.objects.create(run_id=run_id, kind="batch_item",
                                 data={"items": len(items), "closed": full})
            return dispatch.Dispatched(run_id, True)
    state = check_payload(spec.name, keyed.batch_state([item]))
    delay = None if batch.is_full(1) else batch.max_wait
    return dispatch.dispatch_run(spec, state, delay=delay, key=options.key)


def _singleton(spec: WorkflowSpec, payload: dict[str, Any] | None,
               options: FlowOptions) -> dispatch.Dispatched:
    key, conflict = options.key, options.on_conflict
    if conflict == "replace":
        _cancel_live(spec.name, key)
        return dispatch.dispatch_run(spec, payload, key=key)
    live = _active(spec.name, key)
    if live is None:
        return dispatch.dispatch_run(spec, payload, key=key)
    if conflict == "reject":
        raise exceptions.RunConflict(spec.name, key, live)
    if conflict == "existing":
        return dispatch.Dispatched(live, True)  # an idempotent start: the live run is the one
    if conflict == "signal":
        inbox.send_signal(live, options.signal, payload, sent_by=f"singleton start of {key!r}")
        return dispatch.Dispatched(live, True)
    return _queue(spec, payload, key, live)


def _cancel_live(workflow: str, key: str) -> None:
    """Cancel the live runs of ``key`` (with their compensations), newest first, so a queued
    one is never released by the cancel of the run before it."""
    for run_id in reversed(keys.live_runs(workflow, key)):
        try:
            operations.cancel(run_id, actor=f"a replacing start of key {key!r}")
        except exceptions.InvalidTransition:  # it finished meanwhile
            continue


def _hold_delay() -> float:
    """How far a queued run's first step is put off before it is held: past ``MAX_ETA``, so
    no message is published for it (``runtime.finish.release_queued`` publishes one)."""
    return float(settings.MAX_ETA) + 86_400.0


def _queue(spec: WorkflowSpec, payload: dict[str, Any] | None, key: str,
           live: int) -> dispatch.Dispatched:
    queued = dispatch.dispatch_run(spec, payload, delay=_hold_delay(), key=key)
    run_id = queued.run_id
    keys.hold_first_step(run_id)
    Event.objects.create(run_id=run_id, kind="keyed_run_queued",
                         data={"key": key, "behind": live})
    logger.info("Run id=%s queued behind live run id=%s of key %r", run_id, live, key)
    return queued
