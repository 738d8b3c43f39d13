"""Operating runs: cancel, pause, resume, retry, rewind, fork; compensation; deadlines; purges.

Each operation is one transaction with the run row locked, refuses a transition its status does
not allow with :class:`~queuety.exceptions.InvalidTransition`, and never creates a second live
row for a step (the original's resume could).

Compensations and cancel/deadline hooks are durable "cleanup" rows run by workers one after the
other, each with its own retries and timeline events: ``StepRun.kind`` is ``compensation`` or
``hook`` for them, and the run's ``cleanup`` field holds the queue and its position.
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from queuety import exceptions, services
from queuety.conf import settings
from queuety.core import budget as budgets
from queuety.core.definition import WorkflowSpec
from queuety.models import Event, RunStatus, StepRun, StepStatus, WorkflowRun
from queuety.publish import publish_on_commit

logger = logging.getLogger("queuety")

LIVE = (StepStatus.PENDING, StepStatus.PROCESSING)


def _locked(run_id: int, steps_first: bool = False) -> WorkflowRun:
    """Lock the run row; with ``steps_first``, its live step rows before it.

    A worker finishing a step locks its step row, then the run row: operations that also
    write live step rows take the locks in the same order, so the two cannot deadlock.
    """
    if steps_first:
        list(StepRun.objects.select_for_update().filter(run_id=run_id, kind="step",
                                                        status__in=LIVE).values_list("pk"))
    try:
        return WorkflowRun.objects.select_for_update().get(pk=run_id)
    except (WorkflowRun.DoesNotExist, ValueError, TypeError):
        raise exceptions.RunNotFound(run_id) from None


def _refuse(run: WorkflowRun, action: str, why: str) -> exceptions.InvalidTransition:
    return exceptions.InvalidTransition(run.pk, f"Cannot {action} workflow run {run.pk}: {why}.")


def _event(run: WorkflowRun, kind: str, actor: str, **data: Any) -> Event:
    return Event.objects.create(run_id=run.pk, kind=kind, data={"by": actor, **data})


def _stop_live_steps(run: WorkflowRun, now) -> None:
    # A processing attempt finds its row cancelled when it finishes and discards its outcome.
    StepRun.objects.filter(run_id=run.pk, kind="step", status__in=services.LIVE_OR_HELD
                           ).update(status=StepStatus.CANCELLED, finished_at=now)


def _retry_deadlocks(operation):
    """Run ``operation`` again (up to 3 times) when PostgreSQL aborts it to break a deadlock.

    A cancel locks a tree of runs parent first, while a woken waiter locks itself and then
    reads the runs it waits for: when they cross, PostgreSQL aborts one. Only the outermost
    call retries: inside a transaction the error must reach whoever owns it.
    """
    @functools.wraps(operation)
    def retrying(*args, **kwargs):
        for attempt in range(3):
            try:
                return operation(*args, **kwargs)
            except OperationalError as error:
                deadlock = services.sqlstate_of(error) == "40P01"
                if not deadlock or attempt == 2 or connection.in_atomic_block:
                    raise
                logger.warning("%s(%r) hit a deadlock; running it again.",
                               operation.__name__, args)
    return retrying


@_retry_deadlocks
def cancel(run_id: int, *, actor: str = "") -> None:
    """Cancel a run: stop its steps, then run compensations and ``on_cancel`` (durably).

    Raises:
        InvalidTransition: the run is already completed or cancelled.
    """
    now = timezone.now()
    with transaction.atomic():
        run = _locked(run_id, steps_first=True)
        if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
            raise _refuse(run, "cancel", f"it is already {run.status}")
        spec = services.load_spec(run.definition_id)
        previous = run.status
        _stop_live_steps(run, now)
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.CANCELLED, finished_at=now, updated_at=now,
            revision=F("revision") + 1)
        _event(run, "workflow_cancelled", actor, previous_status=previous)
        if not (run.cleanup and run.cleanup.get("cause") == "failure"):
            start_cleanup(run, spec, "cancel", now)
        # Children, and runs it started, go with their parent (parent row locked before the
        # child's, as always).
        for child in WorkflowRun.objects.filter(Q(parent_id=run.pk) | Q(started_by_id=run.pk)
                                                ).exclude(status__in=services.FINISHED
                                                          ).values_list("pk", flat=True):
            cancel(child, actor=f"parent run {run.pk}")
        services.notify_finished(run.pk)
    logger.info("Run id=%s cancelled by %s", run_id, actor or "-")


def pause(run_id: int, *, actor: str = "") -> None:
    """Pause a running or waiting run: a step in flight finishes, nothing new starts.

    Raises:
        InvalidTransition: the run is not running or waiting.
    """
    with transaction.atomic():
        run = _locked(run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL):
            raise _refuse(run, "pause", f"it is {run.status}, not running or waiting")
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.PAUSED, updated_at=timezone.now(), revision=F("revision") + 1)
        _event(run, "workflow_paused", actor, previous_status=run.status)


def resume(run_id: int, *, actor: str = "") -> str:
    """Resume a paused run where it stands; return its new status.

    Its current step's existing row is published again (never duplicated); a wait is evaluated
    against the signals stored meanwhile, so it may settle at once.

    Raises:
        InvalidTransition: the run is not paused.
    """
    now = timezone.now()
    with transaction.atomic():
        run = _locked(run_id)
        if run.status != RunStatus.PAUSED:
            raise _refuse(run, "resume", f"it is {run.status}, not paused")
        spec = services.load_spec(run.definition_id)
        _event(run, "workflow_resumed", actor)
        return _continue(run, spec, now)


def _continue(run: WorkflowRun, spec: WorkflowSpec, now, paused: bool = False) -> str:
    """Put a (locked) run back to work at its current step; return its status.

    With ``paused`` it only gets ready: its next row is created unpublished, for ``resume()``.
    """
    if run.current_step >= len(spec.steps):
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.COMPLETED, finished_at=run.finished_at or now, updated_at=now,
            revision=F("revision") + 1)
        return RunStatus.COMPLETED
    step = spec.steps[run.current_step]
    live = list(StepRun.objects.filter(run_id=run.pk, kind="step",
                                       status__in=services.LIVE_OR_HELD)
                .values_list("pk", "status", "seq"))
    if step.kind in ("task", "delay", "parallel", "for_each") and live:
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.RUNNING, updated_at=now, revision=F("revision") + 1)
        pending = [pk for pk, status, _ in live if status == StepStatus.PENDING]
        if pending:
            StepRun.objects.filter(pk__in=pending).update(available_at=now, published_at=now)
            publish_on_commit([services._message(spec, pk, run.current_step) for pk in pending])
        if step.fanout is not None:  # slots freed while paused go to held rows now
            services._release_held(spec, run.pk, live[0][2], run.current_step, now)
        return RunStatus.RUNNING
    usage = budgets.Usage(run.transitions, run.cost_units, run.started_workflows)
    return services._land(spec, run.pk, run.current_step, run.state, usage, now, [],
                          fail_on_breach=True, paused=paused)


def retry(run_id: int, *, actor: str = "") -> None:
    """Run a failed run again from its failed step, keeping what earlier steps merged.

    The failed step gets a fresh attempt budget on its own row (no new row). Budgets are not
    reset: a run failed by a budget fails again unless the budget was the problem's cause. A
    run failed by its deadline gets a fresh deadline window.

    Raises:
        InvalidTransition: the run is not failed, or its compensations already ran.
    """
    now = timezone.now()
    with transaction.atomic():
        run = _locked(run_id)
        if run.status != RunStatus.FAILED:
            raise _refuse(run, "retry", f"it is {run.status}, not failed")
        if run.cleanup:
            raise _refuse(run, "retry", "its compensations already ran")
        spec = services.load_spec(run.definition_id)
        # The row of this visit of the step: failed, or cancelled when a deadline struck.
        latest = (StepRun.objects.filter(run_id=run.pk, kind="step", seq=run.transitions,
                                         step_index=run.current_step)
                  .exclude(status=StepStatus.COMPLETED).order_by("-pk").first())
        _event(run, "workflow_retried", actor, error=run.error)
        deadline = run.deadline_at
        if deadline is not None and deadline <= now and spec.deadline_seconds:
            deadline = now + timedelta(seconds=spec.deadline_seconds)
        WorkflowRun.objects.filter(pk=run.pk).update(
            status=RunStatus.PAUSED, error=None, finished_at=None, updated_at=now,
            deadline_at=deadline, revision=F("revision") + 1)
        kind = spec.steps[run.current_step].kind
        if kind in ("parallel", "for_each"):
            # Only the branches or items that did not succeed run again.
            redo = list(StepRun.objects.filter(run_id=run.pk, kind="step", seq=run.transitions,
                                               step_index=run.current_step)
                        .exclude(status=StepStatus.COMPLETED))
        else:
            redo = [latest] if latest is not None and kind in ("task", "delay") else []
        policy = services.effective_policy(spec, run.current_step)
        fanout = spec.steps[run.current_step].fanout
        limit = len(redo) if fanout is None or fanout.max_concurrency is None \
            else fanout.max_concurrency
        for position, row in enumerate(sorted(redo, key=lambda r: r.branch)):
            # A fresh budget: attempts count on from the row's current number, so an old,
            # abandoned attempt can never match the new one's guard. Beyond the fan-out's
            # max_concurrency, rows wait held for a free slot.
            StepRun.objects.filter(pk=row.pk).update(
                status=StepStatus.PENDING if position < limit else StepStatus.HELD,
                error=None, finished_at=None, claimed_at=None,
                heartbeat_at=None, available_at=now, published_at=now,
                max_attempts=row.attempt + policy.max_attempts)
        run.refresh_from_db()
        _continue(run, spec, now)


def rewind(run_id: int, step: int | str, *, actor: str = "") -> None:
    """Go back to just after step ``step`` completed: its recorded state, the next step next.

    Raises:
        InvalidTransition: the run is cancelled.
        LookupError: the step never completed in this run.
    """
    from queuety import history

    now = timezone.now()
    with transaction.atomic():
        run = _locked(run_id, steps_first=True)
        if run.status == RunStatus.CANCELLED:
            raise _refuse(run, "rewind", "it is cancelled")
        if run.cleanup:
            raise _refuse(run, "rewind", "its compensations already ran")
        spec = services.load_spec(run.definition_id)
        index = step if isinstance(step, int) else spec.index_of(step)
        state = history.state_at(run.pk, index)
        was_paused = run.status == RunStatus.PAUSED
        _stop_live_steps(run, now)
        target = index + 1
        Event.objects.create(run_id=run.pk, kind="workflow_rewound", step_index=index,
                             step_name=spec.steps[index].name,
                             data={"by": actor, "state": state, "to_step": target})
        WorkflowRun.objects.filter(pk=run.pk).update(
            state=state, current_step=target, status=RunStatus.PAUSED, error=None,
            finished_at=None, transitions=F("transitions") + 1, updated_at=now,
            revision=F("revision") + 1)
        run.refresh_from_db()
        _continue(run, spec, now, paused=was_paused)


def fork(run_id: int, *, actor: str = "") -> int:
    """Start a new run of the same definition from this run's current state and step."""
    now = timezone.now()
    with transaction.atomic():
        source = _locked(run_id)
        spec = services.load_spec(source.definition_id)
        run = WorkflowRun.objects.create(
            definition_id=source.definition_id, name=source.name, state=source.state,
            total_steps=source.total_steps, current_step=source.current_step,
            status=RunStatus.PAUSED, transitions=source.transitions,
            cost_units=source.cost_units, started_workflows=source.started_workflows,
            groups=source.groups,
            deadline_at=source.deadline_at)
        Event.objects.create(run_id=run.pk, kind="workflow_forked",
                             data={"by": actor, "from_run": source.pk, "state": source.state})
        _event(source, "workflow_forked_to", actor, to_run=run.pk)
        _continue(run, spec, now)
    return run.pk


