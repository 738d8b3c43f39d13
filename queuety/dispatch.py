"""Starting runs: ``dispatch()``, its one-statement fast path, and idempotency keys."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from queuety import exceptions, publish, signals, tracing
from queuety.conf import settings
from queuety.core import budget as budgets
from queuety.core import tags as tag_rules
from queuety.core.definition import WorkflowSpec, canonical_json, check_payload
from queuety.core.machine import initial_state
from queuety.models import DispatchKey, Event, RunStatus, WorkflowRun
from queuety.runtime import gates
from queuety.runtime.landing import begin
from queuety.store import rows, sql
from queuety.store.definitions import definition_id, effective_policy

logger = logging.getLogger("queuety")


class _KeyTaken(Exception):
    """Another dispatch committed this idempotency key first."""


class Dispatched(NamedTuple):
    """What :func:`dispatch_run` did: the run, and whether the key was already used."""

    run_id: int
    reused: bool
    """True when ``idempotency_key`` had been used: ``run_id`` is the original run's."""


def dispatch(spec: WorkflowSpec, payload: dict[str, Any] | None = None, *,
             idempotency_key: str | None = None, on_conflict: str = "report",
             tags: Mapping[str, str] | None = None) -> int:
    """Start a run of ``spec`` with ``payload`` as its state and return the run id.

    :func:`dispatch_run` with only the id; see there.
    """
    return dispatch_run(spec, payload, idempotency_key=idempotency_key,
                        on_conflict=on_conflict, tags=tags).run_id


def dispatch_run(spec: WorkflowSpec, payload: dict[str, Any] | None = None, *,
                 idempotency_key: str | None = None, on_conflict: str = "report",
                 delay: float | None = None,
                 fingerprint: dict[str, Any] | None = None,
                 key: str | None = None,
                 tags: Mapping[str, str] | None = None) -> Dispatched:
    """Start a run of ``spec`` with ``payload`` as its state; return its id and whether an
    earlier dispatch with the same ``idempotency_key`` had started it.

    Writes the run, its first step, its dispatch key and a ``workflow_started`` event in one
    transaction and publishes the first step's message when it commits. With an
    ``idempotency_key`` already used, returns the original run's id and writes no run: the
    key's unique index decides races, so concurrent dispatches of one key start one run.
    With ``delay``, a first task step becomes due that many seconds from now (held in the
    database: the sweeper publishes it when due if it is beyond ``QUEUETY["MAX_ETA"]``).
    ``fingerprint`` is what a reused key's payload is compared by (default: the state), for a
    caller whose state carries what differs between equal dispatches (an enqueue instant).
    ``key`` is the run's flow-control key (``queuety.keyed``, which serialises the starts of
    a key; this only stores it). ``tags`` are the run's tags, merged over the builder's
    (``spec.tags``, from ``.with_tags()``); ``queuety.core.tags`` says what is valid.

    Raises:
        InvalidPayload: the payload is not a JSON object or uses reserved keys (a state
            machine's ``queuety_machine`` and ``queuety_event`` too), or a tag breaks the rules
            (the error names its key); nothing is written.
        BudgetExceeded: the payload alone exceeds ``max_state_bytes``; nothing is written.
        IdempotencyConflict: the key was used with another payload or definition and
            ``on_conflict="error"``.
        RunPurged: the key's run was purged by retention (its key is a tombstone).
    """
    state = first_state(spec, payload)
    run_tags = tag_rules.of_spec(spec, tags)
    limit = spec.budget.max_state_bytes
    if limit is not None and (size := budgets.state_bytes(state)) > limit:
        raise exceptions.BudgetExceeded(
            "max_state_bytes", limit, size, None, spec.name,
            message=f"The initial payload of workflow {spec.name!r} is {size} bytes, over its "
                    f"max_state_bytes budget of {limit}; nothing was dispatched.",
        )
    definition_pk = definition_id(spec)
    payload_hash = hashlib.sha256(canonical_json(
        state if fingerprint is None else fingerprint).encode()).hexdigest()
    if idempotency_key is not None:
        used = DispatchKey.objects.filter(key=idempotency_key).first()
        if used is not None:
            return Dispatched(_reused_key(used, spec, payload_hash, on_conflict), True)
    with tracing.run_span(spec.name, spec.version) as (span, context):
        dispatched = _write(spec, definition_pk, state, payload_hash, idempotency_key,
                            on_conflict, context, delay, key, run_tags)
        span.set(run_id=dispatched.run_id)
    return dispatched


def first_state(spec: WorkflowSpec, payload: dict[str, Any] | None) -> dict[str, Any]:
    """A run's first state from a start's ``payload``: checked, and for a state machine with
    the initial state's bookkeeping (every start of a machine passes here, so none can forge
    its state or history).

    Raises:
        InvalidPayload: the payload is not a JSON object, or uses reserved keys (``_`` keys,
            and a machine's ``queuety_machine`` and ``queuety_event``).
    """
    state = check_payload(spec.name, payload)
    if spec.machine is None:
        return state
    return initial_state(spec.name, spec.machine["initial"], state)


