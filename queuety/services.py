"""The one service layer: dispatch, the step boundary, the sweeper and status queries.

Celery tasks, management commands, the admin and the API all call these functions.

The step boundary (DESIGN.md §3):

1. ``execute_step`` claims its ``StepRun`` with one conditional UPDATE (pending -> processing,
   attempt + 1). A message for a row it cannot claim is dropped, so duplicates are harmless.
2. The handler runs outside any transaction, with a heartbeat and, when the step has a
   ``timeout``, a deadline that interrupts it.
3. The outcome is applied in ONE transaction whose first statements lock the step row and the
   run row (a compare-and-set on the run's ``revision``, which falls back to
   ``SELECT ... FOR UPDATE`` when the run changed since the claim). The next step's row is
   inserted in that transaction and its message published on commit, or, for an untimed
   task step, inserted already claimed by this process, which runs it next (inline
   continuation, bounded by ``INLINE_STEPS`` and ``INLINE_SECONDS``).

Handlers therefore run at least once per attempt; transitions happen exactly once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.backends.utils import CursorDebugWrapper
from django.db.models import Count, F, Q
from django.utils import timezone

from queuety import exceptions
from queuety.conf import settings
from queuety.core import budget as budgets
from queuety.core import dependencies, engine, fanout, waits
from queuety.core.definition import StepSpec, WorkflowSpec, canonical_json
from queuety.core.handlers import StepContext, call_handler, call_item_handler
from queuety.core.retry import RetryPolicy
from queuety.core.status import WorkflowStatus
from queuety.models import (
    DispatchKey,
    Event,
    RunStatus,
    Signal,
    StepRun,
    StepStatus,
    WorkflowDefinition,
    WorkflowDependency,
    WorkflowRun,
)
from queuety.publish import Message, publish_on_commit

logger = logging.getLogger("queuety")

#: Step rows not finished: running, due, or held back by a fan-out's max_concurrency.
LIVE_OR_HELD = (StepStatus.PENDING, StepStatus.PROCESSING, StepStatus.HELD)

# Definitions are immutable rows, so every process may cache them forever.
_definition_ids: dict[tuple[str, str], int] = {}
_specs: dict[int, WorkflowSpec] = {}


# -- definitions ------------------------------------------------------------------------------

def definition_id(spec: WorkflowSpec) -> int:
    """Return the id of the ``WorkflowDefinition`` row for ``spec``, creating it if needed."""
    key = (spec.name, spec.definition_hash)
    found = _definition_ids.get(key)
    if found is None:
        row, _ = WorkflowDefinition.objects.get_or_create(
            name=spec.name, definition_hash=key[1], defaults={"definition": spec.to_dict()}
        )
        found = _definition_ids[key] = row.pk
        _specs[row.pk] = spec
    return found


def load_spec(definition_pk: int) -> WorkflowSpec:
    """Return the definition stored under ``definition_pk`` (cached per process)."""
    spec = _specs.get(definition_pk)
    if spec is None:
        row = WorkflowDefinition.objects.only("definition").get(pk=definition_pk)
        spec = _specs[definition_pk] = WorkflowSpec.from_dict(row.definition)
    return spec


def effective_policy(spec: WorkflowSpec, step_index: int) -> RetryPolicy:
    """Return the retry policy of a step: its own, else its workflow's, else the global one."""
    return spec.steps[step_index].retry or spec.retry or settings.DEFAULT_RETRY


# -- dispatch ---------------------------------------------------------------------------------

class _KeyTaken(Exception):
    """Internal: another dispatch committed this idempotency key first."""


_INSERT_KEY = """
INSERT INTO queuety_workflow_dispatch_keys (key, run_id, payload_hash, definition_hash, created_at)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (key) DO NOTHING
RETURNING id
"""


def dispatch(spec: WorkflowSpec, payload: dict[str, Any] | None = None, *,
             idempotency_key: str | None = None, on_conflict: str = "report") -> int:
    """Start a run of ``spec`` with ``payload`` as its state and return the run id.

    Writes the run, its first step, its dispatch key and a ``workflow_started`` event in one
    transaction and publishes the first step's message when it commits. With an
    ``idempotency_key`` already used, returns the original run's id and writes no run: the
    key's unique index decides races, so concurrent dispatches of one key start one run.

    Raises:
        WorkflowDefinitionError: the payload is not a JSON object or uses reserved keys.
        BudgetExceeded: the payload alone exceeds ``max_state_bytes``; nothing is written.
        IdempotencyConflict: the key was used with another payload or definition and
            ``on_conflict="error"``.
    """
    state = _check_payload(spec.name, payload)
    limit = spec.budget.max_state_bytes
    if limit is not None and (size := budgets.state_bytes(state)) > limit:
        raise exceptions.BudgetExceeded(
            "max_state_bytes", limit, size, None, spec.name,
            message=f"The initial payload of workflow {spec.name!r} is {size} bytes, over its "
                    f"max_state_bytes budget of {limit}; nothing was dispatched.",
        )
    definition_pk = definition_id(spec)
    payload_hash = hashlib.sha256(canonical_json(state).encode()).hexdigest()
    if idempotency_key is not None:
        used = DispatchKey.objects.filter(key=idempotency_key).first()
        if used is not None:
            return _reused_key(used, spec, payload_hash, on_conflict)
    now = timezone.now()
    if idempotency_key is None and spec.steps[0].kind == "task" and \
            connection.vendor == "postgresql":
        run_pk = _dispatch_postgres(spec, definition_pk, state, now)
        logger.info("Run id=%s workflow=%s version=%s dispatched", run_pk, spec.name,
                    spec.version)
        return run_pk
    try:
        with transaction.atomic():
            run = WorkflowRun.objects.create(
                definition_id=definition_pk, name=spec.name, state=state,
                total_steps=len(spec.steps), status=RunStatus.RUNNING,
                idempotency_key=idempotency_key,
                deadline_at=None if spec.deadline_seconds is None
                else now + timedelta(seconds=spec.deadline_seconds),
            )
            if idempotency_key is not None:
                with connection.cursor() as cursor:
                    # Blocks until a concurrent holder of the key commits or rolls back.
                    cursor.execute(_INSERT_KEY, [idempotency_key, run.pk, payload_hash,
                                                 spec.definition_hash, now])
                    if cursor.fetchone() is None:
                        raise _KeyTaken
            _begin(spec, run, state, now, {"idempotency_key": idempotency_key})
    except _KeyTaken:
        return _reused_key(DispatchKey.objects.get(key=idempotency_key), spec, payload_hash,
                           on_conflict)
    logger.info("Run id=%s workflow=%s version=%s dispatched", run.pk, spec.name, spec.version)
    return run.pk


# The common dispatch (no idempotency key, a task step first) in one statement that commits
# by itself: the run, its first step row and its workflow_started event, all or nothing.
_DISPATCH_POSTGRES = """
WITH run AS (
    INSERT INTO queuety_workflowrun (definition_id, name, status, state, current_step,
                                     total_steps, revision, transitions, cost_units,
                                     started_workflows, deadline_at, loops, created_at,
                                     updated_at)
    VALUES (%(definition_id)s, %(name)s, 'running', %(state)s::jsonb, 0, %(total_steps)s, 0,
            0, 0, 0, %(deadline_at)s::timestamptz, '{}'::jsonb, %(now)s, %(now)s)
    RETURNING id
), step AS (
    INSERT INTO queuety_steprun (run_id, kind, seq, branch, step_index, step_name, status,
                                 attempt, max_attempts, timeout, available_at, published_at,
                                 claimed_by, handler, created_at)
    SELECT run.id, 'step', 0, 0, 0, %(step_name)s, 'pending', 0, %(max_attempts)s,
           %(timeout)s::float8, %(now)s, %(now)s, '', '', %(now)s
      FROM run
    RETURNING id
), started AS (
    INSERT INTO queuety_event (run_id, kind, step_name, data, created_at)
    SELECT run.id, 'workflow_started', '', %(event)s::jsonb, %(now)s FROM run
)
SELECT (SELECT id FROM run), (SELECT id FROM step)
"""


def _dispatch_postgres(spec: WorkflowSpec, definition_pk: int, state: dict[str, Any],
                       now) -> int:
    first = spec.steps[0]
    params = {
        "definition_id": definition_pk, "name": spec.name, "state": json.dumps(state),
        "total_steps": len(spec.steps), "now": now,
        "deadline_at": None if spec.deadline_seconds is None
        else now + timedelta(seconds=spec.deadline_seconds),
        "step_name": first.name, "max_attempts": effective_policy(spec, 0).max_attempts,
        "timeout": first.timeout,
        "event": json.dumps({"definition_hash": spec.definition_hash, "version": spec.version,
                             "state": state, "idempotency_key": None}),
    }
    with _hot_cursor() as cursor:
        cursor.execute(_DISPATCH_POSTGRES, params)
        run_pk, step_run_pk = cursor.fetchone()
    publish_on_commit([_message(spec, step_run_pk, 0)])
    return run_pk


def _begin(spec: WorkflowSpec, run: WorkflowRun, state: dict[str, Any], now,
           extra: dict[str, Any], delay: float | None = None) -> None:
    """Start a just-created run on its first step (in the creating transaction).

    With ``delay``, a first task step becomes due that many seconds from ``now``.
    """
    started = Event(run=run, kind="workflow_started", data={
        "definition_hash": spec.definition_hash, "version": spec.version, "state": state,
        **extra})
    if spec.steps[0].kind == "task":
        if delay:
            due = now + timedelta(seconds=delay)
            on_broker = delay <= settings.MAX_ETA
            step_run = _new_step_run(run.pk, spec, 0, seq=0, now=due, published=on_broker)
            started.save()
            if on_broker:
                publish_on_commit([_message(spec, step_run.pk, 0, delay)])
            return
        step_run = _new_step_run(run.pk, spec, 0, seq=0, now=now)
        started.save()
        publish_on_commit([_message(spec, step_run.pk, 0)])
    else:
        _land(spec, run.pk, 0, state, budgets.Usage(), now, [started])


def _create_run(spec: WorkflowSpec, state: dict[str, Any], now, extra: dict[str, Any],
                delay: float | None = None, **links: Any) -> int:
    """Create and start a run of ``spec`` linked to the run that makes it (same transaction)."""
    run = WorkflowRun.objects.create(
        definition_id=definition_id(spec), name=spec.name, state=state,
        total_steps=len(spec.steps), status=RunStatus.RUNNING,
        deadline_at=None if spec.deadline_seconds is None
        else now + timedelta(seconds=spec.deadline_seconds), **links)
    _begin(spec, run, state, now, extra, delay)
    return run.pk


def _start_child(spec: WorkflowSpec, parent_id: int, index: int, state: dict[str, Any],
                 now, attempt: int = 1, delay: float | None = None) -> int:
    """Create and start the child run of step ``index`` (in the parent's transaction)."""
    return _create_run(WorkflowSpec.from_dict(spec.steps[index].child), state, now,
                       {"parent_run": parent_id, "parent_attempt": attempt}, delay,
                       parent_id=parent_id, parent_step=index, parent_attempt=attempt)


def _start_runs(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                usage: budgets.Usage, now) -> tuple[dict[str, Any], budgets.Usage, list[int]]:
    """Start the runs of the ``start_workflows`` step ``index`` (in this run's transaction).

    Returns the state with their ids merged, the usage with them counted, and the ids.

    Raises:
        BudgetExceeded: they would pass ``max_started_workflows``; none is created.
        InvalidStepOutput: the items are not a list.
    """
    step = spec.steps[index]
    payloads = dependencies.child_payloads(step.start, step.name, state)
    limit = spec.budget.max_started_workflows
    if limit is not None and usage.started_workflows + len(payloads) > limit:
        raise exceptions.BudgetExceeded(
            "max_started_workflows", limit, usage.started_workflows + len(payloads), run_id,
            spec.name,
            message=f"Start step {step.name!r} of run {run_id} would start {len(payloads)} "
                    f"runs after {usage.started_workflows}, over its max_started_workflows "
                    f"budget of {limit}; none was started.")
    child = WorkflowSpec.from_dict(step.child)
    ids = [_create_run(child, payload, now, {"started_by": run_id}, started_by_id=run_id,
                       started_by_step=index, group=step.start.group or "")
           for payload in payloads]
    return ({**state, step.start.result_key: ids},
            replace(usage, transitions=usage.transitions + 1,
                    started_workflows=usage.started_workflows + len(ids)), ids)


