"""Moving a run onto its next step, in the transaction that decided it.

:func:`land` is the interpreter of the steps that need no worker: signal waits settle from
stored signals, workflow waits from the awaited runs' statuses, ``start`` steps create their
runs, ``repeat`` steps loop, empty ``for_each`` steps settle. The run then parks at the first
unsatisfied wait (no worker, no message), starts a child run, or gets its next task row(s)
and message(s). The rules themselves are pure (``queuety.core.flow``, ``waits``,
``dependencies``); this module reads and writes the rows around them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F

from queuety import exceptions, publish, signals, tracing
from queuety.conf import settings
from queuety.core import budget as budgets
from queuety.core import dependencies, engine, fanout, flow, pruning, waits
from queuety.core.definition import WorkflowSpec
from queuety.models import (
    Event,
    RunStatus,
    Signal,
    StepRun,
    StepStatus,
    WorkflowDependency,
    WorkflowRun,
)
from queuety.runtime import gates
from queuety.runtime.finish import fail_at_wait, notify_finished
from queuety.store import rows
from queuety.store.definitions import definition_id, effective_policy

#: Step kinds :func:`land` does in the transaction, with no worker.
_DONE_HERE = ("wait", "for_each", "repeat", "start", "wait_workflows")


def begin(spec: WorkflowSpec, run: WorkflowRun, state: dict[str, Any], now: datetime,
          extra: dict[str, Any], delay: float | None = None) -> None:
    """Start a just-created run on its first step (in the creating transaction).

    With ``delay``, a first task step becomes due that many seconds from ``now``.
    """
    started = Event(run=run, kind="workflow_started", data={
        "definition_hash": spec.definition_hash, "version": spec.version, "state": state,
        **extra})
    signals.emit("run_started", run_id=run.pk, workflow=spec.name, version=spec.version)
    if spec.steps[0].kind == "task":
        if delay:
            due = now + timedelta(seconds=delay)
            on_broker = delay <= settings.MAX_ETA
            step_run = rows.new_step_run(run.pk, spec, 0, seq=0, now=due, published=on_broker)
            started.save()
            if on_broker:
                publish.publish_on_commit([publish.message_for(spec, step_run.pk, 0, delay)])
            return
        step_run = rows.new_step_run(run.pk, spec, 0, seq=0, now=now)
        started.save()
        gates.publish_landed(spec, step_run.pk, 0, run.pk, state)
    else:
        land(spec, run.pk, 0, state, budgets.Usage(), now, [started])


def create_run(spec: WorkflowSpec, state: dict[str, Any], now: datetime, extra: dict[str, Any],
               delay: float | None = None, **links: Any) -> int:
    """Create and start a run of ``spec`` linked to the run that makes it (same transaction)."""
    run = WorkflowRun.objects.create(
        definition_id=definition_id(spec), name=spec.name, state=state,
        total_steps=len(spec.steps), status=RunStatus.RUNNING,
        trace_context=tracing.current_context(),
        deadline_at=None if spec.deadline_seconds is None
        else now + timedelta(seconds=spec.deadline_seconds), **links)
    begin(spec, run, state, now, extra, delay)
    return run.pk


def start_child(spec: WorkflowSpec, parent_id: int, index: int, state: dict[str, Any],
                now: datetime, attempt: int = 1, delay: float | None = None) -> int:
    """Create and start the child run of step ``index`` (in the parent's transaction)."""
    child = spec.steps[index].child
    assert child is not None, f"step {spec.steps[index].name!r} has no child workflow"
    return create_run(WorkflowSpec.from_dict(child), state, now,
                      {"parent_run": parent_id, "parent_attempt": attempt}, delay,
                      parent_id=parent_id, parent_step=index, parent_attempt=attempt)


def _start_runs(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                usage: budgets.Usage, now: datetime
                ) -> tuple[dict[str, Any], budgets.Usage, list[int]]:
    """Start the runs of the ``start_workflows`` step ``index`` (in this run's transaction).

    Returns the state with their ids merged, the usage with them counted, and the ids.

    Raises:
        BudgetExceeded: they would pass ``max_started_workflows``; none is created.
        InvalidStepOutput: the items are not a list.
    """
    step = spec.steps[index]
    start, child = step.start, step.child
    assert start is not None and child is not None, f"step {step.name!r} starts no runs"
    payloads = dependencies.child_payloads(start, step.name, state)
    limit = spec.budget.max_started_workflows
    if limit is not None and usage.started_workflows + len(payloads) > limit:
        raise exceptions.BudgetExceeded(
            "max_started_workflows", limit, usage.started_workflows + len(payloads), run_id,
            spec.name,
            message=f"Start step {step.name!r} of run {run_id} would start {len(payloads)} "
                    f"runs after {usage.started_workflows}, over its max_started_workflows "
                    f"budget of {limit}; none was started.")
    started = WorkflowSpec.from_dict(child)
    ids = [create_run(started, payload, now, {"started_by": run_id}, started_by_id=run_id,
                      started_by_step=index, group=start.group or "")
           for payload in payloads]
    return ({**state, start.result_key: ids},
            replace(usage, transitions=usage.transitions + 1,
                    started_workflows=usage.started_workflows + len(ids)), ids)


def workflow_wait(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                  groups: dict[str, list[int]], lock: bool = True
                  ) -> tuple[list[int], dependencies.WaitResult]:
    """Evaluate the workflow wait at ``index`` against the awaited runs as they are now.

    With ``lock`` on PostgreSQL, the awaited rows are read FOR SHARE, so no finish slips
    between the check and the parking (see ``queuety.store.sql.AWAITED_FOR_SHARE``).

    Raises:
        InvalidStepOutput: the state key that should name the runs does not.
    """
    wait = spec.steps[index].workflows
    assert wait is not None, f"step {spec.steps[index].name!r} is not a workflow wait"
    ids = dependencies.awaited_ids(wait, spec.steps[index].name, state, groups)
    found = {pk: (status, engine.public(data or {}))
             for pk, status, data in rows.awaited_runs(ids, lock=lock)}
    return ids, dependencies.evaluate(wait, ids, found)


def land(spec: WorkflowSpec, run_id: int, index: int | None, state: dict[str, Any],
         usage: budgets.Usage, now: datetime, events: list[Event], *,
         fail_on_breach: bool = True, paused: bool = False,
         writes: dict[str, int] | None = None) -> str:
    """Move a run (whose row this transaction has locked or created) onto step ``index``
    (``None``: past the last step, so the run completes). Writes the run row and ``events``;
    returns the run's status.

    A workflow wait that can no longer be satisfied fails the run. A wait whose settling
    would breach the budget fails the run there (``fail_on_breach``, the worker's path),
    keeping the state from before the wait; or raises. A paused run moves but stays paused:
    its next task row is created unpublished and a wait is not evaluated, until ``resume()``.

    For a workflow with ``prune_state_after``, ``writes`` is the run's ``state_writes`` as the
    caller left it (its transition already pruned; ``None``: read from the row), and each
    transition made here prunes too. A run parked at a wait with a timeout gets its
    ``wait_expires_at`` (kept when it was already parked at that wait, say after a signal
    that did not settle it, or paused there).

    Raises:
        BudgetExceeded: with ``fail_on_breach=False`` (a caller of ``signal()``), whose
            transaction then rolls back, so nothing is consumed or recorded.
    """
    status = RunStatus.PAUSED if paused else RunStatus.RUNNING
    expires_at: datetime | None = None
    if spec.prune_state_after is not None and writes is None:
        writes = dict(WorkflowRun.objects.values_list("state_writes", flat=True).get(pk=run_id))
    items: list[Any] | None = None
    loops: dict[str, int] | None = None
    groups: dict[str, list[int]] | None = None
    while not paused and index is not None and spec.steps[index].kind in _DONE_HERE:
        step = spec.steps[index]
        if step.kind in ("start", "wait_workflows") and groups is None:
            groups = dict(WorkflowRun.objects.values_list("groups", flat=True).get(pk=run_id))
        if step.kind == "start":
            assert step.start is not None and groups is not None
            state, usage, ids = _start_runs(spec, run_id, index, state, usage, now)
            state, writes, pruned = pruning.apply(spec.prune_state_after, state, writes,
                                                  {step.start.result_key: ids},
                                                  usage.transitions)
            flow.check_budget(spec, run_id, state, usage)
            if step.start.group:  # a start step entered again replaces its group
                groups[step.start.group] = ids
            events.append(Event(run_id=run_id, kind="workflows_started", step_index=index,
                                step_name=step.name, data={"runs": ids,
                                                           "group": step.start.group,
                                                           **pruning.event_data(pruned)}))
            index = spec.next_index(index)
            continue
        if step.kind == "repeat":
            assert step.repeat is not None
            if loops is None:
                loops = dict(WorkflowRun.objects.values_list("loops", flat=True).get(pk=run_id))
            again, loops = flow.repeat_decision(spec, run_id, index, state, loops)
            usage = replace(usage, transitions=usage.transitions + 1)
            state, writes, pruned = pruning.apply(spec.prune_state_after, state, writes, {},
                                                  usage.transitions)
            flow.check_budget(spec, run_id, state, usage)
            events.append(Event(run_id=run_id, kind="repeat_evaluated", step_index=index,
                                step_name=step.name, data={
                                    "again": again, "iterations": loops.get(str(index), 0),
                                    **pruning.event_data(pruned)}))
            index = spec.index_of(step.repeat["target"]) if again else spec.next_index(index)
            continue
        if step.kind == "for_each":
            items = flow.for_each_items(spec, run_id, step, state)
            if items:
                break
            # Nothing to fan out to: the join settles at once, as a transition.
            output = flow.join_output(step, state, [], run_id=run_id)
            usage = replace(usage, transitions=usage.transitions + 1)
            state, writes, pruned = pruning.apply(
                spec.prune_state_after, {**state, **engine.public(output)}, writes, output,
                usage.transitions)
            flow.check_budget(spec, run_id, state, usage)
            events.append(Event(run_id=run_id, kind="for_each_settled", step_index=index,
                                step_name=step.name, data={"output": output,
                                                           **pruning.event_data(pruned)}))
            index = spec.next_index(index)
            continue
        if step.kind == "wait_workflows":
            assert step.workflows is not None and groups is not None
            try:
                ids, found = workflow_wait(spec, run_id, index, state, groups)
            except exceptions.InvalidStepOutput as error:
                return fail_at_wait(spec, run_id, index, state, usage, now, events,
                                    flow.failure_record(error, step=step.name, step_index=index,
                                                        attempt=None, max_attempts=None))
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
                signals.emit("run_waiting", run_id=run_id, workflow=spec.name, step=step.name,
                             waiting_for=list(ids), kind="workflows")
                break
            if found.verdict == fanout.IMPOSSIBLE:
                failure = exceptions.WorkflowWaitFailed(
                    f"Workflow wait {step.name!r} of run {run_id} can no longer be satisfied "
                    f"(mode {step.workflows.mode!r}"
                    + (f", quorum {step.workflows.quorum}" if step.workflows.quorum else "")
                    + f"): runs {found.failed} failed, were cancelled or do not exist; "
                    f"completed {found.matched}, still running {found.remaining}.")
                return fail_at_wait(spec, run_id, index, state, usage, now, events,
                                    flow.failure_record(failure, step=step.name,
                                                        step_index=index, attempt=None,
                                                        max_attempts=None, **found.details))
            used: dict[str, Any] = {"workflows": found.matched}
            output = found.output or {}
        else:
            assert step.wait is not None
            stored = list(Signal.objects.filter(
                run_id=run_id, consumed_at__isnull=True, name__in=step.wait.signals,
            ).order_by("pk").values_list("pk", "name", "payload"))
            result = waits.evaluate(step.wait, stored, state)
            if not result.settled:
                status = RunStatus.WAITING_FOR_SIGNAL
                parked = _parked_here(spec, run_id, index, usage)
                expires_at = _wait_expiry(spec, index, now, parked)
                events.append(Event(run_id=run_id, kind="workflow_waiting", step_index=index,
                                    step_name=step.name, data={
                                        "waiting_for": list(step.wait.signals),
                                        "matched": result.matched, **({} if expires_at is None
                                        else {"expires_at": expires_at.isoformat()})}))
                if parked is None or parked[0] != RunStatus.WAITING_FOR_SIGNAL:
                    # Not for a signal that left the wait open: the run was waiting already.
                    signals.emit("run_waiting", run_id=run_id, workflow=spec.name,
                                 step=step.name, waiting_for=list(step.wait.signals),
                                 kind=step.wait.human or "signal")
                break
            output = result.output
            used = {"signals": [name for name, _ in result.chosen],
                    "signal_ids": result.consumed}
        settled_usage = replace(usage, transitions=usage.transitions + 1)
        settled_state, settled_writes, pruned = pruning.apply(
            spec.prune_state_after, {**state, **engine.public(output)}, writes, output,
            settled_usage.transitions)
        try:
            flow.check_budget(spec, run_id, settled_state, settled_usage)
        except exceptions.BudgetExceeded as breach:
            if not fail_on_breach:
                raise
            return fail_at_wait(spec, run_id, index, state, usage, now, events,
                                flow.failure_record(breach, step=step.name, step_index=index,
                                                    attempt=None, max_attempts=None))
        state, usage, writes = settled_state, settled_usage, settled_writes
        if step.kind == "wait_workflows":
            WorkflowDependency.objects.filter(run_id=run_id).delete()
        else:
            Signal.objects.filter(pk__in=used["signal_ids"]).update(
                consumed_at=now, consumed_by_step=step.name)
        events.append(Event(run_id=run_id, kind="wait_settled", step_index=index,
                            step_name=step.name, data={**used, "output": output,
                                                       **pruning.event_data(pruned)}))
        index = spec.next_index(index)
    if status == RunStatus.RUNNING and index is not None and spec.steps[index].kind == "child":
        status = RunStatus.WAITING_FOR_WORKFLOWS
    fields: dict[str, Any] = {
        "state": state, "transitions": usage.transitions, "cost_units": usage.cost_units,
        "started_workflows": usage.started_workflows,
        "revision": F("revision") + 1, "updated_at": now, "status": status,
        **({} if loops is None else {"loops": loops}),
        **({} if groups is None else {"groups": groups}),
        **({} if writes is None else {"state_writes": writes}),
        "wait_expires_at": expires_at if status == RunStatus.WAITING_FOR_SIGNAL
        else _paused_expiry(spec, run_id, index, status),
    }
    if index is None:
        fields.update(status=RunStatus.COMPLETED, current_step=len(spec.steps), finished_at=now)
        events.append(Event(run_id=run_id, kind="workflow_completed"))
        notify_finished(run_id)
        signals.emit("run_completed", run_id=run_id, workflow=spec.name, version=spec.version)
        WorkflowRun.objects.filter(pk=run_id).update(**fields)
        Event.objects.bulk_create(events)
        return RunStatus.COMPLETED
    fields["current_step"] = index
    WorkflowRun.objects.filter(pk=run_id).update(**fields)
    _enter(spec, run_id, index, status, state, usage, now, events, items)
    Event.objects.bulk_create(events)
    return status


def _timed_wait(spec: WorkflowSpec, index: int | None) -> float | None:
    """The timeout of the wait at ``index``, if it is one with a timeout."""
    if index is None or index >= len(spec.steps):
        return None
    wait = spec.steps[index].wait
    return None if wait is None or spec.steps[index].kind != "wait" else wait.timeout


def _parked_here(spec: WorkflowSpec, run_id: int, index: int, usage: budgets.Usage
                 ) -> tuple[str, datetime | None] | None:
    """The run's status and wait expiry when this is the visit it is already parked (or
    paused) at, at wait ``index``: a signal that did not settle the wait, or a resume. None
    when the run arrives at the wait by a transition (the row's count of transitions is
    behind ``usage``): a loop back to it, a timeout jumping to it, its first visit.

    Read only when it matters (a timed wait, or someone listening to ``run_waiting``)."""
    if _timed_wait(spec, index) is None and not signals.wanted("run_waiting"):
        return None
    status, current, transitions, expires_at = WorkflowRun.objects.values_list(
        "status", "current_step", "transitions", "wait_expires_at").get(pk=run_id)
    if current == index and transitions == usage.transitions and status in (
            RunStatus.WAITING_FOR_SIGNAL, RunStatus.PAUSED):
        return status, expires_at
    return None


def _wait_expiry(spec: WorkflowSpec, index: int, now: datetime,
                 parked: tuple[str, datetime | None] | None) -> datetime | None:
    """When the wait at ``index`` the run parks at expires: the expiry of the visit it is
    already parked at (``parked``), else ``now`` plus its timeout."""
    timeout = _timed_wait(spec, index)
    if timeout is None:
        return None
    if parked is not None and parked[1] is not None:
        return parked[1]
    return now + timedelta(seconds=timeout)


def _paused_expiry(spec: WorkflowSpec, run_id: int, index: int | None,
                   status: str) -> datetime | None:
    """A paused run keeps the expiry of the timed wait it is paused at (resume parks it
    there again, and a timeout that passed meanwhile then fires); any other run has none."""
    if status != RunStatus.PAUSED or _timed_wait(spec, index) is None:
        return None
    return WorkflowRun.objects.values_list("wait_expires_at", flat=True).get(pk=run_id)


def _enter(spec: WorkflowSpec, run_id: int, index: int, status: str, state: dict[str, Any],
           usage: budgets.Usage, now: datetime, events: list[Event],
           items: list[Any] | None) -> None:
    """Create what the step ``index`` a run just landed on needs from workers: its child run,
    its fan-out rows, its due row (a delay), or its task row (unpublished while paused)."""
    step = spec.steps[index]
    if status == RunStatus.WAITING_FOR_WORKFLOWS and step.kind == "child":
        child_id = start_child(spec, run_id, index, state, now)
        events.append(Event(run_id=run_id, kind="child_started", step_index=index,
                            step_name=step.name, data={"child_run": child_id}))
        signals.emit("run_waiting", run_id=run_id, workflow=spec.name, step=step.name,
                     waiting_for=[child_id], kind="child")
    if status == RunStatus.RUNNING and step.kind in ("parallel", "for_each"):
        fan_out(spec, run_id, index, state, usage.transitions, now, items)
    elif status == RunStatus.RUNNING and step.kind == "delay":
        # The due time lives in the row; long delays are published by the sweeper when due.
        wait = step.delay_seconds or 0
        due = now + timedelta(seconds=wait)
        on_broker = wait <= settings.MAX_ETA
        following = StepRun.objects.create(
            run_id=run_id, seq=usage.transitions, step_index=index, step_name=step.name,
            max_attempts=3, available_at=due, published_at=due if on_broker else None)
        if on_broker:
            publish.publish_on_commit([publish.message_for(spec, following.pk, index,
                                                           wait or None)])
    elif status == RunStatus.RUNNING:
        following = rows.new_step_run(run_id, spec, index, seq=usage.transitions, now=now)
        gates.publish_landed(spec, following.pk, index, run_id, state)
    elif status == RunStatus.PAUSED and step.kind == "task":
        # Ready for resume(), which publishes it; until then claims skip it.
        rows.new_step_run(run_id, spec, index, seq=usage.transitions, now=now, published=False)


def fan_out(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any], seq: int,
            now: datetime, items: list[Any] | None) -> None:
    """Create one row per branch or item of the step at ``index`` and publish them all."""
    step = spec.steps[index]
    spread = step.fanout
    assert spread is not None, f"step {step.name!r} is not a fan-out step"
    common: dict[str, Any] = {
        "run_id": run_id, "seq": seq, "step_index": index, "step_name": step.name,
        "available_at": now, "published_at": now}
    if step.kind == "parallel":
        new = [StepRun(branch=i, handler=path, timeout=spec.timeout_of(index, i),
                       max_attempts=effective_policy(spec, index, i).max_attempts, **common)
               for i, path in enumerate(spread.branches)]
    else:
        items = items if items is not None else flow.for_each_items(spec, run_id, step, state)
        attempts = effective_policy(spec, index).max_attempts
        new = [StepRun(branch=i, handler=step.handler, input={"item": item, "index": i},
                       timeout=step.timeout, max_attempts=attempts, **common)
               for i, item in enumerate(items)]
    if spread.max_concurrency is not None:
        for row in new[spread.max_concurrency:]:  # they start as running ones finish
            row.status, row.published_at = StepStatus.HELD, None
    created = StepRun.objects.bulk_create(new)
    publish.publish_on_commit([publish.step_message(spec, row.pk, index, row.timeout)
                               for row in created if row.status == StepStatus.PENDING])


def release_held(spec: WorkflowSpec, run_id: int, seq: int, index: int, now: datetime) -> int:
    """Start held branches or items of a fan-out pass, in order, into the slots its
    ``max_concurrency`` leaves free. Call with the run's row locked (it serialises releases).
    """
    spread = spec.steps[index].fanout
    limit = None if spread is None else spread.max_concurrency
    if limit is None:
        return 0
    same_pass = StepRun.objects.filter(run_id=run_id, kind="step", seq=seq, step_index=index)
    free = limit - same_pass.filter(
        status__in=(StepStatus.PENDING, StepStatus.PROCESSING)).count()
    if free <= 0:
        return 0
    released = list(same_pass.filter(status=StepStatus.HELD).order_by("branch")
                    .values_list("pk", "timeout")[:free])
    if released:
        StepRun.objects.filter(pk__in=[pk for pk, _ in released]).update(
            status=StepStatus.PENDING, available_at=now, published_at=now)
        publish.publish_on_commit([publish.step_message(spec, pk, index, timeout)
                                   for pk, timeout in released])
    return len(released)
