"""Recording an attempt's outcome: the transition, exactly once.

A success is applied in ONE transaction whose first statements lock the step row and the run
row (a compare-and-set on the run's ``revision``; when the run changed since the claim, the
decision is taken again under ``SELECT ... FOR UPDATE``). On PostgreSQL the common case is one
statement that commits by itself (``queuety.store.sql.COMPLETE_POSTGRES``). A transient
database error is tried again in place, with the handler's output in hand. A failure
schedules the next attempt or fails the step and its run.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext, suppress
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from queuety import cleanup, exceptions, instruments, publish, signals
from queuety.conf import settings
from queuety.core import budget as budgets
from queuety.core import engine, fanout, flow, landing
from queuety.core.definition import FanOutStep, ForEachStep, WorkflowSpec
from queuety.core.inline import InlineWindow
from queuety.core.status import LIVE_OR_HELD
from queuety.core.transition import transition
from queuety.models import Event, RunStatus, StepRun, StepStatus
from queuety.runtime import artifacts, gates
from queuety.runtime.claim import Claim, applied_by, mark_completed, owned
from queuety.runtime.finish import STEP_FAILS, check_attempts, fail_run, notify_finished
from queuety.runtime.landing import land, release_held
from queuety.store import rows, sql
from queuety.store.definitions import effective_policy

logger = logging.getLogger("queuety")

#: Pauses before trying a transition again after a transient database error (7.3 s in all,
#: well inside STALE_AFTER's default of 60 s). The handler's output is in hand; running the
#: handler again (an LLM call, a payment) would cost far more than waiting.
TRANSITION_RETRY_DELAYS = (0.05, 0.25, 1.0, 2.0, 4.0)


# -- success ----------------------------------------------------------------------------------

class Discarded(Exception):  # noqa: N818 - not an error: a verdict the caller acts on
    """Raised by a ``strict`` :func:`record_success` instead of recording a discarded outcome:
    the caller's transaction (a transactional step's, holding its body's writes) must roll
    back, then the outcome is recorded as a plain step's would be."""

    def __init__(self, outcome: engine.Advance) -> None:
        super().__init__("The attempt's outcome is discarded.")
        self.outcome = outcome