# -- cleanup: compensations and hooks -----------------------------------------------------------

def start_cleanup(run: WorkflowRun, spec: WorkflowSpec, cause: str, now) -> None:
    """Queue the compensations of completed steps (newest first) and the run's hook."""
    from queuety import history

    if run.cleanup:
        return  # at most once per run
    after = history.states_after_steps(run.pk)
    completions = (Event.objects.filter(run_id=run.pk, kind__in=history.MERGES)
                   .order_by("-pk").values_list("step_index", flat=True))
    queue: list[dict[str, Any]] = []
    if cause == "cancel" or spec.compensate_on_failure:
        # Newest completion first, each step at most once (a loop completes a step again).
        for index in dict.fromkeys(completions):
            step = spec.steps[index]
            if step.compensation:
                queue.append({"kind": "compensation", "step_index": index,
                              "step_name": f"compensate:{step.name}",
                              "handler": step.compensation, "state": after.get(index, {})})
    hook = spec.on_cancel if cause == "cancel" else spec.on_deadline if cause == "deadline" \
        else None
    if hook:
        queue.append({"kind": "hook", "step_index": run.current_step,
                      "step_name": f"on_{cause}", "handler": hook, "state": run.state})
    if not queue:
        return
    WorkflowRun.objects.filter(pk=run.pk).update(cleanup={"cause": cause, "queue": queue,
                                                          "next": 1})
    _cleanup_row(run.pk, spec, queue, 0, now)


