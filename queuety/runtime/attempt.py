"""One attempt of one step: what ``queuety.execute_step`` does with a message.

1. Claim the step row (``queuety.runtime.claim``); a message for a row it cannot claim is
   dropped, or published again for its due time when it came early.
2. Run the handler outside any transaction, with a heartbeat and, when the step has a
   ``timeout``, a deadline that interrupts it (``queuety.runtime.watchdog``).
3. Record the outcome in one transaction (``queuety.runtime.outcome``). For an untimed task
   step, the transition may hand this process the run's next step, already claimed: it runs
   here next (inline continuation, bounded by ``INLINE_STEPS`` and ``INLINE_SECONDS``).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from queuety import cleanup, exceptions, instruments, publish, tracing
from queuety.conf import settings
from queuety.core import budget as budgets
from queuety.core import engine, flow
from queuety.core.definition import DelayStep, FanOutStep, ParallelStep, WorkflowSpec
from queuety.core.handlers import (
    StepContext,
    call_handler,
    call_item_handler,
    invoke_handler,
    invoke_item_handler,
    is_async_handler,
)
from queuety.core.inline import InlineWindow
from queuety.models import Event, RunStatus, StepRun, StepStatus
from queuety.runtime import exactly_once, gates, lane, wakeups
from queuety.runtime.claim import Claim, claim, owned
from queuety.runtime.finish import fail_unloadable
from queuety.runtime.outcome import (
    Discarded,
    record_failure,
    record_success,
    record_success_retrying,
)
from queuety.runtime.settle import branch_done
from queuety.runtime.sink import AttemptOutputs
from queuety.runtime.watchdog import Heartbeats, deadline, heartbeat, progress_reporter
from queuety.store import pauses, rows
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """What one ``execute_step`` call did, for the worker that ran it."""

    claimed: bool
    timed_out: bool = False
    leftover_threads: tuple[str, ...] = ()
    """Threads the handler started that were still alive after it timed out."""


def execute_step(step_run_id: int, *, inline: bool = True,
                 killed_at: float | None = None, queue: str = "") -> AttemptReport:
    """Run one attempt of a step and apply its outcome (the body of the Celery task).

    Idempotent: a message for a step that is not pending and due is dropped (or, for a
    delayed step delivered early, published again for its due time).

    With ``inline``, the transition of a plain task step hands this process the run's next
    step when that is a task step on the same queue whose deadline this call can enforce
    (``queuety.core.inline``): an untimed step when no time limit of its own covers the call;
    a timed step when ``killed_at`` (the monotonic moment the task's own hard time limit kills
    this process) falls within ``INLINE_SECONDS`` after that step's own hard limit; any step on
    the I/O lane, which enforces deadlines itself. The next row is inserted already claimed by
    this process, and runs here with no message and no separate claim. At most
    ``QUEUETY["INLINE_STEPS"]`` steps run so in a row, and none starts after
    ``QUEUETY["INLINE_SECONDS"]``; the next one is then published as usual. The caller passes
    ``inline=False`` under a soft time limit (it would interrupt whichever step runs).

    ``queue`` is the queue the message came from: while it is paused (``queuety.queues``), the
    row is not claimed but held throttled (``queue paused``), its attempt not counted.

    Likewise, when a step in a concurrency group ends, the best waiting step of its group
    that has no timeout is handed to this process (*direct hand-off*, with ``inline``): it runs
    here next, with no broker hop, while the same window admits an untimed step (within
    ``INLINE_SECONDS``, and no hard limit of the task's own); otherwise it is published.
    """
    window = InlineWindow(time.monotonic() + settings.INLINE_SECONDS, killed_at,
                          settings.HARD_TIMEOUT_GRACE, settings.INLINE_SECONDS,
                          own_deadlines=lane.current() is not None)
    report, kept = _attempt(step_run_id, inline=inline, window=window, queue=queue)
    while kept is not None:
        # A handed-off step has no timeout: it runs here only if the window admits one.
        if not inline or report.timed_out or not window.admits(None, time.monotonic()):
            _hand_back(kept)
            break
        # The hand-off picked a step on this queue: a pause of it holds that one too.
        report, kept = _attempt(kept, inline=inline, window=window, queue=queue)
    return report


def _attempt(step_run_id: int, *, inline: bool, window: InlineWindow, queue: str = ""
             ) -> tuple[AttemptReport, int | None]:
    """One message's work (see :func:`execute_step`); also the id of a waiting step this
    process was handed when a slot of its group freed, or None."""
    held = claim(step_run_id, queue=queue)
    if held is None and _refused(step_run_id, queue):
        held = claim(step_run_id, queue=queue)  # its queue's pause was lifted meanwhile
    if held is None:
        return AttemptReport(claimed=False), None
    try:
        spec = load_spec(held.definition_id)
    except Exception as error:  # noqa: BLE001 - e.g. a retry_on class a deploy removed
        fail_unloadable(held.step_run_id, held.run_id, error)
        return AttemptReport(claimed=True), None
    if held.kind != "step":
        _execute_cleanup(held, spec)
        return AttemptReport(claimed=True), None
    step = spec.steps[held.step_index]
    passage = _pass_gate(held, spec)
    if passage is None:
        return AttemptReport(claimed=False), None
    if isinstance(step, FanOutStep):
        try:
            report = _execute_branch(held, spec, step, _context(spec, held, streams=False))
        finally:
            kept = _release(passage, keep=inline)
        return report, kept
    steps_left = settings.INLINE_STEPS if inline else 1
    following: Claim | None = held
    report = AttemptReport(claimed=True)
    kept = None
    while following is not None:
        steps_left -= 1
        if following is not held:
            # A step the transition handed this process passes its own gate, like any claim.
            passage = _pass_gate(following, spec)
            if passage is None:
                break
        try:
            report, following = _execute_task_step(following, spec,
                                                   window=window if steps_left else None)
        finally:
            # One hand-off at a time: while this run goes on inline, others are published.
            handed = _release(passage, keep=inline and kept is None and following is None)
            kept = kept if handed is None else handed
    return report, kept


def _pass_gate(held: Claim, spec: WorkflowSpec) -> gates.Passage | None:
    """The claimed attempt's passage through its resource gate; None when it must not run
    (throttled or deferred, its attempt handed back; or failed, its group unresolvable)."""
    try:
        passage = gates.enter(held, spec)
    except exceptions.WorkflowDefinitionError as error:
        record_failure(held, spec, error, None)
        return None
    return passage if passage.started else None


def _release(passage: gates.Passage, *, keep: bool = False) -> int | None:
    """Give back the slot an attempt held, waking the next waiting steps of its group; with
    ``keep``, return the one handed to this process to run next (see :func:`execute_step`)."""
    if passage.limits is None:
        return None
    try:
        return wakeups.release(passage.limits, keep=keep)
    except DatabaseError:
        logger.exception("Could not wake the steps waiting for group %r or queue %r; the "
                         "sweeper will.", passage.limits.group, passage.limits.queue)
        return None


def _hand_back(step_run_id: int) -> None:
    """Publish a waiting step this process was handed but will not run now."""
    try:
        wakeups.hand_back(step_run_id)
    except DatabaseError:  # its row is pending and woken: the sweeper publishes it again
        logger.exception("Could not publish step run id=%s; the sweeper will.", step_run_id)


def _execute_task_step(held: Claim, spec: WorkflowSpec, *, window: InlineWindow | None
                       ) -> tuple[AttemptReport, Claim | None]:
    """Run a claimed task (or delay) step; return what happened and the claim of the next
    step if the transition gave it to this process (only if ``window`` admits it)."""
    step = spec.steps[held.step_index]
    threads_before = set(threading.enumerate())
    started = time.monotonic()
    context = _context(spec, held, taggable=True)
    timed_out = False
    following = None
    # The heartbeat covers recording the outcome too: under contention for the run row, the
    # transition can wait for a lock, and the sweeper must not take this attempt for lost.
    with _span(held, spec, step.name) as span, heartbeat(held.step_run_id):
        if step.transactional:
            timed_out, following = _execute_transactional(held, spec, context, started,
                                                          window, span)
            return _report(threads_before, timed_out), following
        try:
            output = None if isinstance(step, DelayStep) else _run_body(
                step.name, held, step.handler, dict(held.state), context)
            outcome = engine.advance(spec, held.run_id, held.state, held.step_index, output)
            _check_budget(spec, held, outcome)
        except exceptions.StepHeld as held_back:  # not a failure: handed back, due later
            _hold(held, spec, held_back, span)
        except Exception as error:  # noqa: BLE001 - every step failure is recorded
            span.fail(error, "failed")
            record_failure(held, spec, error, _ms_since(started),
                           publish_artifacts=_wrote_artifacts(context))
            timed_out = isinstance(error, exceptions.StepTimeout)
        else:
            span.set(status="completed")
            try:
                # A timed step's message carries a hard limit: no try may outlive it.
                give_up_at = None if step.timeout is None else (
                    started + step.timeout + settings.HARD_TIMEOUT_GRACE)
                took = _ms_since(started)
                following = record_success_retrying(
                    held, spec, outcome, took, window=window, give_up_at=give_up_at,
                    publish_artifacts=_wrote_artifacts(context), tags=context.tags or None)
                if settings.METRICS:
                    instruments.step_finished(spec.name, step.name, "completed", took)
            except (exceptions.BudgetExceeded, exceptions.WorkflowDefinitionError) as error:
                # Found while landing on the next step (the run had moved on, or a for_each's
                # items are not a list or too many): this step's outcome cannot stand.
                record_failure(held, spec, error, _ms_since(started),
                               publish_artifacts=_wrote_artifacts(context))
            except DatabaseError as error:
                if not rows.is_refusal(error):
                    raise  # perhaps passing (a timeout, a standby): the sweeper's, as before
                _record_refused_transition(held, spec, error, _ms_since(started))
    return _report(threads_before, timed_out), following


def _execute_transactional(held: Claim, spec: WorkflowSpec, context: StepContext,
                           started: float, window: InlineWindow | None, span: tracing.Span
                           ) -> tuple[bool, Claim | None]:
    """Run a transactional step (``queuety.runtime.exactly_once``): its body, the outcome and
    the transition in one transaction; return whether it timed out, and the claim of the next
    step if the transition gave it to this process.

    Whatever ends the transaction early rolls the body's writes back, and is then recorded as a
    plain step's would be, in a transaction of its own: a failure (retried by the policy), a
    hold, or an outcome discarded because the attempt no longer owned its row.
    """
    step = spec.steps[held.step_index]
    try:
        with exactly_once.atomic_attempt(held, step.name, step.timeout):
            output = _run_body(step.name, held, step.handler, dict(held.state), context)
            # The timeout bounds the body's statements, not the transition's: its wait for
            # the run's row (a signal or a pause holding it) is no fault of the body.
            if step.timeout is not None:
                rows.limit_statements(None, reset=True)
            outcome = engine.advance(spec, held.run_id, held.state, held.step_index, output)
            _check_budget(spec, held, outcome)
            took = _ms_since(started)
            following = record_success_retrying(
                held, spec, outcome, took, window=window, give_up_at=None,
                publish_artifacts=_wrote_artifacts(context), strict=True,
                tags=context.tags or None)
    except Discarded as discarded:
        span.set(status="discarded")
        record_success(held, spec, discarded.outcome, _ms_since(started))
        return False, None
    except exceptions.StepHeld as held_back:
        _hold(held, spec, held_back, span)
        return False, None
    except Exception as error:  # noqa: BLE001 - every step failure is recorded
        span.fail(error, "failed")
        record_failure(held, spec, error, _ms_since(started))
        return isinstance(error, exceptions.StepTimeout), None
    span.set(status="completed")
    if settings.METRICS:
        instruments.step_finished(spec.name, step.name, "completed", took)
    return False, following


def _hold(held: Claim, spec: WorkflowSpec, held_back: exceptions.StepHeld,
          span: tracing.Span) -> None:
    """Hand back an attempt whose body raised StepHeld: not a failure, due again later."""
    span.set(status="held")
    if gates.hold(held, spec, held_back.seconds, "held", held_back.reason):
        logger.info("Step %r of run id=%s is held for %.1f s: %s.",
                    spec.steps[held.step_index].name, held.run_id, held_back.seconds,
                    held_back.reason)


def _record_refused_transition(held: Claim, spec: WorkflowSpec, error: DatabaseError,
                               duration_ms: float) -> None:
    """Fail the attempt whose outcome the database refused for good, saying why and what to
    do, instead of leaving its row processing for the sweeper to take for a lost worker."""
    step = spec.steps[held.step_index]
    cause = error.__cause__ or error
    fix = rows.pooler_mismatch(error) or (
        "Its output was discarded; fix the cause (the database's and the worker's logs say "
        "more), then retry the run.")
    refused = exceptions.TransitionFailed(
        f"The outcome of step {step.name!r} of run {held.run_id} (attempt {held.attempt}) "
        f"could not be recorded: the database refused it with {type(cause).__name__}: "
        f"{str(cause).strip()}. {fix}")
    logger.error("%s", refused)
    connection.close()  # a connection that failed mid-protocol is not to be trusted again
    try:
        record_failure(held, spec, refused, duration_ms)
    except DatabaseError:
        logger.exception("Could not record that the outcome of step run id=%s was refused; "
                         "the sweeper will recover the attempt.", held.step_run_id)


def _execute_branch(held: Claim, spec: WorkflowSpec, step: FanOutStep,
                    context: StepContext) -> AttemptReport:
    """Run one parallel branch or for_each item, then record it (and maybe settle the join)."""
    row = StepRun.objects.only("handler", "input").get(pk=held.step_run_id)
    threads_before = set(threading.enumerate())
    started = time.monotonic()
    timed_out = False
    with _span(held, spec, step.name) as span, heartbeat(held.step_run_id):
        try:
            if isinstance(step, ParallelStep):
                output = engine.check_output(step.name, held.run_id, _run_body(
                    step.name, held, row.handler, dict(held.state), context))
            else:
                item: dict[str, Any] = row.input or {}
                output = _run_body(step.name, held, row.handler, dict(held.state), context,
                                   item=(item["item"], item["index"]))
                engine.check_output(step.name, held.run_id, {"item": output})
            took = _ms_since(started)
            branch_done(held, spec, output, took, publish_artifacts=_wrote_artifacts(context))
            if settings.METRICS:
                instruments.step_finished(spec.name, step.name, "completed", took)
        except Exception as error:  # noqa: BLE001 - recorded like any step failure
            span.fail(error, "failed")
            record_failure(held, spec, error, _ms_since(started),
                           publish_artifacts=_wrote_artifacts(context))
            timed_out = isinstance(error, exceptions.StepTimeout)
        else:
            span.set(status="completed")
    return _report(threads_before, timed_out)


def _span(held: Claim, spec: WorkflowSpec, step_name: str
          ) -> AbstractContextManager[tracing.Span]:
    """The attempt's span (a no-op unless tracing is on), joined to the run's trace."""
    return tracing.step_span(held.trace_context, spec.name, spec.version, step_name,
                             run_id=held.run_id, step_run_id=held.step_run_id,
                             attempt=held.attempt, branch=held.branch or None)


def _execute_cleanup(held: Claim, spec: WorkflowSpec) -> None:
    """Run a compensation or hook row: its handler gets the recorded state; output ignored."""
    row = StepRun.objects.only("handler", "input", "step_name").get(pk=held.step_run_id)
    started = time.monotonic()
    with heartbeat(held.step_run_id):
        try:
            _run_body(row.step_name, held, row.handler, dict(row.input or {}), None)
        except Exception as error:  # noqa: BLE001 - recorded, then retried or skipped
            record_failure(held, spec, error, _ms_since(started))
            return
        now = timezone.now()
        with transaction.atomic():
            if not owned(held).update(status=StepStatus.COMPLETED, finished_at=now):
                return
            Event.objects.create(run_id=held.run_id, step_run_id=held.step_run_id,
                                 kind=f"{held.kind}_completed", step_index=held.step_index,
                                 step_name=row.step_name, attempt=held.attempt,
                                 duration_ms=_ms_since(started))
            cleanup.cleanup_done(held.run_id, spec, now)


def _run_body(step_name: str, held: Claim, path: str, state: dict[str, Any],
              context: StepContext | None, item: tuple[Any, int] | None = None) -> Any:
    """Run a handler body under its deadline and return its output: on this process's I/O
    lane when it is a lane worker, else here, interrupted by the SIGALRM deadline."""
    running = lane.current()
    try:
        if running is None:
            with deadline(step_name, held.timeout, held) as watch:
                return watch.settle(call_handler(path, state, context) if item is None else
                                    call_item_handler(path, state, item[0], item[1], context))
        invoke = (partial(invoke_handler, path, state, context) if item is None else
                  partial(invoke_item_handler, path, state, item[0], item[1], context))
        # The first call imports the handler's module, which may take a second (a module
        # that pulls in a big library, its import lock making other threads wait): hand the
        # pooled connection back first, as Lane.run would, so no thread holds one meanwhile.
        connection.close()
        is_async = is_async_handler(path, item=item is not None)
        return running.run(step_name, held, invoke, is_async=is_async)
    finally:
        if context is not None and isinstance(context.sink, AttemptOutputs):
            context.sink.end()


def _context(spec: WorkflowSpec, held: Claim, *, streams: bool = True,
             taggable: bool = False) -> StepContext:
    step = spec.steps[held.step_index]
    size = budgets.state_bytes(held.state) if spec.budget.max_state_bytes else 0
    usage = budgets.Usage(held.usage.transitions, held.usage.cost_units,
                          held.usage.started_workflows, size)
    return StepContext(held.run_id, spec.name, step.name, held.attempt,
                       budgets.BudgetView(spec.budget, usage),
                       beat=progress_reporter(held.step_run_id, held.run_id, step.name),
                       sink=AttemptOutputs(held, step.name, streams=streams),
                       tags={} if taggable else None, definition=spec,
                       step_run_id=held.step_run_id, step_index=held.step_index,
                       prune_state_after=spec.prune_state_after)


def _wrote_artifacts(context: StepContext) -> bool:
    """Whether the attempt stored an artifact its outcome must publish (no query if not)."""
    return isinstance(context.sink, AttemptOutputs) and context.sink.artifacts_written > 0


def _report(threads_before: set[threading.Thread], timed_out: bool) -> AttemptReport:
    if not timed_out:
        return AttemptReport(claimed=True)
    if lane.current() is not None:
        # The lane's other attempts start threads too; it accounts for its own leftovers.
        return AttemptReport(claimed=True, timed_out=True)
    leftovers = tuple(t.name for t in threading.enumerate()
                      if t not in threads_before and t.is_alive()
                      and t.name != Heartbeats.name)
    return AttemptReport(claimed=True, timed_out=True, leftover_threads=leftovers)


def _check_budget(spec: WorkflowSpec, held: Claim, outcome: engine.Advance) -> None:
    """Raise BudgetExceeded if completing this step would breach the run's budget."""
    if spec.prune_state_after is not None:
        return  # the state it keeps is known only after pruning, under the run's lock
    base = held.usage
    flow.check_budget(spec, held.run_id, outcome.state, budgets.Usage(
        base.transitions + 1, base.cost_units + spec.steps[held.step_index].cost_units,
        base.started_workflows))


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 3)


def _refused(step_run_id: int, queue: str) -> bool:
    """After a refused claim: publish a delayed step delivered early again for its due time,
    or hold a step whose queue is paused (``queuety.store.pauses``). One query reads why (a
    duplicate, an early message or a paused run pays nothing more); only a paused queue's
    step takes the hold's statement. True when the claim should be tried once more: its
    queue's pause was lifted between the claim and the hold."""
    row = pauses.refusal(step_run_id, queue)
    if row is None:
        return False
    wait = (row["available_at"] - timezone.now()).total_seconds()
    if wait > 0:
        if wait <= settings.MAX_ETA:
            spec = load_spec(row["run__definition_id"])
            publish.publish([publish.step_message(spec, step_run_id, row["step_index"],
                                                  row["timeout"], wait) if row["kind"] == "step"
                             else publish.Message(step_run_id, wait, row["timeout"], spec.queue)])
        return False
    if not queue or row["kind"] != "step" or row["run__status"] != RunStatus.RUNNING:
        return False
    return not (row["paused"] and pauses.hold_paused(step_run_id, queue, timezone.now()))