def record_success_retrying(held: Claim, spec: WorkflowSpec, outcome: engine.Advance,
                            duration_ms: float, *, window: InlineWindow | None,
                            give_up_at: float | None,
                            publish_artifacts: bool = False,
                            strict: bool = False,
                            tags: dict[str, str] | None = None) -> Claim | None:
    """:func:`record_success`, tried again in place when the database refuses it for a
    transient reason, so a deadlock or a dropped connection does not cost a second run of the
    handler.

    Every try is the same compare-and-set: nothing is applied twice, and if the sweeper took
    the attempt for lost meanwhile, the try writes nothing and the outcome is discarded. The
    next step is taken inline only when ``window`` admits it (decided at each try): a task
    step on the same queue, whose deadline this task can enforce, before the window closes.
    Past the last pause, or when the next pause would end after ``give_up_at`` (the hard
    limit of a timed step), the error propagates and the step is recovered as before (after
    ``STALE_AFTER``, by running it again).

    ``publish_artifacts``: the attempt stored artifacts, made visible by the transition's own
    transaction (so such a step takes the locked path, not the one-statement one).

    ``strict`` (a transactional step's): raise :class:`Discarded` instead of recording a
    discarded outcome. Inside the caller's transaction no try is repeated: its error
    propagates at once. ``tags``: what the attempt set with ``context.tag()``, merged into
    the run's tags by the transition itself (its one statement, or its transaction).
    """
    # The next step runs here only if it is a task step and this process consumes its queue.
    next_index = outcome.next_index
    next_timeout = None if next_index is None else spec.steps[next_index].timeout
    inlinable = window is not None and next_index is not None and \
        landing.lands_on_task(spec, next_index) and \
        spec.queue_of(next_index) == spec.queue_of(held.step_index)
    unprepared = False
    for tries, pause in enumerate((*TRANSITION_RETRY_DELAYS, None)):
        claim_next = inlinable and window is not None and \
            window.admits(next_timeout, time.monotonic())
        try:
            return record_success(held, spec, outcome, duration_ms, claim_next=claim_next,
                                  retried=tries > 0, publish_artifacts=publish_artifacts,
                                  strict=strict, tags=tags)
        except DatabaseError as error:
            if pause is not None and not unprepared and not connection.in_atomic_block and \
                    rows.warn_pooler_mismatch_once(error):
                # A pooler dropped the prepared statement: nothing ran. Logged once with the
                # fix; this process prepares no more, so the same try goes through now.
                unprepared = True
                with suppress(Exception):
                    connection.close()
                continue
            if not isinstance(error, OperationalError | InterfaceError) or pause is None \
                    or not rows.is_transient(error) or rows.pooler_mismatch(error) \
                    or connection.in_atomic_block or (
                    give_up_at is not None and time.monotonic() + pause >= give_up_at):
                raise
            sqlstate = rows.sqlstate_of(error)
            logger.warning("The transition of step run id=%s (run id=%s, attempt %s) failed "
                           "with a transient database error (%s, SQLSTATE %s); trying it again "
                           "in %.2f s.", held.step_run_id, held.run_id, held.attempt,
                           type(error.__cause__ or error).__name__, sqlstate, pause)
            if connection.vendor != "sqlite" and sqlstate not in rows.SERIALIZATION_FAILURES:
                # The connection is gone: the next query must open a new one (Django forgets
                # the old one even when closing it complains).
                with suppress(Exception):
                    connection.close()
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def record_success(held: Claim, spec: WorkflowSpec, outcome: engine.Advance,
                   duration_ms: float, *, claim_next: bool = False,
                   retried: bool = False, publish_artifacts: bool = False,
                   strict: bool = False, tags: dict[str, str] | None = None) -> Claim | None:
    """Apply a successful attempt; return the next step's claim when this process got it.

    ``retried``: an earlier try failed, perhaps after its commit; finding the row completed
    by this attempt then means the transition is already applied. ``strict``: raise
    :class:`Discarded` where the outcome would be recorded as discarded. ``tags``: merged
    into the run's tags if, and only if, the transition is applied.
    """
    now = timezone.now()
    step = spec.steps[held.step_index]
    completed = Event(
        run_id=held.run_id, step_run_id=held.step_run_id, kind="step_completed",
        step_index=held.step_index, step_name=step.name, attempt=held.attempt,
        duration_ms=duration_ms, data={"output": outcome.output, **(
            {"route": outcome.route} if outcome.route else {}), **(
            {"tags": tags} if tags else {})},
    )
    lands_on_task = landing.lands_on_task(spec, outcome.next_index)
    # A pruned run's transition needs its state_writes, which the one statement does not
    # carry: it takes the locked path (only workflows that use prune_state_after pay for it).
    if connection.vendor == "postgresql" and lands_on_task and spec.prune_state_after is None \
            and not publish_artifacts:
        # One statement that commits by itself (no BEGIN/COMMIT round trips): it writes
        # everything or, when the run moved since the claim, nothing at all.
        owns, advanced, following = _complete_postgres(held, spec, outcome, completed, now,
                                                       claim_next, tags or {})
        if advanced:
            return following
        if not owns:
            if strict:
                raise Discarded(outcome)
            _not_owned(held, spec, outcome, completed, retried)
            return None
    with transaction.atomic():
        if not mark_completed(held, outcome.output, now):
            if strict:
                raise Discarded(outcome)
            _not_owned(held, spec, outcome, completed, retried)
            return None
        # Decide under the run's row lock, in the transaction that holds the completed step
        # row: the run changed since the claim, the next step is a wait, or this is SQLite.
        if not _transition_locked(held, spec, outcome.raw, completed, now):
            if strict:
                raise Discarded(outcome)
            completed.kind = "step_discarded"
            completed.data["reason"] = "the run was no longer running this step"
            completed.data.pop("tags", None)  # never applied: not the run's tags
            completed.save()
        else:
            if publish_artifacts:
                artifacts.publish(held)
            if tags:
                rows.add_tags(held.run_id, tags)
    return None


def _not_owned(held: Claim, spec: WorkflowSpec, outcome: engine.Advance, completed: Event,
               retried: bool) -> None:
    """The step row is no longer this attempt's to complete: because an earlier try of this
    transition committed (its answer lost), or because the row was taken back."""
    if retried and applied_by(held):
        _after_lost_answer(held, spec, outcome.next_index)
        return
    # The run was cancelled or rewound, or the sweeper took this attempt for lost and another
    # attempt owns the row now: the outcome must not count.
    logger.warning("Step run id=%s attempt=%s finished after its row was taken back; its "
                   "outcome is discarded.", held.step_run_id, held.attempt)
    completed.kind = "step_discarded"
    completed.data["reason"] = "the attempt no longer owned its step row"
    completed.data.pop("tags", None)  # never applied: not the run's tags
    completed.save()


