"""Joins: a fan-out settling as its branches finish, and a run woken because the runs it
waits for (its child, or the runs a ``wait_for_workflows`` names) finished.

Both decide under the waiting run's row lock, so concurrent finishes settle a join once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.db import transaction
from django.utils import timezone

from queuety import exceptions
from queuety.core import budget as budgets
from queuety.core import engine, fanout, flow, landing
from queuety.core.definition import FanOutStep, WaitWorkflowsStep, WorkflowSpec
from queuety.core.landing import RunView
from queuety.core.status import FINISHED, LIVE_OR_HELD
from queuety.core.transition import transition
from queuety.models import Event, RunStatus, StepRun, StepStatus, WorkflowRun
from queuety.runtime import artifacts
from queuety.runtime.claim import Claim, mark_completed
from queuety.runtime.finish import check_attempts, fail_at_wait
from queuety.runtime.landing import land, release_held, start_child
from queuety.store import rows
from queuety.store.definitions import load_spec


def branch_done(held: Claim, spec: WorkflowSpec, output: Any, duration_ms: float, *,
                publish_artifacts: bool = False) -> None:
    """Record one branch or item; settle the join, under the run's row lock, when it can.

    ``publish_artifacts``: the attempt stored artifacts, made visible in this transaction
    once its row is completed and the join still open.
    """
    now = timezone.now()
    step = spec.step_of(held.step_index, FanOutStep)
    spread = step.fanout
    event = Event(run_id=held.run_id, step_run_id=held.step_run_id,
                  kind=flow.completed_kind(step),
                  step_index=held.step_index, step_name=step.name, attempt=held.attempt,
                  duration_ms=duration_ms, data={"output": output})
    with transaction.atomic():
        if not mark_completed(held, output, now):
            event.kind, event.data["reason"] = "step_discarded", "no longer owned its row"
            event.save()
            return
        run = rows.lock_run(held.run_id, fields=rows.RUN_VIEW_FIELDS)
        if run.status not in (RunStatus.RUNNING, RunStatus.PAUSED) or \
                run.current_step != held.step_index:
            event.kind, event.data["reason"] = "step_discarded", "the join had settled"
            event.save()
            return
        if publish_artifacts:
            artifacts.publish(held)
        # Counting is enough until the join settles; only then are the outputs read.
        total, succeeded, failed = rows.fanout_counts(held.run_id, held.seq, held.step_index)
        verdict = fanout.progress(flow.join_mode(step), spread.quorum, total, succeeded,
                                  failed)
        if verdict != fanout.SATISFIED:
            event.save()
            if run.status == RunStatus.RUNNING:
                release_held(spec, held.run_id, held.seq, held.step_index, now)
            return
        branches = rows.fanout_rows(held.run_id, held.seq, held.step_index)
        settle(spec, run, held.step_index, held.seq, branches, [event], now)


def settle(spec: WorkflowSpec, run: WorkflowRun, index: int, seq: int,
           branches: list[dict[str, Any]], events: list[Event], now: datetime) -> None:
    """Settle a fan-out step: cancel the rows still live, merge, count one transition.

    Raises:
        BudgetExceeded: the merge breaches the run's budget (the caller's transaction rolls
            back; the branch's attempt is then recorded as failed, which fails the run).
    """
    step = spec.step_of(index, FanOutStep)
    cancelled = StepRun.objects.filter(
        run_id=run.pk, kind="step", seq=seq, step_index=index, status__in=LIVE_OR_HELD,
    ).update(status=StepStatus.CANCELLED, finished_at=now)
    output = flow.join_output(step, run.state, branches, run_id=run.pk)
    succeeded = sum(r["status"] == StepStatus.COMPLETED for r in branches)
    view = rows.run_view(run, now)
    moved = transition(spec, run.pk, view.state, view.writes, view.usage, output,
                       cost=flow.join_cost(step, succeeded)).checked()
    events.append(Event(run_id=run.pk, kind="step_completed", step_index=index,
                        step_name=step.name, data={"output": output, "cancelled": cancelled,
                                                   **moved.event_data}))
    land(spec, view.after(moved), spec.next_index(index), events, landing.mode_of(run.status))


def resume_waiting(run_id: int) -> str | None:
    """Move on a run parked waiting for other runs, if what it waits for has finished.

    Covers ``run_workflow`` steps (the child finished: merge it, fail, or restart it by the
    step's policy) and ``wait_for_workflows`` steps (settle, fail, or keep waiting).
    Idempotent; called when an awaited run finishes and by the sweeper. Returns the status.
    """
    now = timezone.now()
    with transaction.atomic():
        try:
            run = rows.lock_run(run_id)
        except exceptions.RunNotFound:
            return None
        if run.status != RunStatus.WAITING_FOR_WORKFLOWS:
            return None
        spec = load_spec(run.definition_id)
        index = run.current_step
        view = rows.run_view(run, now)
        if isinstance(spec.steps[index], WaitWorkflowsStep):
            return _move_on(spec, run, view, index, [])
        return _child_finished(spec, run, view, index)


def _move_on(spec: WorkflowSpec, run: WorkflowRun, view: RunView, target: int | None,
             events: list[Event]) -> str:
    """Land a run woken at its wait on ``target`` (``view``: its state and counters to land
    with); a step there that cannot be done (a budget breach, items that are not a list, ...)
    fails the run at the wait, state kept as it was.

    Without this, the error would leave the run parked, and every sweep would hit it again.
    """
    now = view.now
    try:
        with transaction.atomic():
            return land(spec, view, target, list(events))
    except (exceptions.BudgetExceeded, exceptions.WorkflowDefinitionError) as error:
        index = run.current_step
        return fail_at_wait(spec, run.pk, index, run.state, rows.usage_of(run), now, events,
                            flow.failure_record(error, step=spec.steps[index].name,
                                                step_index=index, attempt=None,
                                                max_attempts=None))


def _child_finished(spec: WorkflowSpec, parent: WorkflowRun, view: RunView, index: int) -> str:
    step, usage, now = spec.steps[index], view.usage, view.now
    child = (WorkflowRun.objects.filter(parent_id=parent.pk, parent_step=index)
             .order_by("-pk").first())
    if child is None or child.status not in FINISHED:
        return parent.status
    events = [Event(run_id=parent.pk, kind="child_finished", step_index=index,
                    step_name=step.name,
                    data={"child_run": child.pk, "status": child.status,
                          "attempt": child.parent_attempt})]
    if child.status != RunStatus.COMPLETED:
        return _child_failed(spec, parent, index, child, usage, now, events)
    output = engine.public(child.state)
    # The child started with this run's state: only the keys it added or changed count as
    # written here, or merging it back would make the dispatch payload's keys prunable.
    changed = {k: v for k, v in output.items()
               if k not in parent.state or parent.state[k] != v}
    moved = transition(spec, parent.pk, view.state, view.writes, usage, output, written=changed)
    events[0].data.update(output=output, **moved.event_data)
    if moved.breach is not None:
        return fail_at_wait(spec, parent.pk, index, parent.state, moved.usage, now, events,
                            flow.failure_record(moved.breach, step=step.name, step_index=index,
                                                attempt=None, max_attempts=None))
    return _move_on(spec, parent, view.after(moved), spec.next_index(index), events)


def _child_failed(spec: WorkflowSpec, parent: WorkflowRun, index: int, child: WorkflowRun,
                  usage: budgets.Usage, now: datetime, events: list[Event]) -> str:
    """Start a failed child again by its step's policy, or fail the parent at the step."""
    step = spec.steps[index]
    reason = (child.error or {}).get("message") or f"it was {child.status}"
    failure: exceptions.QueuetyError = exceptions.ChildRunFailed(
        f"Child run {child.pk} ({child.name!r}) of step {step.name!r} of run {parent.pk} "
        f"{child.status} (attempt {child.parent_attempt}): {reason}")
    cause = child.error or {}
    if cause.get("budget") == "max_step_attempts":  # an ancestor's cap, maybe this run's
        failure = exceptions.BudgetExceeded(
            "max_step_attempts", cast(int, cause.get("limit")), cast(int, cause.get("used")),
            parent.pk,
            spec.name, message=f"Child run {child.pk} of step {step.name!r} of run "
                               f"{parent.pk} failed: {cause.get('message')}")
    delay = None if isinstance(failure, exceptions.BudgetExceeded) else \
        flow.child_restart_delay(step, child.status, child.error, child.parent_attempt, failure)
    if delay is not None:
        try:
            check_attempts(parent.pk, step.name, failure)
        except exceptions.BudgetExceeded as breach:
            failure = breach
        else:
            restarted = start_child(spec, parent.pk, index, parent.state, now,
                                    attempt=child.parent_attempt + 1, delay=delay)
            events.append(Event(run_id=parent.pk, kind="child_retried", step_index=index,
                                step_name=step.name, data={
                                    "error": engine.describe_error(failure, False),
                                    "child_run": restarted, "retry_in": round(delay, 6),
                                    "attempt": child.parent_attempt + 1}))
            Event.objects.bulk_create(events)
            return parent.status
    return fail_at_wait(spec, parent.pk, index, parent.state, usage, now, events,
                        flow.failure_record(
                            failure, step=step.name, step_index=index,
                            attempt=child.parent_attempt,
                            max_attempts=None if step.retry is None else step.retry.max_attempts,
                            child_run=child.pk))