def _awaited_ids(spec: WorkflowSpec, index: int, state: dict[str, Any],
                 groups: dict[str, list[int]]) -> list[int]:
    """The run ids the ``wait_for_workflows`` step ``index`` waits for, in order."""
    step = spec.steps[index]
    wait = step.workflows
    if wait.ids is not None:
        return list(dict.fromkeys(wait.ids))
    if wait.group is not None:
        return list(groups.get(wait.group, []))
    return dependencies.ids_from_state(wait, step.name, state)


_AWAITED_POSTGRES = """
SELECT id, status, state FROM queuety_workflowrun WHERE id = ANY(%s) ORDER BY id FOR SHARE
"""


def _workflow_wait(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                   groups: dict[str, list[int]], lock: bool = True
                   ) -> tuple[list[int], dependencies.WaitResult]:
    """Evaluate the workflow wait at ``index`` against the awaited runs as they are now.

    With ``lock`` on PostgreSQL, the awaited rows are read FOR SHARE: a run finishing
    concurrently either committed before (and is seen finished) or waits for this
    transaction, and then finds the dependency rows it writes, so no finish slips between
    the check and the parking.
    """
    ids = _awaited_ids(spec, index, state, groups)
    if lock and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_AWAITED_POSTGRES, [ids])
            rows = [(pk, status, json.loads(data) if isinstance(data, str) else data)
                    for pk, status, data in cursor.fetchall()]
    else:
        rows = list(WorkflowRun.objects.filter(pk__in=ids).values_list("pk", "status", "state"))
    found = {pk: (status, engine.public(data or {})) for pk, status, data in rows}
    return ids, dependencies.evaluate(spec.steps[index].workflows, ids, found)


def notify_finished(run_id: int) -> None:
    """Once this transaction commits, wake the runs that wait for finished run ``run_id``:
    its parent (a ``run_workflow`` step) and the runs whose ``wait_for_workflows`` lists it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT parent_id FROM queuety_workflowrun WHERE id = %s AND parent_id IS NOT NULL "
            "UNION SELECT run_id FROM queuety_workflowdependency WHERE depends_on = %s",
            [run_id, run_id])
        waiters = [row[0] for row in cursor.fetchall()]
    if waiters:
        from queuety.tasks import resume_parent

        transaction.on_commit(lambda: [_safe_delay(resume_parent, w) for w in waiters])


def _safe_delay(task, *args) -> None:
    try:
        task.apply_async(args, **({"queue": settings.QUEUE} if settings.QUEUE else {}))
    except Exception:  # noqa: BLE001 - the sweeper wakes waiting parents anyway
        logger.exception("Could not publish %s%r; the sweeper will do it.", task.name, args)


def resume_waiting(run_id: int) -> str | None:
    """Move on a run parked waiting for other runs, if what it waits for has finished.

    Covers ``run_workflow`` steps (the child finished: merge it, fail, or restart it by the
    step's policy) and ``wait_for_workflows`` steps (settle, fail, or keep waiting).
    Idempotent; called when an awaited run finishes and by the sweeper. Returns the status.
    """
    now = timezone.now()
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status != RunStatus.WAITING_FOR_WORKFLOWS:
            return None
        spec = load_spec(run.definition_id)
        index = run.current_step
        usage = budgets.Usage(run.transitions, run.cost_units, run.started_workflows)
        if spec.steps[index].kind == "wait_workflows":
            return _move_on(spec, run, index, run.state, usage, now, [])
        return _child_finished(spec, run, index, usage, now)


def _move_on(spec: WorkflowSpec, run: WorkflowRun, target: int | None,
             state: dict[str, Any], usage: budgets.Usage, now, events: list[Event]) -> str:
    """Land a run woken at its wait on ``target``; a step there that cannot be done (a budget
    breach, items that are not a list, ...) fails the run at the wait, state kept as it was.

    Without this, the error would leave the run parked, and every sweep would hit it again.
    """
    try:
        with transaction.atomic():
            return _land(spec, run.pk, target, state, usage, now, list(events))
    except (exceptions.BudgetExceeded, exceptions.WorkflowDefinitionError) as error:
        index = run.current_step
        record = {**engine.describe_error(error, False), "step": spec.steps[index].name,
                  "step_index": index, "attempt": None, "max_attempts": None}
        if isinstance(error, exceptions.BudgetExceeded):
            record.update(budget=error.budget, limit=error.limit, used=error.used)
        return _fail_waiting(spec, run.pk, index, run.state,
                             budgets.Usage(run.transitions, run.cost_units,
                                           run.started_workflows), now, events, record)


def _child_finished(spec: WorkflowSpec, parent: WorkflowRun, index: int,
                    usage: budgets.Usage, now) -> str:
    step = spec.steps[index]
    child = (WorkflowRun.objects.filter(parent_id=parent.pk, parent_step=index)
             .order_by("-pk").first())
    if child is None or child.status not in FINISHED:
        return parent.status
    events = [Event(run_id=parent.pk, kind="child_finished", step_index=index,
                    step_name=step.name,
                    data={"child_run": child.pk, "status": child.status,
                          "attempt": child.parent_attempt})]
    if child.status != RunStatus.COMPLETED:
        reason = (child.error or {}).get("message") or f"it was {child.status}"
        failure = exceptions.ChildRunFailed(
            f"Child run {child.pk} ({child.name!r}) of step {step.name!r} of run {parent.pk} "
            f"{child.status} (attempt {child.parent_attempt}): {reason}")
        cause = child.error or {}
        if cause.get("budget") == "max_step_attempts":  # an ancestor's cap, maybe this run's
            failure = exceptions.BudgetExceeded(
                "max_step_attempts", cause.get("limit"), cause.get("used"), parent.pk,
                spec.name, message=f"Child run {child.pk} of step {step.name!r} of run "
                                   f"{parent.pk} failed: {cause.get('message')}")
        delay = None if isinstance(failure, exceptions.BudgetExceeded) else \
            _child_restart_delay(spec, step, child, failure)
        if delay is not None:
            try:
                _check_attempts(parent.pk, step.name, failure)
            except exceptions.BudgetExceeded as breach:
                failure = breach
            else:
                restarted = _start_child(spec, parent.pk, index, parent.state, now,
                                         attempt=child.parent_attempt + 1, delay=delay)
                events.append(Event(run_id=parent.pk, kind="child_retried", step_index=index,
                                    step_name=step.name, data={
                                        "error": engine.describe_error(failure, False),
                                        "child_run": restarted, "retry_in": round(delay, 6),
                                        "attempt": child.parent_attempt + 1}))
                Event.objects.bulk_create(events)
                return parent.status
        error = {**engine.describe_error(failure, False), "step": step.name,
                 "step_index": index, "attempt": child.parent_attempt,
                 "max_attempts": None if step.retry is None else step.retry.max_attempts,
                 "child_run": child.pk}
        if isinstance(failure, exceptions.BudgetExceeded):
            error.update(budget=failure.budget, limit=failure.limit, used=failure.used)
        return _fail_waiting(spec, parent.pk, index, parent.state, usage, now, events, error)
    output = engine.public(child.state)
    state = {**parent.state, **output}
    settled = replace(usage, transitions=usage.transitions + 1)
    events[0].data["output"] = output
    try:
        _check(spec, parent.pk, state, settled)
    except exceptions.BudgetExceeded as breach:
        return _fail_parked(spec, parent.pk, index, parent.state, settled, now, events, breach)
    return _move_on(spec, parent, index + 1 if index + 1 < len(spec.steps) else None,
                    state, settled, now, events)


#: Child errors that a restart cannot fix.
_FINAL_CHILD_ERRORS = {f"queuety.exceptions.{cls.__name__}" for cls in (
    exceptions.BudgetExceeded, exceptions.PermanentError, exceptions.WorkflowDefinitionError,
    exceptions.InvalidStepOutput, exceptions.UnknownStep, exceptions.UnmatchedRoute)}


def _child_restart_delay(spec: WorkflowSpec, step: StepSpec, child: WorkflowRun,
                         failure: exceptions.ChildRunFailed) -> float | None:
    """Seconds before restarting a failed child by the step's own policy, or None."""
    if step.retry is None or child.status == RunStatus.CANCELLED or \
            (child.error or {}).get("type") in _FINAL_CHILD_ERRORS:
        return None
    return engine.retry_delay(step.retry, failure, child.parent_attempt)


_TREE_ATTEMPTS = """
WITH RECURSIVE tree(id) AS (
    SELECT CAST(%s AS BIGINT)
    UNION ALL
    SELECT r.id FROM queuety_workflowrun r JOIN tree t ON r.parent_id = t.id
)
SELECT COALESCE(SUM(s.attempt + CASE WHEN s.status = 'pending' AND s.attempt > 0
                                      THEN 1 ELSE 0 END), 0)
  FROM queuety_steprun s JOIN tree t ON s.run_id = t.id
 WHERE s.kind = 'step'
"""
#: First key of the advisory locks that serialise max_step_attempts checks (second: run id).
_ATTEMPTS_LOCK = 7_401


def _check_attempts(run_id: int, step_name: str, last_error: BaseException | None = None
                    ) -> None:
    """Raise BudgetExceeded if one more step attempt in run ``run_id`` would pass the
    ``max_step_attempts`` of that run or of an ancestor (which counts its whole tree)."""
    current: int | None = run_id
    while current is not None:
        parent_id, definition_pk = WorkflowRun.objects.values_list(
            "parent_id", "definition_id").get(pk=current)
        holder = load_spec(definition_pk)
        limit = holder.budget.max_step_attempts
        if limit is not None:
            with connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    # Serialises the checks of one tree (parallel branches failing at once)
                    # until the caller's transaction ends. Holders never wait for a row lock
                    # of another run after taking it, so it cannot close a deadlock cycle.
                    # SQLite serialises writers anyway.
                    cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                                   [_ATTEMPTS_LOCK, current])
                cursor.execute(_TREE_ATTEMPTS, [current])
                used = cursor.fetchone()[0]
            if used + 1 > limit:
                raise exceptions.BudgetExceeded(
                    "max_step_attempts", limit, used + 1, current, holder.name,
                    message=f"Step {step_name!r} of run {run_id} would start attempt "
                            f"{used + 1} of run {current}'s tree, over its max_step_attempts "
                            f"budget of {limit}." + (
                                "" if last_error is None else
                                f" Its last attempt failed with {type(last_error).__name__}: "
                                f"{last_error}"))
        current = parent_id


def _reused_key(used: DispatchKey, spec: WorkflowSpec, payload_hash: str,
                on_conflict: str) -> int:
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
    if WorkflowRun.objects.filter(pk=used.run_id).exists():  # the run may have been purged
        Event.objects.create(run_id=used.run_id, kind="idempotency_conflict", data={
            "key": used.key, "differences": differences,
            "payload_hash": payload_hash, "definition_hash": spec.definition_hash,
        })
    return used.run_id