def _after_lost_answer(held: Claim, spec: WorkflowSpec, next_index: int | None) -> None:
    """Do what follows the commit of a transition whose answer was lost: wake the runs
    waiting for a finished run; publish the next step's row, first handing back to the
    broker a row that try had claimed for this process to run inline (nobody runs it now)."""
    if next_index is None:
        notify_finished(held.run_id)
        # The transition's delivery rows committed with it; only receivers are still owed.
        signals.emit_to_receivers("run_completed", run_id=held.run_id, workflow=spec.name,
                                  version=spec.version)
        return
    now = timezone.now()
    following = StepRun.objects.filter(run_id=held.run_id, kind="step",
                                       seq=held.usage.transitions + 1)
    following.filter(status=StepStatus.PROCESSING, attempt=1, claimed_by=held.claimed_by
                     ).update(status=StepStatus.PENDING, attempt=0, claimed_by="",
                              claimed_at=None, heartbeat_at=None, published_at=now)
    # Every due row that transition created (a fan-out creates several); a second message for
    # a row already published is harmless, as the claim drops it. Later ones are the sweeper's.
    publish.publish_on_commit([publish.step_message(spec, pk, index, timeout)
                               for pk, timeout, index in following.filter(
                                   status=StepStatus.PENDING, available_at__lte=now)
                               .values_list("pk", "timeout", "step_index")])


def _transition_locked(held: Claim, spec: WorkflowSpec, output: dict[str, Any],
                       completed: Event, now: datetime) -> bool:
    """Apply a completed step to its run under the run's row lock; False if the run moved on.

    Raises:
        BudgetExceeded: rolls back the caller's transaction, completed step row included.
    """
    run = rows.lock_run(held.run_id, fields=rows.RUN_VIEW_FIELDS)
    if run.status not in (RunStatus.RUNNING, RunStatus.PAUSED) or \
            run.current_step != held.step_index:
        return False
    view = rows.run_view(run, now)
    outcome = engine.advance(spec, held.run_id, view.state, held.step_index, output)
    moved = transition(spec, run.pk, view.state, view.writes, view.usage,
                               outcome.output, cost=spec.steps[held.step_index].cost_units,
                               merged=outcome.state)
    completed.data.update(moved.event_data)
    land(spec, view.after(moved.checked()), outcome.next_index, [completed],
         landing.mode_of(run.status))
    return True