def _cleanup_row(run_id: int, spec: WorkflowSpec, queue: list[dict[str, Any]], position: int,
                 now) -> None:
    item = queue[position]
    row = StepRun.objects.create(
        run_id=run_id, kind=item["kind"], seq=position, step_index=item["step_index"],
        step_name=item["step_name"], handler=item["handler"], input=item["state"],
        max_attempts=cleanup_policy(spec, item["handler"]).max_attempts,
        available_at=now, published_at=now)
    publish_on_commit([services.Message(row.pk, None, None, spec.queue)])


def cleanup_policy(spec: WorkflowSpec, handler: str):
    """Retry policy of a compensation or hook: the handler class's, the workflow's, the
    global default (also when the handler no longer imports: its failure is then recorded)."""
    from queuety.core.imports import import_path

    try:
        own = getattr(import_path(handler), "retry", None)
    except ImportError:
        own = None
    return own or spec.retry or settings.DEFAULT_RETRY


def cleanup_done(run_id: int, spec: WorkflowSpec, now) -> None:
    """Called in the transaction that finished a cleanup row: start the next one, if any."""
    run = WorkflowRun.objects.select_for_update().only("cleanup").get(pk=run_id)
    plan = run.cleanup or {}
    position = plan.get("next", 0)
    if position >= len(plan.get("queue", [])):
        Event.objects.create(run_id=run_id, kind="cleanup_finished",
                             data={"cause": plan.get("cause")})
        return
    WorkflowRun.objects.filter(pk=run_id).update(cleanup={**plan, "next": position + 1})
    _cleanup_row(run_id, spec, plan["queue"], position, now)