def _check_payload(name: str, payload: Any) -> dict[str, Any]:
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise exceptions.WorkflowDefinitionError(
            f"The payload of workflow {name!r} must be a dict (got {type(payload).__name__})."
        )
    reserved = sorted(key for key in payload if not isinstance(key, str) or key.startswith("_"))
    if reserved:
        raise exceptions.WorkflowDefinitionError(
            f"The payload of workflow {name!r} uses reserved or non-string keys {reserved!r}; "
            "keys starting with '_' belong to Queuety. Rename them."
        )
    try:
        return json.loads(json.dumps(payload, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise exceptions.WorkflowDefinitionError(
            f"The payload of workflow {name!r} is not JSON-serialisable: {error}."
        ) from None
    except RecursionError:
        raise exceptions.WorkflowDefinitionError(
            f"The payload of workflow {name!r} is nested too deeply to be stored as JSON."
        ) from None


def _message(spec: WorkflowSpec, step_run_id: int, index: int,
             countdown: float | None = None) -> Message:
    return Message(step_run_id, countdown, spec.steps[index].timeout, spec.queue)


def _new_step_run(run_pk: int, spec: WorkflowSpec, index: int, *, seq: int, now,
                  published: bool = True) -> StepRun:
    step = spec.steps[index]
    return StepRun.objects.create(
        run_id=run_pk, seq=seq, step_index=index, step_name=step.name,
        max_attempts=effective_policy(spec, index).max_attempts, timeout=step.timeout,
        available_at=now, published_at=now if published else None,
    )


# -- the step boundary ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Claim:
    """What a worker holds while it runs one attempt of one step."""

    step_run_id: int
    run_id: int
    step_index: int
    seq: int
    attempt: int
    definition_id: int
    state: dict[str, Any]
    revision: int
    claimed_at: Any = None
    usage: budgets.Usage = budgets.Usage()
    """Budget counters of the run when the step was claimed."""
    kind: str = "step"
    """``step``, or ``compensation`` / ``hook`` for cleanup rows."""
    claimed_by: str = ""
    """``host:pid`` of the process holding the attempt: with ``attempt``, the row's guard."""


_CLAIM_SET = ("status = 'processing', attempt = attempt + 1, claimed_at = %s, heartbeat_at = %s, "
              "claimed_by = %s")

_CLAIM_POSTGRES = f"""
UPDATE queuety_steprun AS s SET {_CLAIM_SET}
  FROM queuety_workflowrun AS r
 WHERE s.id = %s AND s.status = 'pending' AND s.available_at <= %s
   AND r.id = s.run_id AND (r.status = 'running' OR s.kind <> 'step')
RETURNING s.run_id, s.step_index, s.seq, s.attempt, r.definition_id, r.state, r.revision,
          r.transitions, r.cost_units, r.started_workflows, s.kind
"""

# SQLite cannot return columns of a joined table, so it reads the run in a second query.
_CLAIM_SQLITE = f"""
UPDATE queuety_steprun SET {_CLAIM_SET}
 WHERE id = %s AND status = 'pending' AND available_at <= %s
   AND (kind <> 'step'
        OR run_id IN (SELECT id FROM queuety_workflowrun WHERE status = 'running'))
RETURNING run_id, step_index, seq, attempt, kind
"""


def _hot_cursor():
    """A cursor for the statements every step runs (dispatch, claim, transition).

    When the site allows prepared statements on its connections (Django's
    ``OPTIONS["prepare_threshold"]``, off by default because transaction-mode poolers such as
    PgBouncer before 1.21 cannot keep them), it binds parameters on the server, so psycopg
    prepares these statements and PostgreSQL stops planning them on every call: the
    transition's plan costs more than its execution. Otherwise, Django's own cursor.
    """
    if connection.vendor != "postgresql" or \
            connection.settings_dict.get("OPTIONS", {}).get("prepare_threshold") is None:
        return connection.cursor()
    import psycopg

    connection.ensure_connection()
    connection.validate_thread_sharing()
    # Wrapped by Django, so statements pass execute_wrapper hooks and are logged when asked.
    raw = psycopg.Cursor(connection.connection)
    if connection.queries_logged:
        return _HotDebugCursor(raw, connection)
    return connection.make_cursor(raw)


class _HotDebugCursor(CursorDebugWrapper):
    """Logs a hot statement as written (placeholders and all): after a prepared execution,
    psycopg has no interpolated query text for Django to report."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params):
            return super(CursorDebugWrapper, self).execute(sql, params)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def worker_id(pid: int | None = None) -> str:
    """Return ``host:pid`` naming the process that claims a step (``pid``: another process)."""
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"


def claim(step_run_id: int, now=None) -> Claim | None:
    """Claim a due pending step for this worker; return ``None`` when it is not claimable."""
    now = now or timezone.now()
    stamp = connection.ops.adapt_datetimefield_value(now)
    me = worker_id()
    with _hot_cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_CLAIM_POSTGRES, [stamp, stamp, me, step_run_id, stamp])
            row = cursor.fetchone()
            if row is None:
                return None
            (run_id, step_index, seq, attempt, definition_pk, state, revision,
             *counters, kind) = row
        else:
            cursor.execute(_CLAIM_SQLITE, [stamp, stamp, me, step_run_id, stamp])
            row = cursor.fetchone()
            if row is None:
                return None
            run_id, step_index, seq, attempt, kind = row
            cursor.execute(
                "SELECT definition_id, state, revision, transitions, cost_units, "
                "started_workflows FROM queuety_workflowrun WHERE id = %s", [run_id],
            )
            definition_pk, state, revision, *counters = cursor.fetchone()
    return Claim(step_run_id, run_id, step_index, seq, attempt, definition_pk, _json(state),
                 revision, now, budgets.Usage(*counters), kind, me)


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What one ``execute_step`` call did, for the worker that ran it."""

    claimed: bool
    timed_out: bool = False
    leftover_threads: tuple[str, ...] = ()
    """Threads the handler started that were still alive after it timed out."""


def execute_step(step_run_id: int, *, inline: bool = True) -> AttemptReport:
    """Run one attempt of a step and apply its outcome (the body of the Celery task).

    Idempotent: a message for a step that is not pending and due is dropped (or, for a
    delayed step delivered early, published again for its due time).

    With ``inline``, the transition of a plain task step hands this process the run's next
    step when that is a task step without a timeout: the next row is inserted already claimed
    by this process, and runs here with no message and no separate claim. At most
    ``QUEUETY["INLINE_STEPS"]`` steps run so in a row, and none starts after
    ``QUEUETY["INLINE_SECONDS"]``; the next one is then published as usual. The caller passes
    ``inline=False`` when a time limit covers the whole call (Celery's limits are per task).
    """
    held = claim(step_run_id)
    if held is None:
        _requeue_if_early(step_run_id)
        return AttemptReport(claimed=False)
    try:
        spec = load_spec(held.definition_id)
    except Exception as error:  # noqa: BLE001 - e.g. a retry_on class a deploy removed
        fail_unloadable(held.step_run_id, held.run_id, error)
        return AttemptReport(claimed=True)
    if held.kind != "step":
        _execute_cleanup(held, spec)
        return AttemptReport(claimed=True)
    step = spec.steps[held.step_index]
    if step.kind in ("parallel", "for_each"):
        context = StepContext(held.run_id, spec.name, step.name, held.attempt,
                              budgets.BudgetView(spec.budget, _usage_now(spec, held)))
        return _execute_branch(held, spec, step, context)
    steps_left = settings.INLINE_STEPS if inline else 1
    until = time.monotonic() + settings.INLINE_SECONDS
    while True:
        steps_left -= 1
        report, held = _execute_task_step(held, spec, inline_until=until if steps_left else None)
        if held is None:
            return report


def _execute_task_step(held: Claim, spec: WorkflowSpec, *, inline_until: float | None
                       ) -> tuple[AttemptReport, Claim | None]:
    """Run a claimed task (or delay) step; return what happened and the claim of the next
    step if the transition gave it to this process (only before ``inline_until``)."""
    step = spec.steps[held.step_index]
    threads_before = set(threading.enumerate())
    started = time.monotonic()
    context = StepContext(held.run_id, spec.name, step.name, held.attempt,
                          budgets.BudgetView(spec.budget, _usage_now(spec, held)))
    timed_out = False
    following = None
    # The heartbeat covers recording the outcome too: under contention for the run row, the
    # transition can wait for a lock, and the sweeper must not take this attempt for lost.
    with _heartbeat(held.step_run_id, held.attempt):
        try:
            with _deadline(step, held):
                output = None if step.kind == "delay" else call_handler(
                    step.handler, dict(held.state), context)
            outcome = engine.advance(spec, held.run_id, held.state, held.step_index, output)
            _check_budget(spec, held, outcome)
        except Exception as error:  # noqa: BLE001 - every step failure is recorded
            record_failure(held, spec, error, _ms_since(started))
            timed_out = isinstance(error, exceptions.StepTimeout)
        else:
            try:
                # A timed step's message carries a hard limit: no try may outlive it.
                give_up_at = None if step.timeout is None else (
                    started + step.timeout + settings.HARD_TIMEOUT_GRACE)
                following = _record_success_retrying(held, spec, outcome, _ms_since(started),
                                                     inline_until=inline_until,
                                                     give_up_at=give_up_at)
            except (exceptions.BudgetExceeded, exceptions.WorkflowDefinitionError) as error:
                # Found while landing on the next step (the run had moved on, or a for_each's
                # items are not a list or too many): this step's outcome cannot stand.
                record_failure(held, spec, error, _ms_since(started))
    return _report(threads_before, timed_out), following


def _report(threads_before: set, timed_out: bool) -> AttemptReport:
    if not timed_out:
        return AttemptReport(claimed=True)
    leftovers = tuple(t.name for t in threading.enumerate()
                      if t not in threads_before and t.is_alive()
                      and t.name != _Heartbeats.name)
    return AttemptReport(claimed=True, timed_out=True, leftover_threads=leftovers)


def _execute_branch(held: Claim, spec: WorkflowSpec, step: StepSpec,
                    context: StepContext) -> AttemptReport:
    """Run one parallel branch or for_each item, then record it (and maybe settle the join)."""
    row = StepRun.objects.only("handler", "input").get(pk=held.step_run_id)
    threads_before = set(threading.enumerate())
    started = time.monotonic()
    timed_out = False
    with _heartbeat(held.step_run_id, held.attempt):
        try:
            with _deadline(step, held):
                if step.kind == "parallel":
                    output = engine.check_output(step.name, held.run_id, call_handler(
                        row.handler, dict(held.state), context))
                else:
                    output = call_item_handler(row.handler, dict(held.state),
                                               row.input["item"], row.input["index"], context)
                    engine.check_output(step.name, held.run_id, {"item": output})
            _branch_done(held, spec, output, _ms_since(started))
        except Exception as error:  # noqa: BLE001 - recorded like any step failure
            record_failure(held, spec, error, _ms_since(started))
            timed_out = isinstance(error, exceptions.StepTimeout)
    return _report(threads_before, timed_out)


def _execute_cleanup(held: Claim, spec: WorkflowSpec) -> None:
    """Run a compensation or hook row: its handler gets the recorded state; output ignored."""

    row = StepRun.objects.only("handler", "input").get(pk=held.step_run_id)
    started = time.monotonic()
    with _heartbeat(held.step_run_id, held.attempt):
        try:
            call_handler(row.handler, dict(row.input or {}))
        except Exception as error:  # noqa: BLE001 - recorded, then retried or skipped
            record_failure(held, spec, error, _ms_since(started))
            return
        _cleanup_done(held, spec, started)


def _cleanup_done(held: Claim, spec: WorkflowSpec, started: float) -> None:
    from queuety import operations

    now = timezone.now()
    with transaction.atomic():
        if not StepRun.objects.filter(pk=held.step_run_id, status=StepStatus.PROCESSING,
                                      attempt=held.attempt, claimed_by=held.claimed_by).update(
                status=StepStatus.COMPLETED, finished_at=now):
            return
        Event.objects.create(run_id=held.run_id, step_run_id=held.step_run_id,
                             kind=f"{held.kind}_completed", step_index=held.step_index,
                             step_name=_row_name(held), attempt=held.attempt,
                             duration_ms=_ms_since(started))
        operations.cleanup_done(held.run_id, spec, now)


def _row_name(held: Claim) -> str:
    return StepRun.objects.values_list("step_name", flat=True).get(pk=held.step_run_id)


def _usage_now(spec: WorkflowSpec, held: Claim) -> budgets.Usage:
    size = budgets.state_bytes(held.state) if spec.budget.max_state_bytes else 0
    return budgets.Usage(held.usage.transitions, held.usage.cost_units,
                         held.usage.started_workflows, size)


def _check_budget(spec: WorkflowSpec, held: Claim, outcome: engine.Advance) -> None:
    """Raise BudgetExceeded if completing this step would breach the run's budget."""
    base = held.usage
    _check(spec, held.run_id, outcome.state, budgets.Usage(
        base.transitions + 1, base.cost_units + spec.steps[held.step_index].cost_units,
        base.started_workflows))


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)


def _requeue_if_early(step_run_id: int) -> None:
    row = (StepRun.objects.filter(pk=step_run_id, status=StepStatus.PENDING)
           .values("available_at", "step_index", "kind", "run__definition_id").first())
    if row is None:
        return
    wait = (row["available_at"] - timezone.now()).total_seconds()
    if 0 < wait <= settings.MAX_ETA:
        from queuety.publish import publish

        spec = load_spec(row["run__definition_id"])
        publish([_message(spec, step_run_id, row["step_index"], wait) if row["kind"] == "step"
                 else Message(step_run_id, wait, None, spec.queue)])


#: Pauses before trying a transition again after a transient database error (7.3 s in all,
#: well inside STALE_AFTER's default of 60 s). The handler's output is in hand; running the
#: handler again (an LLM call, a payment) would cost far more than waiting.
TRANSITION_RETRY_DELAYS = (0.05, 0.25, 1.0, 2.0, 4.0)


#: SQLSTATEs after which the same transaction, run again, may well succeed as it stands.
SERIALIZATION_FAILURES = ("40001", "40P01")


def sqlstate_of(error: BaseException) -> str | None:
    """The PostgreSQL SQLSTATE of a database error Django raised (None when it carries none,
    as for a lost connection or another backend)."""
    return getattr(error.__cause__, "sqlstate", None)


def _transient(error: BaseException) -> bool:
    """A database error after which the same transition may well succeed: on PostgreSQL a
    serialization failure, a deadlock, or a lost or refused connection (no SQLSTATE, classes
    08 and 57P); on SQLite a busy or locked database."""
    if not isinstance(error, (OperationalError, InterfaceError)):
        return False
    if connection.vendor == "sqlite":
        return getattr(error.__cause__, "sqlite_errorname", "").startswith(
            ("SQLITE_BUSY", "SQLITE_LOCKED"))
    sqlstate = sqlstate_of(error)
    return sqlstate is None or sqlstate in SERIALIZATION_FAILURES or sqlstate.startswith(
        ("08", "57P"))


def _record_success_retrying(held: Claim, spec: WorkflowSpec, outcome: engine.Advance,
                             duration_ms: float, *, inline_until: float | None,
                             give_up_at: float | None) -> Claim | None:
    """``_record_success``, tried again in place when the database refuses it for a transient
    reason, so a deadlock or a dropped connection does not cost a second run of the handler.

    Every try is the same compare-and-set: nothing is applied twice, and if the sweeper took
    the attempt for lost meanwhile, the try writes nothing and the outcome is discarded. The
    next step is taken inline only while ``inline_until`` has not passed, decided at each try.
    Past the last pause, or when the next pause would end after ``give_up_at`` (the hard
    limit of a timed step), the error propagates and the step is recovered as before (after
    ``STALE_AFTER``, by running it again).
    """
    step = spec.steps[held.step_index]
    for tries, pause in enumerate((*TRANSITION_RETRY_DELAYS, None)):
        claim_next = (inline_until is not None and step.timeout is None
                      and time.monotonic() < inline_until)
        try:
            return _record_success(held, spec, outcome, duration_ms, claim_next=claim_next,
                                   retried=tries > 0)
        except (OperationalError, InterfaceError) as error:
            if pause is None or not _transient(error) or connection.in_atomic_block or (
                    give_up_at is not None and time.monotonic() + pause >= give_up_at):
                raise
            sqlstate = sqlstate_of(error)
            logger.warning("The transition of step run id=%s (run id=%s, attempt %s) failed "
                           "with a transient database error (%s, SQLSTATE %s); trying it again "
                           "in %.2f s.", held.step_run_id, held.run_id, held.attempt,
                           type(error.__cause__ or error).__name__, sqlstate, pause)
            if connection.vendor != "sqlite" and sqlstate not in SERIALIZATION_FAILURES:
                # The connection is gone: the next query must open a new one (Django forgets
                # the old one even when closing it complains).
                with suppress(Exception):
                    connection.close()
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def _applied_by(held: Claim) -> bool:
    """Whether this very attempt already completed its step row: a try whose commit reached
    the server although its answer was lost with the connection."""
    return StepRun.objects.filter(pk=held.step_run_id, status=StepStatus.COMPLETED,
                                  attempt=held.attempt, claimed_by=held.claimed_by).exists()


def _after_lost_answer(held: Claim, spec: WorkflowSpec, next_index: int | None) -> None:
    """Do what follows the commit of a transition whose answer was lost: wake the runs
    waiting for a finished run; publish the next step's row, first handing back to the
    broker a row that try had claimed for this process to run inline (nobody runs it now)."""
    if next_index is None:
        notify_finished(held.run_id)
        return
    now = timezone.now()
    rows = StepRun.objects.filter(run_id=held.run_id, kind="step",
                                  seq=held.usage.transitions + 1)
    rows.filter(status=StepStatus.PROCESSING, attempt=1, claimed_by=held.claimed_by).update(
        status=StepStatus.PENDING, attempt=0, claimed_by="", claimed_at=None,
        heartbeat_at=None, published_at=now)
    # Every due row that transition created (a fan-out creates several); a second message for
    # a row already published is harmless, as the claim drops it. Later ones are the sweeper's.
    publish_on_commit([_message(spec, pk, index) for pk, index in rows.filter(
        status=StepStatus.PENDING, available_at__lte=now).values_list("pk", "step_index")])


def _record_success(held: Claim, spec: WorkflowSpec, outcome: engine.Advance,
                    duration_ms: float, *, claim_next: bool = False,
                    retried: bool = False) -> Claim | None:
    """Apply a successful attempt; return the next step's claim when this process got it.

    ``retried``: an earlier try failed, perhaps after its commit; finding the row completed
    by this attempt then means the transition is already applied.
    """
    now = timezone.now()
    step = spec.steps[held.step_index]
    completed = Event(
        run_id=held.run_id, step_run_id=held.step_run_id, kind="step_completed",
        step_index=held.step_index, step_name=step.name, attempt=held.attempt,
        duration_ms=duration_ms, data={"output": outcome.output, **(
            {"route": outcome.route} if outcome.route else {})},
    )
    lands_on_task = outcome.next_index is None or spec.steps[outcome.next_index].kind == "task"
    if connection.vendor == "postgresql" and lands_on_task:
        # One statement that commits by itself (no BEGIN/COMMIT round trips): it writes
        # everything or, when the run moved since the claim, nothing at all.
        owned, advanced, following = _complete_postgres(held, spec, outcome, completed, now,
                                                        claim_next)
        if advanced:
            return following
        if not owned:
            _not_owned(held, spec, outcome, completed, retried)
            return None
    with transaction.atomic():
        if not _mark_completed(held, outcome.output, now):
            _not_owned(held, spec, outcome, completed, retried)
            return None
        # Decide under the run's row lock, in the transaction that holds the completed step
        # row: the run changed since the claim, the next step is a wait, or this is SQLite.
        if not _transition_locked(held, spec, outcome.raw, completed, now):
            completed.kind = "step_discarded"
            completed.data["reason"] = "the run was no longer running this step"
            completed.save()
    return None


def _not_owned(held: Claim, spec: WorkflowSpec, outcome: engine.Advance, completed: Event,
               retried: bool) -> None:
    """The step row is no longer this attempt's to complete: because an earlier try of this
    transition committed (its answer lost), or because the row was taken back."""
    if retried and _applied_by(held):
        _after_lost_answer(held, spec, outcome.next_index)
    else:
        _discard(held, completed, "the attempt no longer owned its step row")


def _discard(held: Claim, completed: Event, reason: str) -> None:
    # The run was cancelled or rewound, or the sweeper took this attempt for lost and another
    # attempt owns the row now: the outcome must not count.
    logger.warning("Step run id=%s attempt=%s finished after its row was taken back; its "
                   "outcome is discarded.", held.step_run_id, held.attempt)
    completed.kind = "step_discarded"
    completed.data["reason"] = reason
    completed.save()


def _transition_locked(held: Claim, spec: WorkflowSpec, output: dict[str, Any],
                       completed: Event, now) -> bool:
    """Apply a completed step to its run under the run's row lock; False if the run moved on.

    Raises:
        BudgetExceeded: rolls back the caller's transaction, completed step row included.
    """
    run = _locked_run(held.run_id)
    if run.status not in (RunStatus.RUNNING, RunStatus.PAUSED) or \
            run.current_step != held.step_index:
        return False
    outcome = engine.advance(spec, held.run_id, run.state, held.step_index, output)
    usage = budgets.Usage(run.transitions + 1,
                          run.cost_units + spec.steps[held.step_index].cost_units,
                          run.started_workflows)
    _check(spec, run.pk, outcome.state, usage)
    _land(spec, run.pk, outcome.next_index, outcome.state, usage, now, [completed],
          paused=run.status == RunStatus.PAUSED)
    return True


def _repeat(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
            loops: dict[str, int]) -> tuple[bool, dict[str, int]]:
    """Evaluate a repeat step: go back again? Returns that and the updated loop counters.

    Raises:
        BudgetExceeded: the loop would pass its ``max_iterations``.
    """
    step = spec.steps[index]
    rule = step.repeat
    if rule["condition"]:
        from queuety.core.imports import import_path

        matched = bool(import_path(rule["condition"])(dict(state)))
    else:
        matched = waits.same_json(state.get(rule["state_key"]), rule["expected"])
    again = matched if rule["mode"] == "while" else not matched
    key = str(index)
    if not again:  # the loop is over: an enclosing loop that comes back starts it afresh
        return False, {k: v for k, v in loops.items() if k != key}
    iterations = loops.get(key, 0) + 1
    limit = rule["max_iterations"]
    if limit is not None and iterations > limit:
        raise exceptions.BudgetExceeded(
            "max_iterations", limit, iterations, run_id, spec.name,
            message=f"Repeat step {step.name!r} of run {run_id} exceeded its max_iterations "
                    f"of {limit}.")
    return True, {**loops, key: iterations}


def _items(spec: WorkflowSpec, run_id: int, step: StepSpec, state: dict[str, Any]) -> list:
    """The items a for_each step fans out to, checked against ``max_for_each_items``."""
    items = state.get(step.fanout.items_key)
    if not isinstance(items, list):
        raise exceptions.InvalidStepOutput(
            f"For-each step {step.name!r} of run {run_id} expected state key "
            f"{step.fanout.items_key!r} to hold a list (got {type(items).__name__}).")
    limit = spec.budget.max_for_each_items
    if limit is not None and len(items) > limit:
        raise exceptions.BudgetExceeded(
            "max_for_each_items", limit, len(items), run_id, spec.name,
            message=f"For-each step {step.name!r} of run {run_id} planned {len(items)} items, "
                    f"over its max_for_each_items budget of {limit}.")
    if not items and step.fanout.mode != fanout.ALL:
        raise exceptions.InvalidStepOutput(
            f"For-each step {step.name!r} of run {run_id} has no items, so mode "
            f"{step.fanout.mode!r} can never be satisfied.")
    return items


def _fan_out(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any], seq: int,
             now, items: list | None) -> None:
    """Create one row per branch or item of the step at ``index`` and publish them all."""
    step = spec.steps[index]
    common = {"run_id": run_id, "seq": seq, "step_index": index, "step_name": step.name,
              "max_attempts": effective_policy(spec, index).max_attempts,
              "timeout": step.timeout, "available_at": now, "published_at": now}
    if step.kind == "parallel":
        rows = [StepRun(branch=i, handler=path, **common)
                for i, path in enumerate(step.fanout.branches)]
    else:
        items = items if items is not None else _items(spec, run_id, step, state)
        rows = [StepRun(branch=i, handler=step.handler, input={"item": item, "index": i},
                        **common) for i, item in enumerate(items)]
    limit = step.fanout.max_concurrency
    if limit is not None:
        for row in rows[limit:]:  # they start as running ones finish: _release_held()
            row.status, row.published_at = StepStatus.HELD, None
    created = StepRun.objects.bulk_create(rows)
    publish_on_commit([_message(spec, row.pk, index) for row in created
                       if row.status == StepStatus.PENDING])