def _complete_postgres(held: Claim, spec: WorkflowSpec, outcome: engine.Advance,
                       completed: Event, now: datetime, claim_next: bool,
                       tags: dict[str, str]) -> tuple[bool, bool, Claim | None]:
    """Run the one-statement transition: (owned, advanced, claim of the next step if this
    process took it). ``tags`` (the attempt's ``context.tag()``) are merged into the run's by
    the same statement (``tags || {}`` leaves the row's value as it was)."""
    events: list[dict[str, Any]] = [{field: getattr(completed, field) for field in (
        "step_run_id", "kind", "step_index", "step_name", "attempt", "duration_ms", "data")}]
    next_index = outcome.next_index
    following = None if next_index is None else spec.steps[next_index]
    if following is None:
        events.append({"kind": "workflow_completed"})
    # The caller decided (queuety.core.inline): an untimed step, or a timed one whose hard
    # limit this task's own time limit enforces.
    inline = claim_next and following is not None
    state = json.dumps(outcome.state)
    cost_units = spec.steps[held.step_index].cost_units
    params: dict[str, Any] = {
        "now": now, "step_run_id": held.step_run_id, "attempt": held.attempt,
        "claimed_by": held.claimed_by,
        "output": json.dumps(outcome.output), "state": state,
        "run_id": held.run_id, "revision": held.revision, "step_index": held.step_index,
        "current_step": len(spec.steps) if next_index is None else next_index,
        "status": RunStatus.COMPLETED.value if following is None else RunStatus.RUNNING.value,
        "finished_at": now if following is None else None,
        "seq": held.usage.transitions + 1, "next_index": next_index,
        "next_name": following and following.name,
        "next_max_attempts": None if next_index is None
        else effective_policy(spec, next_index).max_attempts,
        "next_timeout": following and following.timeout,
        "next_status": StepStatus.PROCESSING.value if inline else StepStatus.PENDING.value,
        "next_attempt": 1 if inline else 0,
        "next_published_at": None if inline else now,
        "next_claimed_at": now if inline else None,
        "next_claimed_by": held.claimed_by if inline else "",
        # Inline steps run on the queue this message came from (the routing key a pause
        # names); unknown, the one Queuety sends the step to.
        "next_queue": (held.queue or publish.queue_name(spec.queue_of(next_index)))
        if inline and next_index is not None else "",
        "events": json.dumps(events),
        "cost_units": cost_units, "tags": json.dumps(tags),
    }
    # A webhook endpoint subscribed to run.completed (or job.completed, for a job's run) needs
    # its delivery row in the transition's transaction: the run's last step then takes one
    # (BEGIN and COMMIT) around the statement.
    durable = following is None and signals.sinks_want("run_completed", spec.name)
    with transaction.atomic() if durable else nullcontext():
        owns, advanced, next_id, awaited, next_status = rows.execute_hot(sql.COMPLETE_POSTGRES,
                                                                         params)
        if advanced and following is None:
            # The run completed. Its waiters, if a wait named it or it has a parent, are read
            # by a statement of their own: a waiter that marked this run's row committed its
            # dependency rows before the CTE could update the row, but the CTE's snapshot,
            # taken before that, cannot see them (the row's awaited flag it does see).
            if awaited:
                notify_finished(held.run_id)
            signals.emit("run_completed", run_id=held.run_id, workflow=spec.name,
                         version=spec.version)
    if next_id is None or next_index is None:
        return owns, advanced, None
    if not inline or next_status != StepStatus.PROCESSING:  # not taken: its queue is paused
        gates.publish_landed(spec, next_id, next_index, held.run_id, outcome.state)
        return owns, advanced, None
    # What a claim would have read back: the state as stored (JSON), the run's counters.
    usage = held.usage
    return owns, advanced, Claim(
        next_id, held.run_id, next_index, usage.transitions + 1, 1,
        held.definition_id, json.loads(state), held.revision + 1, now,
        budgets.Usage(usage.transitions + 1, usage.cost_units + cost_units,
                      usage.started_workflows), "step", held.claimed_by, 0,
        None if following is None else following.timeout, held.trace_context, held.queue)


# -- failure ----------------------------------------------------------------------------------

def record_failure(held: Claim, spec: WorkflowSpec, error: BaseException,
                   duration_ms: float | None, *, publish_artifacts: bool = False) -> None:
    """Record a failed attempt: schedule the next attempt, or fail the step and its run.

    ``publish_artifacts``: the attempt stored artifacts; they become visible with the
    recorded failure (a retry that writes the same key replaces them).
    """
    now = timezone.now()
    is_cleanup = held.kind != "step"
    if is_cleanup:
        row = StepRun.objects.only("handler", "step_name").get(pk=held.step_run_id)
        policy, name = cleanup.cleanup_policy(spec, row.handler), row.step_name
    else:
        policy = effective_policy(spec, held.step_index, held.branch)
        name = spec.steps[held.step_index].name
    # After an operator's retry() the row's budget is max_attempts = attempts so far + the
    # policy's; the policy counts the attempts of this budget only.
    row_max = StepRun.objects.values_list("max_attempts", flat=True).get(pk=held.step_run_id)
    attempt = held.attempt - max(0, row_max - policy.max_attempts)
    delay = engine.retry_delay(policy, error, attempt)
    event = Event(run_id=held.run_id, step_run_id=held.step_run_id, step_index=held.step_index,
                  step_name=name, attempt=held.attempt, duration_ms=duration_ms)
    with transaction.atomic():
        if delay is not None and not is_cleanup:
            try:  # in this transaction: its lock holds until the retry is scheduled
                check_attempts(held.run_id, name, error)
            except exceptions.BudgetExceeded as breach:
                error, delay = breach, None
        record = engine.describe_error(error)
        # What a timed-out body produced after its deadline: shown, never merged.
        late = getattr(error, "late", None) if isinstance(error, exceptions.StepTimeout) else None
        discarded = {} if late is None else {"discarded": late}
        if delay is not None:
            if _schedule_retry(held, spec, event, record, delay, policy.max_attempts, now,
                               discarded) and publish_artifacts:
                artifacts.publish(held)
            return
        if not owned(held).update(status=StepStatus.FAILED, finished_at=now, error=record):
            return
        if publish_artifacts:
            artifacts.publish(held)
        event.data = {"error": record, "max_attempts": policy.max_attempts,
                      "worker": held.claimed_by, **discarded}
        _emit_step_failed(held, spec, name, record, policy.max_attempts, None)
        if is_cleanup:  # a failed compensation is recorded and skipped; the next one runs
            event.kind = f"{held.kind}_failed"
            event.save()
            cleanup.cleanup_done(held.run_id, spec, now)
            return
        step = spec.steps[held.step_index]
        if isinstance(step, ForEachStep) and \
                not isinstance(error, exceptions.BudgetExceeded) and \
                _record_item_failure(held, spec, event, now):
            return
        if isinstance(step, FanOutStep):
            StepRun.objects.filter(
                run_id=held.run_id, kind="step", seq=held.seq, step_index=held.step_index,
                status__in=LIVE_OR_HELD,
            ).exclude(pk=held.step_run_id).update(status=StepStatus.CANCELLED, finished_at=now)
        event.kind = "step_failed"
        fail_run(spec, held.run_id, flow.failure_record(
            error, step=step.name, step_index=held.step_index, attempt=held.attempt,
            max_attempts=policy.max_attempts), now, events=[event], statuses=STEP_FAILS)