# -- deadlines and retention (run by the sweeper) ---------------------------------------------

def fail_overdue(now=None) -> int:
    """Fail runs past their deadline, waiting and paused ones included; return how many."""
    now = now or timezone.now()
    overdue = list(WorkflowRun.objects.filter(
        deadline_at__lte=now, status__in=(RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL,
                                          RunStatus.WAITING_FOR_WORKFLOWS, RunStatus.PAUSED),
    ).values_list("pk", flat=True)[:200])
    for run_id in overdue:
        with transaction.atomic():
            run = _locked(run_id, steps_first=True)
            if run.status in services.FINISHED or run.deadline_at is None or \
                    run.deadline_at > now:
                continue
            spec = services.load_spec(run.definition_id)
            error = {"type": "queuety.exceptions.DeadlineExceeded",
                     "message": f"Run {run.pk} of workflow {run.name!r} missed its deadline "
                                f"of {run.deadline_at.isoformat()} (must complete within "
                                f"{spec.deadline_seconds:g}s).",
                     "step": spec.steps[run.current_step].name
                     if run.current_step < len(spec.steps) else None,
                     "step_index": run.current_step, "attempt": None, "max_attempts": None}
            _stop_live_steps(run, now)
            WorkflowRun.objects.filter(pk=run.pk).update(
                status=RunStatus.FAILED, error=error, finished_at=now, updated_at=now,
                revision=F("revision") + 1)
            Event.objects.create(run_id=run.pk, kind="workflow_deadline_exceeded",
                                 data={"error": error, "previous_status": run.status})
            services.notify_finished(run.pk)
            start_cleanup(run, spec, "deadline", now)
    return len(overdue)


def purge_finished(now=None, batch: int = 500) -> int:
    """Delete finished runs older than ``QUEUETY["RETENTION_DAYS"]`` (one batch); return how
    many. Their steps, events and signals go with them; dispatch keys stay."""
    days = settings.RETENTION_DAYS
    if days is None:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    ids = list(WorkflowRun.objects.filter(status__in=services.FINISHED, finished_at__lt=cutoff)
               .order_by("pk").values_list("pk", flat=True)[:batch])
    if ids:
        WorkflowRun.objects.filter(pk__in=ids).delete()
    return len(ids)


def overview() -> dict[str, Any]:
    """Counts of runs per status and the age of the oldest due pending step (``status``)."""
    from django.db.models import Count, Min

    counts = dict(WorkflowRun.objects.values_list("status").annotate(n=Count("pk"))
                  .values_list("status", "n"))
    oldest = StepRun.objects.filter(status=StepStatus.PENDING,
                                    available_at__lte=timezone.now()).aggregate(
        oldest=Min("available_at"))["oldest"]
    age = None if oldest is None else round((timezone.now() - oldest).total_seconds(), 3)
    return {"runs": {status: counts.get(status, 0) for status in RunStatus.values},
            "oldest_pending_step_age_seconds": age}