def _release_held(spec: WorkflowSpec, run_id: int, seq: int, index: int, now) -> int:
    """Start held branches or items of a fan-out pass, in order, into the slots its
    ``max_concurrency`` leaves free. Call with the run's row locked (it serialises releases).
    """
    limit = spec.steps[index].fanout.max_concurrency
    if limit is None:
        return 0
    rows = StepRun.objects.filter(run_id=run_id, kind="step", seq=seq, step_index=index)
    free = limit - rows.filter(status__in=(StepStatus.PENDING, StepStatus.PROCESSING)).count()
    if free <= 0:
        return 0
    released = list(rows.filter(status=StepStatus.HELD).order_by("branch")
                    .values_list("pk", flat=True)[:free])
    if released:
        StepRun.objects.filter(pk__in=released).update(
            status=StepStatus.PENDING, available_at=now, published_at=now)
        publish_on_commit([_message(spec, pk, index) for pk in released])
    return len(released)


def _fanout_output(spec: WorkflowSpec, step: StepSpec, state: dict[str, Any],
                   rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a settled fan-out merges: branch outputs in order, or the for_each aggregate
    (plus what the reducer adds)."""
    if step.kind == "parallel":
        return fanout.merge_branches([r["output"] for r in sorted(rows, key=lambda r: r["index"])])
    aggregate = fanout.aggregate(step.fanout, rows)
    output = {step.fanout.result_key: aggregate}
    if step.fanout.reducer:
        reduced = _reduce(step.fanout.reducer, {**state, **output}, aggregate)
        output.update(engine.check_output(step.name, 0, reduced))
    return output


def _reduce(path: str, state: dict[str, Any], aggregate: dict[str, Any]) -> Any:
    from queuety.core.imports import import_path

    reducer = import_path(path)
    return reducer().reduce(state, aggregate) if isinstance(reducer, type) \
        else reducer(state, aggregate)


def _fanout_rows(run_id: int, seq: int, index: int) -> list[dict[str, Any]]:
    rows = (StepRun.objects.filter(run_id=run_id, kind="step", seq=seq, step_index=index)
            .order_by("branch").values("branch", "status", "output", "error", "input",
                                       "finished_at"))
    return [{"index": r["branch"], "item": (r["input"] or {}).get("item"),
             "status": r["status"], "output": r["output"],
             "error": None if not r["error"] else {k: r["error"].get(k) for k in
                                                  ("type", "message")},
             "finished_at": r["finished_at"]} for r in rows]


def _branch_done(held: Claim, spec: WorkflowSpec, output: Any, duration_ms: float) -> None:
    """Record one branch or item; settle the join, under the run's row lock, when it can."""
    now = timezone.now()
    step = spec.steps[held.step_index]
    event = Event(run_id=held.run_id, step_run_id=held.step_run_id,
                  kind="branch_completed" if step.kind == "parallel" else "item_completed",
                  step_index=held.step_index, step_name=step.name, attempt=held.attempt,
                  duration_ms=duration_ms, data={"output": output})
    with transaction.atomic():
        if not _mark_completed(held, output, now):
            event.kind, event.data["reason"] = "step_discarded", "no longer owned its row"
            event.save()
            return
        run = _locked_run(held.run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.PAUSED) or \
                run.current_step != held.step_index:
            event.kind, event.data["reason"] = "step_discarded", "the join had settled"
            event.save()
            return
        # Counting is enough until the join settles; only then are the outputs read.
        total, succeeded, failed = _fanout_counts(held.run_id, held.seq, held.step_index)
        mode = fanout.ALL if step.kind == "parallel" else step.fanout.mode
        if fanout.progress(mode, step.fanout.quorum, total, succeeded, failed) != \
                fanout.SATISFIED:
            event.save()
            if run.status == RunStatus.RUNNING:
                _release_held(spec, held.run_id, held.seq, held.step_index, now)
            return
        rows = _fanout_rows(held.run_id, held.seq, held.step_index)
        _settle(spec, run, held.step_index, held.seq, rows, [event], now)


def _fanout_counts(run_id: int, seq: int, index: int) -> tuple[int, int, int]:
    """Rows of one pass of a fan-out step: (all, completed, failed)."""
    counts = dict(StepRun.objects.filter(run_id=run_id, kind="step", seq=seq, step_index=index)
                  .values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
    return (sum(counts.values()), counts.get(StepStatus.COMPLETED, 0),
            counts.get(StepStatus.FAILED, 0))


def _settle(spec: WorkflowSpec, run: WorkflowRun, index: int, seq: int,
            rows: list[dict[str, Any]], events: list[Event], now) -> None:
    """Settle a fan-out step: cancel the rows still live, merge, count one transition."""
    step = spec.steps[index]
    cancelled = StepRun.objects.filter(
        run_id=run.pk, kind="step", seq=seq, step_index=index,
        status__in=LIVE_OR_HELD,
    ).update(status=StepStatus.CANCELLED, finished_at=now)
    output = _fanout_output(spec, step, run.state, rows)
    state = {**run.state, **engine.public(output)}
    succeeded = sum(r["status"] == StepStatus.COMPLETED for r in rows)
    cost = step.cost_units if step.kind == "parallel" else step.cost_units * succeeded
    usage = budgets.Usage(run.transitions + 1, run.cost_units + cost, run.started_workflows)
    _check(spec, run.pk, state, usage)
    events.append(Event(run_id=run.pk, kind="step_completed", step_index=index,
                        step_name=step.name, data={"output": output, "cancelled": cancelled}))
    _land(spec, run.pk, index + 1 if index + 1 < len(spec.steps) else None, state, usage, now,
          events, paused=run.status == RunStatus.PAUSED)


def _fail_parked(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                 usage: budgets.Usage, now, events: list[Event],
                 breach: exceptions.BudgetExceeded) -> str:
    """Fail a run at the wait ``index`` whose settling breached the budget."""
    error = {**engine.describe_error(breach, False), "step": spec.steps[index].name,
             "step_index": index, "attempt": None, "max_attempts": None,
             "budget": breach.budget, "limit": breach.limit, "used": breach.used}
    return _fail_waiting(spec, run_id, index, state, usage, now, events, error)


def _fail_waiting(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                  usage: budgets.Usage, now, events: list[Event], error: dict[str, Any]
                  ) -> str:
    """Fail a run (locked by this transaction) at the step ``index`` it waits at, with
    ``error``, keeping ``state``; wake its own waiters and start its compensations."""
    step = spec.steps[index]
    WorkflowRun.objects.filter(pk=run_id).update(
        state=state, transitions=usage.transitions, cost_units=usage.cost_units,
        started_workflows=usage.started_workflows,
        current_step=index, status=RunStatus.FAILED, error=error, finished_at=now,
        updated_at=now, revision=F("revision") + 1)
    WorkflowDependency.objects.filter(run_id=run_id).delete()
    events.append(Event(run_id=run_id, kind="workflow_failed", step_index=index,
                        step_name=step.name, data={"error": error}))
    Event.objects.bulk_create(events)
    notify_finished(run_id)
    logger.warning("Run id=%s failed at step %r: %s", run_id, step.name, error["message"])
    if spec.compensate_on_failure:
        from queuety import operations

        operations.start_cleanup(WorkflowRun.objects.get(pk=run_id), spec, "failure", now)
    return RunStatus.FAILED


def _locked_run(run_id: int) -> WorkflowRun:
    return (WorkflowRun.objects.select_for_update()
            .only("name", "definition_id", "status", "state", "current_step", "transitions",
                  "cost_units", "started_workflows", "error").get(pk=run_id))


def _check(spec: WorkflowSpec, run_id: int, state: dict[str, Any],
           usage: budgets.Usage) -> None:
    """Raise BudgetExceeded if a run at ``usage`` with ``state`` breaches its budget."""
    if spec.budget.configured():
        size = budgets.state_bytes(state) if spec.budget.max_state_bytes else 0
        budgets.check(spec.budget, replace(usage, public_state_bytes=size), run_id, spec.name)


def _land(spec: WorkflowSpec, run_id: int, index: int | None, state: dict[str, Any],
          usage: budgets.Usage, now, events: list[Event], *, fail_on_breach: bool = True,
          paused: bool = False) -> str:
    """Move a run (whose row this transaction has locked or created) onto step ``index``.

    Steps that need no worker are done here, in this transaction, as long as they can be:
    signal waits settle from stored signals (consuming them), workflow waits from the awaited
    runs' statuses, ``start`` steps create their runs, ``repeat`` steps loop, empty
    ``for_each`` steps settle. The run then parks at the first unsatisfied wait (no worker,
    no message), or gets its next task row(s) and message(s). A workflow wait that can no
    longer be satisfied fails the run. Writes the run row and ``events``; returns the status.

    A wait whose settling would breach the budget fails the run there (``fail_on_breach``,
    the worker's path), keeping the state from before the wait; or raises.
    A paused run moves but stays paused: its next task row is created unpublished and a wait
    is not evaluated, until ``resume()``.

    Raises:
        BudgetExceeded: with ``fail_on_breach=False`` (a caller of ``signal()``), whose
            transaction then rolls back, so nothing is consumed or recorded.
    """
    status = RunStatus.PAUSED if paused else RunStatus.RUNNING
    items: list[Any] | None = None
    loops: dict[str, int] | None = None
    groups: dict[str, list[int]] | None = None
    while not paused and index is not None and \
            spec.steps[index].kind in ("wait", "for_each", "repeat", "start", "wait_workflows"):
        step = spec.steps[index]
        if step.kind in ("start", "wait_workflows") and groups is None:
            groups = dict(WorkflowRun.objects.values_list("groups", flat=True).get(pk=run_id))
        if step.kind == "start":
            state, usage, ids = _start_runs(spec, run_id, index, state, usage, now)
            _check(spec, run_id, state, usage)
            if step.start.group:  # a start step entered again replaces its group
                groups[step.start.group] = ids
            events.append(Event(run_id=run_id, kind="workflows_started", step_index=index,
                                step_name=step.name, data={"runs": ids,
                                                           "group": step.start.group}))
            index = index + 1 if index + 1 < len(spec.steps) else None
            continue
        if step.kind == "repeat":
            if loops is None:
                loops = dict(WorkflowRun.objects.values_list("loops", flat=True).get(pk=run_id))
            again, loops = _repeat(spec, run_id, index, state, loops)
            usage = replace(usage, transitions=usage.transitions + 1)
            _check(spec, run_id, state, usage)
            events.append(Event(run_id=run_id, kind="repeat_evaluated", step_index=index,
                                step_name=step.name, data={
                                    "again": again, "iterations": loops.get(str(index), 0)}))
            index = spec.index_of(step.repeat["target"]) if again else (
                index + 1 if index + 1 < len(spec.steps) else None)
            continue
        if step.kind == "for_each":
            items = _items(spec, run_id, step, state)
            if items:
                break
            # Nothing to fan out to: the join settles at once, as a transition.
            output = _fanout_output(spec, step, state, [])
            state = {**state, **engine.public(output)}
            usage = replace(usage, transitions=usage.transitions + 1)
            _check(spec, run_id, state, usage)
            events.append(Event(run_id=run_id, kind="for_each_settled", step_index=index,
                                step_name=step.name, data={"output": output}))
            index = index + 1 if index + 1 < len(spec.steps) else None
            continue
        if step.kind == "wait_workflows":
            try:
                ids, found = _workflow_wait(spec, run_id, index, state, groups)
            except exceptions.InvalidStepOutput as error:
                return _fail_waiting(spec, run_id, index, state, usage, now, events, {
                    **engine.describe_error(error, False), "step": step.name,
                    "step_index": index, "attempt": None, "max_attempts": None})
            if found.verdict == fanout.PENDING:
                status = RunStatus.WAITING_FOR_WORKFLOWS
                WorkflowDependency.objects.filter(run_id=run_id).delete()
                WorkflowDependency.objects.bulk_create([
                    WorkflowDependency(run_id=run_id, step_index=index, depends_on=i)
                    for i in found.remaining])
                events.append(Event(run_id=run_id, kind="workflow_waiting", step_index=index,
                                    step_name=step.name, data={
                                        "waiting_for": [str(i) for i in ids],
                                        **found.details}))
                break
            if found.verdict == fanout.IMPOSSIBLE:
                failure = exceptions.WorkflowWaitFailed(
                    f"Workflow wait {step.name!r} of run {run_id} can no longer be satisfied "
                    f"(mode {step.workflows.mode!r}"
                    + (f", quorum {step.workflows.quorum}" if step.workflows.quorum else "")
                    + f"): runs {found.failed} failed, were cancelled or do not exist; "
                    f"completed {found.matched}, still running {found.remaining}.")
                return _fail_waiting(spec, run_id, index, state, usage, now, events, {
                    **engine.describe_error(failure, False), "step": step.name,
                    "step_index": index, "attempt": None, "max_attempts": None,
                    **found.details})
            output, used = found.output, {"workflows": found.matched}
        else:
            stored = list(Signal.objects.filter(
                run_id=run_id, consumed_at__isnull=True, name__in=step.wait.signals,
            ).order_by("pk").values_list("pk", "name", "payload"))
            result = waits.evaluate(step.wait, stored, state)
            if not result.settled:
                status = RunStatus.WAITING_FOR_SIGNAL
                events.append(Event(run_id=run_id, kind="workflow_waiting", step_index=index,
                                    step_name=step.name, data={
                                        "waiting_for": list(step.wait.signals),
                                        "matched": result.matched}))
                break
            output = result.output
            used = {"signals": [name for name, _ in result.chosen],
                    "signal_ids": result.consumed}
        settled_state = {**state, **engine.public(output)}
        settled_usage = replace(usage, transitions=usage.transitions + 1)
        try:
            _check(spec, run_id, settled_state, settled_usage)
        except exceptions.BudgetExceeded as breach:
            if not fail_on_breach:
                raise
            return _fail_parked(spec, run_id, index, state, usage, now, events, breach)
        state, usage = settled_state, settled_usage
        if step.kind == "wait_workflows":
            WorkflowDependency.objects.filter(run_id=run_id).delete()
        else:
            Signal.objects.filter(pk__in=used["signal_ids"]).update(
                consumed_at=now, consumed_by_step=step.name)
        events.append(Event(run_id=run_id, kind="wait_settled", step_index=index,
                            step_name=step.name, data={**used, "output": output}))
        index = index + 1 if index + 1 < len(spec.steps) else None
    if status == RunStatus.RUNNING and index is not None and spec.steps[index].kind == "child":
        status = RunStatus.WAITING_FOR_WORKFLOWS
    fields: dict[str, Any] = {
        "state": state, "transitions": usage.transitions, "cost_units": usage.cost_units,
        "started_workflows": usage.started_workflows,
        "revision": F("revision") + 1, "updated_at": now, "status": status,
        **({} if loops is None else {"loops": loops}),
        **({} if groups is None else {"groups": groups}),
    }
    if index is None:
        status = RunStatus.COMPLETED
        fields.update(status=status, current_step=len(spec.steps), finished_at=now)
        events.append(Event(run_id=run_id, kind="workflow_completed"))
        notify_finished(run_id)
    else:
        fields["current_step"] = index
    WorkflowRun.objects.filter(pk=run_id).update(**fields)
    if status == RunStatus.WAITING_FOR_WORKFLOWS and spec.steps[index].kind == "child":
        child_id = _start_child(spec, run_id, index, state, now)
        events.append(Event(run_id=run_id, kind="child_started", step_index=index,
                            step_name=spec.steps[index].name, data={"child_run": child_id}))
    if status == RunStatus.RUNNING and spec.steps[index].kind in ("parallel", "for_each"):
        _fan_out(spec, run_id, index, state, usage.transitions, now, items)
    elif status == RunStatus.RUNNING and spec.steps[index].kind == "delay":
        # The due time lives in the row; long delays are published by the sweeper when due.
        wait = spec.steps[index].delay_seconds
        due = now + timedelta(seconds=wait)
        on_broker = wait <= settings.MAX_ETA
        following = StepRun.objects.create(
            run_id=run_id, seq=usage.transitions, step_index=index,
            step_name=spec.steps[index].name, max_attempts=3, available_at=due,
            published_at=due if on_broker else None)
        if on_broker:
            publish_on_commit([_message(spec, following.pk, index, wait or None)])
    elif status == RunStatus.RUNNING:
        following = _new_step_run(run_id, spec, index, seq=usage.transitions, now=now)
        publish_on_commit([_message(spec, following.pk, index)])
    elif status == RunStatus.PAUSED and spec.steps[index].kind == "task":
        # Ready for resume(), which publishes it; until then claims skip it.
        _new_step_run(run_id, spec, index, seq=usage.transitions, now=now, published=False)
    Event.objects.bulk_create(events)
    return status


def _mark_completed(held: Claim, output: dict[str, Any], now) -> bool:
    return bool(StepRun.objects.filter(
        pk=held.step_run_id, status=StepStatus.PROCESSING, attempt=held.attempt,
        claimed_by=held.claimed_by,
    ).update(status=StepStatus.COMPLETED, finished_at=now, output=output))


# The whole transition in one statement, run in autocommit. The step row is locked first (the
# same lock order as every other writer: step row, then run row), and every write depends on
# the run's compare-and-set, so a lost claim or a moved run writes nothing: the caller then
# discards the outcome or decides under the run's lock. The next task row is inserted either
# pending (its message is published after the commit) or already claimed by this process,
# which then runs it: an ordinary processing row with a heartbeat, recovered like any other.
_COMPLETE_POSTGRES = """
WITH owned AS (
    SELECT id FROM queuety_steprun
     WHERE id = %(step_run_id)s AND status = 'processing' AND attempt = %(attempt)s
       AND claimed_by = %(claimed_by)s
       FOR UPDATE
), run AS (
    UPDATE queuety_workflowrun
       SET state = %(state)s::jsonb, current_step = %(current_step)s, status = %(status)s,
           finished_at = COALESCE(%(finished_at)s::timestamptz, finished_at),
           updated_at = %(now)s, revision = revision + 1, transitions = transitions + 1,
           cost_units = cost_units + %(cost_units)s
     WHERE id = %(run_id)s AND revision = %(revision)s AND status = 'running'
       AND current_step = %(step_index)s AND EXISTS (SELECT 1 FROM owned)
    RETURNING id
), step AS (
    UPDATE queuety_steprun SET status = 'completed', finished_at = %(now)s,
           output = %(output)s::jsonb
     WHERE id = %(step_run_id)s AND status = 'processing' AND attempt = %(attempt)s
       AND claimed_by = %(claimed_by)s AND EXISTS (SELECT 1 FROM run)
), following AS (
    INSERT INTO queuety_steprun (run_id, seq, branch, step_index, step_name, status, attempt,
                                 max_attempts, timeout, available_at, published_at, claimed_at,
                                 heartbeat_at, claimed_by, created_at)
    SELECT %(run_id)s, %(seq)s, 0, %(next_index)s::integer, %(next_name)s::text,
           %(next_status)s, %(next_attempt)s, %(next_max_attempts)s::integer,
           %(next_timeout)s::float8, %(now)s, %(next_published_at)s::timestamptz,
           %(next_claimed_at)s::timestamptz, %(next_claimed_at)s::timestamptz,
           %(next_claimed_by)s, %(now)s
     WHERE %(next_index)s::integer IS NOT NULL AND EXISTS (SELECT 1 FROM run)
    RETURNING id
), events AS (
    INSERT INTO queuety_event (run_id, step_run_id, kind, step_index, step_name, attempt,
                               duration_ms, data, created_at)
    SELECT %(run_id)s, e.step_run_id, e.kind, e.step_index, COALESCE(e.step_name, ''),
           e.attempt, e.duration_ms, COALESCE(e.data, '{}'::jsonb), %(now)s
      FROM jsonb_to_recordset(%(events)s::jsonb) AS e(
           step_run_id bigint, kind text, step_index integer, step_name text, attempt integer,
           duration_ms double precision, data jsonb)
     WHERE EXISTS (SELECT 1 FROM run)
)
SELECT EXISTS (SELECT 1 FROM owned), EXISTS (SELECT 1 FROM run), (SELECT id FROM following)
"""


def _complete_postgres(held: Claim, spec: WorkflowSpec, outcome: engine.Advance,
                       completed: Event, now, claim_next: bool
                       ) -> tuple[bool, bool, Claim | None]:
    """Run the one-statement transition: (owned, advanced, claim of the next step if this
    process took it)."""
    events = [{field: getattr(completed, field) for field in (
        "step_run_id", "kind", "step_index", "step_name", "attempt", "duration_ms", "data")}]
    following = None if outcome.next_index is None else spec.steps[outcome.next_index]
    if following is None:
        events.append({"kind": "workflow_completed"})
    # Only an untimed step runs inline: a timed one needs its own message, which carries the
    # hard time limit that kills a process stuck in C code.
    inline = claim_next and following is not None and following.timeout is None
    state = json.dumps(outcome.state)
    cost_units = spec.steps[held.step_index].cost_units
    params = {
        "now": now, "step_run_id": held.step_run_id, "attempt": held.attempt,
        "claimed_by": held.claimed_by,
        "output": json.dumps(outcome.output), "state": state,
        "run_id": held.run_id, "revision": held.revision, "step_index": held.step_index,
        "current_step": len(spec.steps) if following is None else outcome.next_index,
        "status": RunStatus.COMPLETED.value if following is None else RunStatus.RUNNING.value,
        "finished_at": now if following is None else None,
        "seq": held.usage.transitions + 1, "next_index": outcome.next_index,
        "next_name": following and following.name,
        "next_max_attempts": following and effective_policy(spec, outcome.next_index)
        .max_attempts,
        "next_timeout": following and following.timeout,
        "next_status": StepStatus.PROCESSING.value if inline else StepStatus.PENDING.value,
        "next_attempt": 1 if inline else 0,
        "next_published_at": None if inline else now,
        "next_claimed_at": now if inline else None,
        "next_claimed_by": held.claimed_by if inline else "",
        "events": json.dumps(events),
        "cost_units": cost_units,
    }
    with _hot_cursor() as cursor:
        cursor.execute(_COMPLETE_POSTGRES, params)
        owned, advanced, next_id = cursor.fetchone()
    if next_id is None:
        if advanced and following is None:
            # The run completed. Its waiters are read by a statement of their own: a waiter
            # that held this run's row FOR SHARE committed its dependency rows before the CTE
            # could update the row, but the CTE's snapshot, taken before that, cannot see them.
            notify_finished(held.run_id)
        return owned, advanced, None
    if not inline:
        publish_on_commit([_message(spec, next_id, outcome.next_index)])
        return owned, advanced, None
    # What a claim would have read back: the state as stored (JSON), the run's counters.
    usage = held.usage
    return owned, advanced, Claim(
        next_id, held.run_id, outcome.next_index, held.usage.transitions + 1, 1,
        held.definition_id, json.loads(state), held.revision + 1, now,
        budgets.Usage(usage.transitions + 1, usage.cost_units + cost_units,
                      usage.started_workflows), "step", held.claimed_by)


def record_failure(held: Claim, spec: WorkflowSpec, error: BaseException,
                   duration_ms: float | None) -> None:
    """Record a failed attempt: schedule the next attempt, or fail the step and its run."""
    from queuety import operations

    now = timezone.now()
    cleanup = held.kind != "step"
    if cleanup:
        row = StepRun.objects.only("handler", "step_name").get(pk=held.step_run_id)
        policy, name = operations.cleanup_policy(spec, row.handler), row.step_name
    else:
        policy, name = effective_policy(spec, held.step_index), spec.steps[held.step_index].name
    step = spec.steps[held.step_index] if held.step_index < len(spec.steps) else None
    # After an operator's retry() the row's budget is max_attempts = attempts so far + the
    # policy's; the policy counts the attempts of this budget only.
    row_max = StepRun.objects.values_list("max_attempts", flat=True).get(pk=held.step_run_id)
    attempt = held.attempt - max(0, row_max - policy.max_attempts)
    delay = engine.retry_delay(policy, error, attempt)
    guard = StepRun.objects.filter(
        pk=held.step_run_id, status=StepStatus.PROCESSING, attempt=held.attempt,
        claimed_by=held.claimed_by,
    )
    event = Event(run_id=held.run_id, step_run_id=held.step_run_id, step_index=held.step_index,
                  step_name=name, attempt=held.attempt, duration_ms=duration_ms)
    with transaction.atomic():
        if delay is not None and not cleanup:
            try:  # in this transaction: its lock holds until the retry is scheduled
                _check_attempts(held.run_id, name, error)
            except exceptions.BudgetExceeded as breach:
                error, delay = breach, None
        record = engine.describe_error(error)
        if delay is not None:
            due = now + timedelta(seconds=delay)
            on_broker = delay <= settings.MAX_ETA
            if not guard.update(status=StepStatus.PENDING, available_at=due,
                                published_at=due if on_broker else None, error=record,
                                claimed_at=None, heartbeat_at=None):
                return
            event.kind = f"{held.kind}_retried"
            event.data = {"error": record, "retry_in": round(delay, 6),
                          "retry_at": due.isoformat(), "max_attempts": policy.max_attempts}
            event.save()
            if on_broker:
                publish_on_commit([Message(held.step_run_id, delay,
                                           None if cleanup else step.timeout, spec.queue)])
            logger.info("Step run id=%s attempt=%s failed (%s); retry in %.3fs",
                        held.step_run_id, held.attempt, record["type"], delay)
            return
        if not guard.update(status=StepStatus.FAILED, finished_at=now, error=record):
            return
        if cleanup:  # a failed compensation is recorded and skipped; the next one runs
            event.kind = f"{held.kind}_failed"
            event.data = {"error": record, "max_attempts": policy.max_attempts}
            event.save()
            operations.cleanup_done(held.run_id, spec, now)
            return
        if step.kind == "for_each" and not isinstance(error, exceptions.BudgetExceeded):
            # One item failing fails the run only if the join can no longer be satisfied.
            run = _locked_run(held.run_id)
            total, succeeded, failed = _fanout_counts(held.run_id, held.seq, held.step_index)
            verdict = fanout.progress(step.fanout.mode, step.fanout.quorum, total, succeeded,
                                      failed)
            if verdict != fanout.IMPOSSIBLE or run.current_step != held.step_index:
                event.kind = "item_failed"
                event.data = {"error": record, "max_attempts": policy.max_attempts}
                event.save()
                if run.status == RunStatus.RUNNING and run.current_step == held.step_index:
                    _release_held(spec, held.run_id, held.seq, held.step_index, now)
                return
        if step.kind in ("parallel", "for_each"):
            StepRun.objects.filter(
                run_id=held.run_id, kind="step", seq=held.seq, step_index=held.step_index,
                status__in=LIVE_OR_HELD,
            ).exclude(pk=held.step_run_id).update(status=StepStatus.CANCELLED, finished_at=now)
        run_error = {
            "type": record["type"], "message": record["message"], "step": step.name,
            "step_index": held.step_index, "attempt": held.attempt,
            "max_attempts": policy.max_attempts,
        }
        if isinstance(error, exceptions.BudgetExceeded):
            run_error.update(budget=error.budget, limit=error.limit, used=error.used)
        failed = WorkflowRun.objects.filter(
            pk=held.run_id, status__in=(RunStatus.RUNNING, RunStatus.PAUSED)).update(
            status=RunStatus.FAILED, error=run_error, finished_at=now, updated_at=now,
            revision=F("revision") + 1,
        )
        event.kind = "step_failed"
        event.data = {"error": record, "max_attempts": policy.max_attempts}
        Event.objects.bulk_create([
            event, Event(run_id=held.run_id, kind="workflow_failed", data={"error": run_error}),
        ])
        if failed:
            notify_finished(held.run_id)
        if failed and spec.compensate_on_failure:
            operations.start_cleanup(WorkflowRun.objects.get(pk=held.run_id), spec, "failure",
                                     now)
    logger.warning("Run id=%s failed at step %r attempt %s: %s: %s", held.run_id, step.name,
                   held.attempt, record["type"], record["message"])


class _Heartbeats:
    """One daemon thread per process refreshes the heartbeat of every step it is running.

    Cheaper than a thread per step (measured: 0.2-0.5 ms a step), and its rows are guarded by
    this process's ``claimed_by``, so it never keeps alive a row another process owns.
    """

    name = "queuety-heartbeat"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[int] = set()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextmanager
    def running(self, step_run_id: int):
        with self._lock:
            self._live.add(step_run_id)
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                # A forked child inherits no threads: start this process's own.
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._beat, name=self.name, daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._live.discard(step_run_id)

    def _beat(self) -> None:
        from django.db import close_old_connections

        me = worker_id()
        while True:
            time.sleep(settings.HEARTBEAT_INTERVAL)
            with self._lock:
                live = list(self._live)
            if not live:
                # Hold no database session while idle (most steps end before their first
                # beat); a no-op when this thread has not connected.
                connection.close()
                continue
            try:
                close_old_connections()
                StepRun.objects.filter(pk__in=live, status=StepStatus.PROCESSING,
                                       claimed_by=me).update(heartbeat_at=timezone.now())
            except Exception:  # noqa: BLE001 - beat again next time, on a new connection
                logger.exception("Heartbeat of step runs %s failed", live)
                connection.close()


_heartbeats = _Heartbeats()


def _heartbeat(step_run_id: int, attempt: int):
    """Keep the step's heartbeat fresh while this process works on it."""
    return _heartbeats.running(step_run_id)


@contextmanager
def _deadline(step: StepSpec, held: Claim):
    """Interrupt the handler with StepTimeout when the step's timeout passes.

    Uses a real-time interval timer, so blocking Python code (``time.sleep``, socket reads, busy
    loops) is interrupted at the deadline, with sub-second precision. Code stuck in C that
    ignores signals is killed by Celery's hard time limit instead (see ``queuety.publish``).
    """
    if step.timeout is None:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise exceptions.PermanentError(
            f"Step {step.name!r} of run {held.run_id} has timeout={step.timeout:g}s but runs "
            "outside a process's main thread (threads, eventlet or gevent pool), where it cannot "
            "be interrupted. Run Queuety workers with --pool prefork (the default) or solo."
        )

    def on_alarm(signum, frame):
        raise exceptions.StepTimeout(
            f"Step {step.name!r} of run {held.run_id} (attempt {held.attempt}) exceeded its "
            f"timeout of {step.timeout:g}s and was interrupted."
        )

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, step.timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def recover_attempt(step_run_id: int, claimed_by: str, *, hard_timeout: bool) -> bool:
    """Record that the process ``claimed_by`` died while running step row ``step_run_id``.

    Called by the worker's main process when a pool process was killed at the hard time limit
    (``hard_timeout``: recorded as :class:`StepTimeout`) or died otherwise (:class:`WorkerLost`).
    The task may have been running a later step of the same run inline (see
    :func:`execute_step`), so every processing row of that run the dead process held is
    recorded. Guarded by ``claimed_by``, so it never touches an attempt another process owns.
    Returns True when an attempt was recorded.
    """
    rows = (StepRun.objects.filter(
        run_id__in=StepRun.objects.filter(pk=step_run_id).values("run_id"),
        status=StepStatus.PROCESSING, claimed_by=claimed_by)
        .select_related("run").order_by("pk"))
    recorded = False
    for row in rows:
        # The row still processing is the step that was running when the process was killed
        # (the message's own, or an inline one under a site-wide time limit): the limit hit it.
        record_failure(_claim_of(row), load_spec(row.run.definition_id),
                       _interruption(row, hard_timeout), None)
        recorded = True
    return recorded


def _claim_of(row: StepRun) -> Claim:
    return Claim(row.pk, row.run_id, row.step_index, row.seq, row.attempt,
                 row.run.definition_id, row.run.state, row.run.revision, row.claimed_at,
                 budgets.Usage(row.run.transitions, row.run.cost_units,
                               row.run.started_workflows), row.kind, row.claimed_by)


def _interruption(row: StepRun, timed_out: bool) -> BaseException:
    if timed_out and row.timeout is None:
        # A step without a timeout of its own can still meet the worker's task_time_limit.
        return exceptions.StepTimeout(
            f"Step {row.step_name!r} of run {row.run_id} (attempt {row.attempt}) ran past the "
            f"worker's hard time limit and its process ({row.claimed_by}) was killed."
        )
    if timed_out:
        return exceptions.StepTimeout(
            f"Step {row.step_name!r} of run {row.run_id} (attempt {row.attempt}) ignored its "
            f"timeout of {row.timeout:g}s and its process ({row.claimed_by}) was killed at the "
            "hard limit."
        )
    since = f" since {row.heartbeat_at.isoformat()}" if row.heartbeat_at else ""
    return exceptions.WorkerLost(
        f"The process running step {row.step_name!r} of run {row.run_id} (attempt "
        f"{row.attempt}, {row.claimed_by or 'unknown'}) died or stopped sending "
        f"heartbeats{since}."
    )


# -- the sweeper ------------------------------------------------------------------------------

#: Seconds past the hard time limit before the sweeper declares a timed-out attempt dead,
#: leaving the pool time to kill the process.
_KILL_MARGIN = 0.5


def sweep(now=None) -> dict[str, int]:
    """Recover lost attempts and re-publish due steps whose message may be lost.

    Safe to run concurrently with workers and with itself: every change is guarded by the row's
    status and attempt. Returns counts of what it did.
    """
    from queuety import operations

    now = now or timezone.now()
    report = {}
    for name, phase in (("recovered", _recover_lost), ("republished", _republish_due),
                        ("parents", _wake_parents),
                        ("overdue", operations.fail_overdue),
                        ("purged", operations.purge_finished)):
        try:
            report[name] = phase(now)
        except Exception:  # noqa: BLE001 - the other phases still run
            logger.exception("Sweeper phase %r failed", name)
            report[name] = -1
    if any(report.values()):
        logger.info("Sweep %s", " ".join(f"{k}={v}" for k, v in report.items()))
    return report


def _recover_lost(now) -> int:
    stale_before = now - timedelta(seconds=settings.STALE_AFTER)
    grace = settings.HARD_TIMEOUT_GRACE + _KILL_MARGIN
    rows = (StepRun.objects.filter(status=StepStatus.PROCESSING)
            .filter(Q(heartbeat_at__lt=stale_before) | Q(timeout__isnull=False))
            .select_related("run")[:500])
    recovered = 0
    for row in rows:
        timed_out = row.timeout is not None and (
            row.claimed_at + timedelta(seconds=row.timeout + grace) < now)
        if not timed_out and not (row.heartbeat_at and row.heartbeat_at < stale_before):
            continue
        # One bad row must not stop the sweeper for every other run.
        try:
            record_failure(_claim_of(row), load_spec(row.run.definition_id),
                           _interruption(row, timed_out), None)
        except Exception as error:  # noqa: BLE001
            logger.exception("Could not recover step run id=%s; failing it.", row.pk)
            fail_unloadable(row.pk, row.run_id, error)
        recovered += 1
    return recovered


def fail_unloadable(step_run_id: int, run_id: int, error: BaseException) -> None:
    """Fail a step (and, for a workflow step, its run) whose definition or handler this
    process cannot load: nothing else could ever finish it."""
    now = timezone.now()
    record = engine.describe_error(error)
    with transaction.atomic():
        row = StepRun.objects.select_for_update().filter(
            pk=step_run_id, status__in=(StepStatus.PENDING, StepStatus.PROCESSING)).first()
        if row is None:
            return
        StepRun.objects.filter(pk=row.pk).update(status=StepStatus.FAILED, finished_at=now,
                                                 error=record)
        Event.objects.create(run_id=run_id, step_run_id=row.pk, kind=f"{row.kind}_failed",
                             step_index=row.step_index, step_name=row.step_name,
                             attempt=row.attempt, data={"error": record})
        if row.kind == "step":
            run_error = {"type": record["type"], "message": record["message"],
                         "step": row.step_name, "step_index": row.step_index,
                         "attempt": row.attempt, "max_attempts": row.max_attempts}
            if WorkflowRun.objects.filter(pk=run_id, status__in=(
                    RunStatus.RUNNING, RunStatus.PAUSED)).update(
                    status=RunStatus.FAILED, error=run_error, finished_at=now,
                    updated_at=now, revision=F("revision") + 1):
                Event.objects.create(run_id=run_id, kind="workflow_failed",
                                     data={"error": run_error})
    logger.error("Step run id=%s of run id=%s failed: %s", step_run_id, run_id, record["message"])


_FINISHED_DEPENDENCIES = """
SELECT DISTINCT d.run_id FROM queuety_workflowdependency d
  JOIN queuety_workflowrun w ON w.id = d.run_id AND w.status = 'waiting_for_workflows'
  LEFT JOIN queuety_workflowrun r ON r.id = d.depends_on
 WHERE r.id IS NULL OR r.status IN ('completed', 'failed', 'cancelled')
 LIMIT 200
"""


def _wake_parents(now) -> int:
    """Move on runs whose child or awaited run finished but whose wake-up message was lost."""
    waiting = set(WorkflowRun.objects.filter(
        status=RunStatus.WAITING_FOR_WORKFLOWS, children__status__in=FINISHED,
        children__parent_step=F("current_step"),
    ).values_list("pk", flat=True).distinct()[:200])
    with connection.cursor() as cursor:
        cursor.execute(_FINISHED_DEPENDENCIES)
        waiting.update(row[0] for row in cursor.fetchall())
    moved = 0
    for run_id in sorted(waiting):
        try:
            moved += resume_waiting(run_id) not in (None, RunStatus.WAITING_FOR_WORKFLOWS)
        except Exception:  # noqa: BLE001 - one bad run must not stop the sweep
            logger.exception("Could not wake waiting run id=%s", run_id)
    return moved


def _republish_due(now) -> int:
    silent_since = now - timedelta(seconds=settings.REDELIVER_AFTER)
    with transaction.atomic():
        rows = list(
            StepRun.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(Q(run__status=RunStatus.RUNNING) | ~Q(kind="step"),
                    status=StepStatus.PENDING, available_at__lte=now)
            .filter(Q(published_at__isnull=True) | Q(published_at__lt=silent_since))
            .values_list("pk", "step_index", "run__definition_id", "kind")[:1000]
        )
        if rows:
            StepRun.objects.filter(pk__in=[row[0] for row in rows]).update(published_at=now)
            publish_on_commit([_message(load_spec(definition_pk), pk, index)
                               if kind == "step" else
                               Message(pk, None, None, load_spec(definition_pk).queue)
                               for pk, index, definition_pk, kind in rows])
    return len(rows)


# -- signals and human replies -----------------------------------------------------------------

FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class SignalReceipt:
    """What a delivered signal did."""

    signal_id: int
    run_id: int
    name: str
    settled: bool
    """True if it completed the wait the run was parked at."""
    status: str
    """The run's status afterwards."""


def _signal_data(run_id: int, name: Any, data: Any) -> Any:
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise exceptions.InvalidSignalData(
            f"Signal names are non-blank strings of at most 255 characters (got {name!r} for "
            f"run {run_id})."
        )
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise exceptions.InvalidSignalData(
            f"The data of signal {name!r} for run {run_id} is not JSON: {error}.",
            [{"path": "/", "message": str(error)}],
        ) from None
    except RecursionError:
        message = "it is nested too deeply"
        raise exceptions.InvalidSignalData(
            f"The data of signal {name!r} for run {run_id} is not storable JSON: {message}.",
            [{"path": "/", "message": message}],
        ) from None
    size, limit = len(text.encode()), settings.MAX_SIGNAL_BYTES
    if size > limit:
        raise exceptions.InvalidSignalData(
            f"The data of signal {name!r} for run {run_id} is {size} bytes; the limit is "
            f"{limit} (QUEUETY['MAX_SIGNAL_BYTES']).", too_large=True,
        )
    return data


def send_signal(run_id: int, name: str, data: Any = None, *, sent_by: str = "",
                dedupe_key: str | None = None) -> SignalReceipt:
    """Deliver signal ``name`` with ``data`` to run ``run_id`` (``queuety.signal()``).

    One transaction, with the run row locked: the signal is stored, and if the run is parked
    at a wait it completes, the wait settles and the run moves on. A signal sent before its
    wait is reached is kept until the wait consumes it.

    Raises:
        RunNotFound: no such run (nothing is stored).
        RunNotWaiting: the run has finished, or no wait of its workflow listens for ``name``.
        InvalidSignalData: not JSON, over ``MAX_SIGNAL_BYTES``, or failing the input schema.
        BudgetExceeded: settling the wait would breach a budget; the signal is not recorded
            and the run keeps waiting.
    """
    data = _signal_data(run_id, name, data)
    with transaction.atomic():
        run, spec = _lock_for_signal(run_id)
        return _deliver(run, spec, name, data, sent_by=sent_by, dedupe_key=dedupe_key)


def _lock_for_signal(run_id: int, finished_ok: bool = False
                     ) -> tuple[WorkflowRun, WorkflowSpec]:
    try:
        run = _locked_run(run_id)
    except (WorkflowRun.DoesNotExist, ValueError, TypeError):
        raise exceptions.RunNotFound(run_id) from None
    if run.status in FINISHED and not finished_ok:
        raise exceptions.RunNotWaiting(
            run_id, f"Run {run_id} of workflow {run.name!r} is {run.status}; it takes no more "
                    "signals.")
    return run, load_spec(run.definition_id)


def _deliver(run: WorkflowRun, spec: WorkflowSpec, name: str, data: Any, *, sent_by: str,
             dedupe_key: str | None) -> SignalReceipt:
    listeners = [i for i, step in enumerate(spec.steps)
                 if step.kind == "wait" and name in step.wait.signals]
    if not listeners:
        known = sorted({n for step in spec.steps if step.wait for n in step.wait.signals})
        raise exceptions.RunNotWaiting(
            run.pk, f"No wait of workflow {spec.name!r} (run {run.pk}) listens for signal "
                    f"{name!r}, so it could never be used; its waits listen for "
                    f"{', '.join(map(repr, known)) or 'nothing'}.")
    parked_here = (run.status == RunStatus.WAITING_FOR_SIGNAL
                   and run.current_step in listeners)
    target = run.current_step if parked_here else next(
        (i for i in listeners if i >= run.current_step), listeners[0])
    schema = spec.steps[target].wait.schema
    if schema is not None:
        problems = waits.validation_errors(schema, data)
        if problems:
            raise exceptions.InvalidSignalData(
                f"The data of signal {name!r} for run {run.pk} does not match the input schema "
                f"of step {spec.steps[target].name!r}: "
                + "; ".join(f"{p['path']}: {p['message']}" for p in problems) + ".",
                problems,
            )
    if dedupe_key is not None and Signal.objects.filter(dedupe_key=dedupe_key).exists():
        raise exceptions.AlreadyAnswered(
            run.pk, f"This reply to run {run.pk} was already recorded; nothing new was done.")
    now = timezone.now()
    signal_row = Signal.objects.create(run_id=run.pk, name=name, payload=data, sent_by=sent_by,
                                       dedupe_key=dedupe_key)
    events = [Event(run_id=run.pk, kind="signal_received", step_index=target,
                    step_name=spec.steps[target].name,
                    data={"signal": name, "signal_id": signal_row.pk, "sent_by": sent_by})]
    status = run.status
    if parked_here:
        usage = budgets.Usage(run.transitions, run.cost_units, run.started_workflows)
        status = _land(spec, run.pk, run.current_step, run.state, usage, now, events,
                       fail_on_breach=False)
    else:
        Event.objects.bulk_create(events)
    settled = parked_here and not (status == RunStatus.WAITING_FOR_SIGNAL and Signal.objects
                                   .filter(pk=signal_row.pk, consumed_at__isnull=True).exists())
    logger.info("Signal %r delivered to run id=%s (settled=%s)", name, run.pk, settled)
    return SignalReceipt(signal_row.pk, run.pk, name, settled, status)


#: What each kind of human reply answers, and which signal it sends there.
def _reply_signal(wait: waits.WaitSpec, kind: str) -> str | None:
    if kind == "approve" and wait.human == waits.APPROVAL:
        return wait.signals[0]
    if kind in ("approve", "reject") and wait.human == waits.DECISION:
        outcome = "approved" if kind == "approve" else "rejected"
        return next(name for name, result in wait.decision.items() if result == outcome)
    if kind == "input" and wait.human == waits.INPUT:
        return wait.signals[0]
    return None


_REPLY_NOUN = {"approve": "an approval", "reject": "a rejection", "input": "input"}


def reply(run_id: int, kind: str, data: Any = None, *, signal: str | None = None,
          sent_by: str = "", dedupe_key: str | None = None,
          step_index: int | None = None, transitions: int | None = None) -> SignalReceipt:
    """Answer the human wait run ``run_id`` is parked at: ``approve``, ``reject`` or ``input``.

    Unlike :func:`send_signal`, a reply is accepted only while the run waits for it: a second
    approval of an answered wait raises :class:`AlreadyAnswered`. ``approve`` satisfies both
    ``wait_for_approval()`` and ``wait_for_decision()``. ``step_index``/``transitions`` pin the
    reply to one wait instance (approval links use them).
    """
    if kind not in _REPLY_NOUN:
        raise ValueError(f"Unknown reply kind {kind!r}; use approve, reject or input.")
    data = _signal_data(run_id, signal or kind, data)
    with transaction.atomic():
        run, spec = _lock_for_signal(run_id, finished_ok=True)
        step = spec.steps[run.current_step] if run.current_step < len(spec.steps) else None
        name = None
        if run.status == RunStatus.WAITING_FOR_SIGNAL and step is not None and step.wait:
            name = _reply_signal(step.wait, kind)
            if signal is not None and signal != name:
                name = None  # a reply of this kind cannot send another signal
        pinned = (step_index is None or step_index == run.current_step) and (
            transitions is None or transitions == run.transitions)
        if name is None or not pinned:
            answered = Signal.objects.filter(
                run_id=run_id, consumed_at__isnull=False,
                name__in=[n for s in spec.steps if s.wait and s.wait.human for n in s.wait.signals],
            ).exists()
            where = (f"waiting at step {step.name!r}" if run.status ==
                     RunStatus.WAITING_FOR_SIGNAL else f"{run.status} at step "
                     f"{step.name!r}" if step else run.status)
            if answered or not pinned:
                raise exceptions.AlreadyAnswered(
                    run_id, f"Run {run_id} is not waiting for {_REPLY_NOUN[kind]} any more: "
                            f"the wait was already answered (the run is {where}).")
            raise exceptions.RunNotWaiting(
                run_id, f"Run {run_id} is not waiting for {_REPLY_NOUN[kind]} (it is {where}); "
                        "a reply is accepted only while the run waits for one.")
        return _deliver(run, spec, name, data, sent_by=sent_by, dedupe_key=dedupe_key)


def wait_info(run: WorkflowRun, spec: WorkflowSpec) -> dict[str, Any]:
    """Return ``wait_type``, ``waiting_for``, ``wait_mode`` and ``wait_details`` of a run."""
    empty = {"wait_type": None, "waiting_for": None, "wait_mode": None, "wait_details": None}
    if run.status not in (RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS) or \
            run.current_step >= len(spec.steps):
        return empty
    step = spec.steps[run.current_step]
    if step.kind == "child" and run.status == RunStatus.WAITING_FOR_WORKFLOWS:
        child = (WorkflowRun.objects.filter(parent_id=run.pk, parent_step=run.current_step)
                 .order_by("-pk").values_list("pk", "status").first())
        ids = [str(child[0])] if child else []
        done = child is not None and child[1] in FINISHED
        return {"wait_type": "workflow", "waiting_for": ids, "wait_mode": "all",
                "wait_details": {"step_name": step.name, "matched": ids if done else [],
                                 "remaining": [] if done else ids, "wait_mode": "all"}}
    if step.kind == "wait_workflows" and run.status == RunStatus.WAITING_FOR_WORKFLOWS:
        wait_on = step.workflows
        try:
            ids, result = _workflow_wait(spec, run.pk, run.current_step, run.state,
                                         run.groups, lock=False)
        except exceptions.InvalidStepOutput:
            ids, result = [], None
        details = {"step_name": step.name, "wait_mode": wait_on.mode, "quorum": wait_on.quorum,
                   "group_key": wait_on.group, "state_key": wait_on.state_key,
                   "result_key": wait_on.result_key,
                   **({} if result is None else {k: [str(i) for i in v]
                                                 for k, v in result.details.items()})}
        return {"wait_type": "workflow", "waiting_for": [str(i) for i in ids],
                "wait_mode": wait_on.mode,
                "wait_details": {k: v for k, v in details.items() if v is not None}}
    if step.wait is None:
        return empty
    wait = step.wait
    stored = list(Signal.objects.filter(
        run_id=run.pk, consumed_at__isnull=True, name__in=wait.signals,
    ).order_by("pk").values_list("pk", "name", "payload"))
    progress = waits.evaluate(wait, stored, run.state)
    details: dict[str, Any] = {
        "step_name": step.name, "result_key": wait.result_key, "human_wait": wait.human,
        "match_payload": wait.match_payload or {}, "matched": progress.matched,
        "remaining": progress.remaining, "correlation_key": wait.correlation_key,
        "correlation_value": run.state.get(wait.correlation_key)
        if wait.correlation_key else None,
        "wait_mode": wait.mode, "schema": wait.schema,
    }
    return {"wait_type": "signal", "waiting_for": list(wait.signals), "wait_mode": wait.mode,
            "wait_details": {k: v for k, v in details.items() if v is not None}}


# -- queries ----------------------------------------------------------------------------------

def _status_of(run: WorkflowRun) -> WorkflowStatus:
    try:
        spec = load_spec(run.definition_id)
    except exceptions.WorkflowDefinitionError:
        return _status_unloadable(run)
    finished = run.current_step >= len(spec.steps)
    return WorkflowStatus(
        id=run.pk, name=run.name, status=run.status, current_step=run.current_step,
        total_steps=run.total_steps,
        current_step_name=None if finished else spec.steps[run.current_step].name,
        state=run.state, error=run.error, definition_hash=spec.definition_hash,
        definition_version=spec.version, idempotency_key=run.idempotency_key,
        budget=budgets.summary(spec.budget, budgets.Usage(
            run.transitions, run.cost_units, run.started_workflows,
            budgets.state_bytes(run.state))),
        retry_policy=None if finished or spec.steps[run.current_step].kind != "task"
        else effective_policy(spec, run.current_step).describe(),
        **wait_info(run, spec),
        created_at=run.created_at, updated_at=run.updated_at, finished_at=run.finished_at,
    )


def _status_unloadable(run: WorkflowRun) -> WorkflowStatus:
    """The status of a run whose definition this process cannot load (a deploy removed a
    class its retry policies name, say): what the rows say, without step details."""
    stored = WorkflowDefinition.objects.values("definition", "definition_hash").get(
        pk=run.definition_id)
    steps = stored["definition"].get("steps") or []
    return WorkflowStatus(
        id=run.pk, name=run.name, status=run.status, current_step=run.current_step,
        total_steps=run.total_steps,
        current_step_name=steps[run.current_step].get("name")
        if run.current_step < len(steps) else None,
        state=run.state, error=run.error, definition_hash=stored["definition_hash"],
        definition_version=stored["definition"].get("version"),
        idempotency_key=run.idempotency_key, budget=None, retry_policy=None,
        wait_type=None, waiting_for=None, wait_mode=None, wait_details=None,
        created_at=run.created_at, updated_at=run.updated_at, finished_at=run.finished_at)


def workflow_status(run_id: int) -> WorkflowStatus:
    """Return the status of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
    """
    try:
        run = WorkflowRun.objects.get(pk=run_id)
    except (WorkflowRun.DoesNotExist, ValueError, TypeError):
        raise exceptions.RunNotFound(run_id) from None
    return _status_of(run)


def list_workflows(status: str | None = None, limit: int = 50) -> list[WorkflowStatus]:
    """Return the newest runs first, optionally only those with ``status``.

    Raises:
        ValueError: ``status`` is not a run status, or ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1 (got {limit}).")
    runs = WorkflowRun.objects.order_by("-pk")
    if status is not None:
        if status not in RunStatus.values:
            raise ValueError(
                f"Unknown status {status!r}; use one of {', '.join(RunStatus.values)}."
            )
        runs = runs.filter(status=status)
    return [_status_of(run) for run in runs[:limit]]