def _schedule_retry(held: Claim, spec: WorkflowSpec, event: Event, record: dict[str, Any],
                    delay: float, max_attempts: int, now: datetime,
                    discarded: dict[str, Any]) -> bool:
    """Make the attempt's row due again in ``delay`` seconds (the broker holds short waits;
    the sweeper publishes long ones when due); False if the attempt no longer owned it."""
    due = now + timedelta(seconds=delay)
    on_broker = delay <= settings.MAX_ETA
    if not owned(held).update(status=StepStatus.PENDING, available_at=due,
                              published_at=due if on_broker else None, error=record,
                              claimed_at=None, heartbeat_at=None, progress=None):
        return False
    event.kind = f"{held.kind}_retried"
    event.data = {"error": record, "retry_in": round(delay, 6),
                  "retry_at": due.isoformat(), "max_attempts": max_attempts,
                  "worker": held.claimed_by, **discarded}
    event.save()
    _emit_step_failed(held, spec, event.step_name, record, max_attempts, round(delay, 6))
    if on_broker:
        publish.publish_on_commit([publish.step_message(spec, held.step_run_id,
                                                        held.step_index, held.timeout, delay)])
    logger.info("Step run id=%s attempt=%s failed (%s); retry in %.3fs",
                held.step_run_id, held.attempt, record["type"], delay)
    return True


def _emit_step_failed(held: Claim, spec: WorkflowSpec, name: str, record: dict[str, Any],
                      max_attempts: int, retry_in: float | None) -> None:
    signals.emit("step_failed", run_id=held.run_id, workflow=spec.name, step=name,
                 step_run_id=held.step_run_id, attempt=held.attempt, max_attempts=max_attempts,
                 error=record, will_retry=retry_in is not None, retry_in=retry_in)
    if settings.METRICS:
        outcome = "retried" if retry_in is not None else "failed"
        instruments.step_finished(spec.name, name, outcome, None)
        if record["type"] == "queuety.exceptions.StepTimeout":
            instruments.step_finished(spec.name, name, "timed_out", None)


def _record_item_failure(held: Claim, spec: WorkflowSpec, event: Event, now: datetime) -> bool:
    """Record a for_each item out of attempts as ``item_failed`` and free its slot, unless the
    join can no longer be satisfied; return whether it was recorded so (False: the item fails
    its run)."""
    step = spec.step_of(held.step_index, ForEachStep)
    run = rows.lock_run(held.run_id, fields=rows.BOUNDARY_FIELDS)
    total, succeeded, failed = rows.fanout_counts(held.run_id, held.seq, held.step_index)
    verdict = fanout.progress(step.fanout.mode, step.fanout.quorum, total, succeeded, failed)
    if verdict == fanout.IMPOSSIBLE and run.current_step == held.step_index:
        return False
    event.kind = "item_failed"
    event.save()
    if run.status == RunStatus.RUNNING and run.current_step == held.step_index:
        release_held(spec, held.run_id, held.seq, held.step_index, now)
    return True