def _write(spec: WorkflowSpec, definition_pk: int, state: dict[str, Any], payload_hash: str,
           idempotency_key: str | None, on_conflict: str, trace_context: str,
           delay: float | None, key: str | None = None,
           tags: dict[str, str] | None = None) -> Dispatched:
    now = timezone.now()
    # The one-statement fast path commits by itself: a webhook endpoint subscribed to
    # run.started needs its delivery row in the run's transaction, so it takes the other path.
    if idempotency_key is None and key is None and spec.steps[0].kind == "task" and \
            connection.vendor == "postgresql" and not signals.sinks_want("run_started"):
        run_pk = _dispatch_postgres(spec, definition_pk, state, now, trace_context, delay,
                                    tags or {})
        logger.info("Run id=%s workflow=%s version=%s dispatched", run_pk, spec.name,
                    spec.version)
        return Dispatched(run_pk, False)
    try:
        with transaction.atomic():
            run = WorkflowRun.objects.create(
                definition_id=definition_pk, name=spec.name, state=state,
                total_steps=len(spec.steps), status=RunStatus.RUNNING,
                idempotency_key=idempotency_key, trace_context=trace_context,
                # A keyed run is marked awaited so that the one-statement completion, too,
                # calls notify_finished(), which releases the run queued behind it.
                key=key, awaited=key is not None, tags=tags or {},
                deadline_at=None if spec.deadline_seconds is None
                else now + timedelta(seconds=spec.deadline_seconds),
            )
            if idempotency_key is not None:
                with connection.cursor() as cursor:
                    # Blocks until a concurrent holder of the key commits or rolls back.
                    cursor.execute(sql.INSERT_KEY, [idempotency_key, run.pk, payload_hash,
                                                    spec.definition_hash, now])
                    if cursor.fetchone() is None:
                        raise _KeyTaken
            begin(spec, run, state, now, {"idempotency_key": idempotency_key}, delay)
    except _KeyTaken:
        return Dispatched(_reused_key(DispatchKey.objects.get(key=idempotency_key), spec,
                                      payload_hash, on_conflict), True)
    logger.info("Run id=%s workflow=%s version=%s dispatched", run.pk, spec.name, spec.version)
    return Dispatched(run.pk, False)


def _dispatch_postgres(spec: WorkflowSpec, definition_pk: int, state: dict[str, Any],
                       now: datetime, trace_context: str, delay: float | None,
                       tags: dict[str, str]) -> int:
    first = spec.steps[0]
    due = now + timedelta(seconds=delay) if delay else now
    on_broker = not delay or delay <= settings.MAX_ETA
    params: dict[str, Any] = {
        "available_at": due, "published_at": due if on_broker else None,
        "definition_id": definition_pk, "name": spec.name, "state": json.dumps(state),
        "total_steps": len(spec.steps), "now": now, "tags": json.dumps(tags),
        "deadline_at": None if spec.deadline_seconds is None
        else now + timedelta(seconds=spec.deadline_seconds),
        "step_name": first.name, "max_attempts": effective_policy(spec, 0).max_attempts,
        "timeout": first.timeout, "trace_context": trace_context,
        "event": json.dumps({"definition_hash": spec.definition_hash, "version": spec.version,
                             "state": state, "idempotency_key": None}),
    }
    run_pk, step_run_pk = rows.execute_hot(sql.DISPATCH_POSTGRES, params)
    if not delay:
        gates.publish_landed(spec, step_run_pk, 0, int(run_pk), state)
    elif on_broker:  # as landing.begin: the gate is met at the claim, when the row is due
        publish.publish_on_commit([publish.message_for(spec, step_run_pk, 0, delay)])
    signals.emit("run_started", run_id=int(run_pk), workflow=spec.name, version=spec.version)
    return int(run_pk)


def _reused_key(used: DispatchKey, spec: WorkflowSpec, payload_hash: str,
                on_conflict: str) -> int:
    if used.purged_at is not None:  # a tombstone: its run is gone (queuety.retention)
        raise exceptions.RunPurged(used.key, used.purged_workflow, used.run_id,
                                   used.purged_at.isoformat())
    if not WorkflowRun.objects.filter(pk=used.run_id).exists():
        # No tombstone but no run either (purged before tombstones existed, or deleted by
        # hand): as purged, never a dangling id. A unique job's key never comes here: its
        # enqueue frees a key whose job is gone (queuety.jobs.unique).
        raise exceptions.RunPurged(used.key, "", used.run_id, "")
    differences = [what for what, same in (
        ("payload", used.payload_hash == payload_hash),
        ("definition", used.definition_hash == spec.definition_hash)) if not same]
    if not differences:
        return used.run_id
    what = " and ".join(differences)
    if on_conflict == "error":
        raise exceptions.IdempotencyConflict(used.key, used.run_id, what)
    logger.warning("Idempotency key %r was reused with a different %s; returning run id=%s.",
                   used.key, what, used.run_id)
    Event.objects.create(run_id=used.run_id, kind="idempotency_conflict", data={
        "key": used.key, "differences": differences,
        "payload_hash": payload_hash, "definition_hash": spec.definition_hash,
    })
    return used.run_id
