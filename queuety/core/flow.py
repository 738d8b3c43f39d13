"""The rules a run follows between a step's outcome and its next row, as pure functions.

The runtime (``queuety.runtime.landing`` and ``settle``) reads the rows, asks these functions
what to do, and writes what they decide: whether a loop goes round again, which items a
``for_each`` step fans out to, what a settled join merges, whether the run stays inside its
budget, when a failed child run is started again, and the one shape of a failed run's error.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from queuety import exceptions
from queuety.core import budget as budgets
from queuety.core import fanout, waits
from queuety.core.definition import (
    FanOutStep,
    ForEachStep,
    ParallelStep,
    RepeatStep,
    StepSpec,
    WorkflowSpec,
)
from queuety.core.engine import check_output, describe_error, retry_delay
from queuety.core.imports import import_path


def failure_record(error: BaseException, *, step: str | None, step_index: int | None,
                   attempt: int | None, max_attempts: int | None,
                   **extra: Any) -> dict[str, Any]:
    """The error a failed run records (``WorkflowRun.error``, ``workflow_status().error``).

    Its type and message, where the run failed, and, for a budget breach, which budget, its
    limit and what was used; ``extra`` adds keys (the child run, a workflow wait's details).
    """
    record: dict[str, Any] = {**describe_error(error, False), "step": step,
                              "step_index": step_index, "attempt": attempt,
                              "max_attempts": max_attempts, **extra}
    if isinstance(error, exceptions.BudgetExceeded):
        record.update(budget=error.budget, limit=error.limit, used=error.used)
    return record


def check_budget(spec: WorkflowSpec, run_id: int, state: dict[str, Any],
                 usage: budgets.Usage) -> None:
    """Raise BudgetExceeded if a run at ``usage`` with ``state`` breaches its budget."""
    if spec.budget.configured():
        size = budgets.state_bytes(state) if spec.budget.max_state_bytes else 0
        budgets.check(spec.budget, replace(usage, public_state_bytes=size), run_id, spec.name)


def repeat_decision(spec: WorkflowSpec, run_id: int, index: int, state: dict[str, Any],
                    loops: dict[str, int]) -> tuple[bool, dict[str, int]]:
    """Evaluate the repeat step ``index``: go back again? Returns that and the updated loop
    counters (keyed by the repeat step's index).

    Raises:
        BudgetExceeded: the loop would pass its ``max_iterations``.
    """
    step = spec.step_of(index, RepeatStep)
    rule = step.repeat
    if rule["condition"]:
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


def loops_from(spec: WorkflowSpec, index: int, loops: dict[str, int]) -> dict[str, int]:
    """The loop counters of a run sent back to step ``index`` (``retry(from_step=)``): a loop
    that starts after ``index`` is entered afresh, so its counter goes; a loop the step is
    inside keeps its count (the iteration in progress is the one run again)."""
    return {key: count for key, count in loops.items()
            if spec.index_of(spec.step_of(int(key), RepeatStep).repeat["target"]) <= index}


def for_each_items(spec: WorkflowSpec, run_id: int, step: ForEachStep,
                   state: dict[str, Any]) -> list[Any]:
    """The items a for_each step fans out to, checked against ``max_for_each_items``.

    Raises:
        InvalidStepOutput: the state key does not hold a list, or holds none for a mode
            that needs at least one success.
        BudgetExceeded: more items than ``max_for_each_items``.
    """
    spread = step.fanout
    items = state.get(spread.items_key or "")
    if not isinstance(items, list):
        raise exceptions.InvalidStepOutput(
            f"For-each step {step.name!r} of run {run_id} expected state key "
            f"{spread.items_key!r} to hold a list (got {type(items).__name__}).")
    limit = spec.budget.max_for_each_items
    if limit is not None and len(items) > limit:
        raise exceptions.BudgetExceeded(
            "max_for_each_items", limit, len(items), run_id, spec.name,
            message=f"For-each step {step.name!r} of run {run_id} planned {len(items)} items, "
                    f"over its max_for_each_items budget of {limit}.")
    if not items and spread.mode != fanout.ALL:
        raise exceptions.InvalidStepOutput(
            f"For-each step {step.name!r} of run {run_id} has no items, so mode "
            f"{spread.mode!r} can never be satisfied.")
    return items


def completed_kind(step: FanOutStep) -> str:
    """The timeline event of one finished branch (``parallel``) or item (``for_each``)."""
    return "branch_completed" if isinstance(step, ParallelStep) else "item_completed"


def join_mode(step: FanOutStep) -> str:
    """When a fan-out step's join settles: every branch of a ``parallel`` step, else the
    ``for_each`` step's mode."""
    return fanout.ALL if isinstance(step, ParallelStep) else step.fanout.mode


def join_cost(step: FanOutStep, succeeded: int) -> int:
    """The cost units a settled fan-out adds: a ``parallel`` step's once, a ``for_each``
    step's once per item that succeeded."""
    return step.cost_units if isinstance(step, ParallelStep) else step.cost_units * succeeded


def join_output(step: FanOutStep, state: dict[str, Any], rows: list[dict[str, Any]], *,
                run_id: int) -> dict[str, Any]:
    """What a settled fan-out merges: branch outputs in order, or the for_each aggregate
    under its result key (plus what the reducer adds).

    Raises:
        InvalidStepOutput: the reducer returned something that is not a dict.
    """
    spread = step.fanout
    if isinstance(step, ParallelStep):
        return fanout.merge_branches([r["output"] for r in sorted(rows, key=lambda r: r["index"])])
    aggregate = fanout.aggregate(spread, rows)
    output: dict[str, Any] = {spread.result_key or "": aggregate}
    if spread.reducer:
        reducer = import_path(spread.reducer)
        merged = {**state, **output}
        reduced = reducer().reduce(merged, aggregate) if isinstance(reducer, type) \
            else reducer(merged, aggregate)
        output.update(check_output(step.name, run_id, reduced))
    return output


#: Child errors that a restart cannot fix.
FINAL_CHILD_ERRORS = frozenset(f"queuety.exceptions.{cls.__name__}" for cls in (
    exceptions.BudgetExceeded, exceptions.PermanentError, exceptions.WorkflowDefinitionError,
    exceptions.InvalidStepOutput, exceptions.UnknownStep, exceptions.UnmatchedRoute))


def child_restart_delay(step: StepSpec, child_status: str, child_error: dict[str, Any] | None,
                        child_attempt: int, failure: BaseException) -> float | None:
    """Seconds before starting a failed child run again by its step's own retry policy, or
    None when it must not be restarted (no policy, cancelled, or an error no restart fixes)."""
    if step.retry is None or child_status == "cancelled" or \
            (child_error or {}).get("type") in FINAL_CHILD_ERRORS:
        return None
    return retry_delay(step.retry, failure, child_attempt)


def aware_time(when: Any, what: str) -> datetime:
    """Return ``when`` if it is a time-zone-aware datetime (``what`` says where it came from,
    for the error).

    Raises:
        WorkflowDefinitionError: ``when`` is naive, or no datetime at all.
    """
    if not isinstance(when, datetime):
        raise exceptions.WorkflowDefinitionError(
            f"{what} must be a datetime with a time zone (got {type(when).__name__} "
            f"{when!r}).")
    if when.tzinfo is None or when.utcoffset() is None:
        raise exceptions.WorkflowDefinitionError(
            f"{what} is the naive datetime {when.isoformat()}, which names no instant; give "
            "it a time zone (datetime(..., tzinfo=ZoneInfo('Europe/Paris')), "
            "django.utils.timezone.make_aware(...) or datetime.now(UTC)).")
    return when


def delay_seconds(step: StepSpec, state: dict[str, Any], now: datetime, run_id: int) -> float:
    """How long a run landing on the ``delay`` step ``step`` at ``now`` sleeps there: its
    ``delay()`` duration, or the time until its ``delay_until()`` time (0 when that has
    passed), which its callable computes from the run's public ``state``.

    Raises:
        InvalidStepOutput: the callable raised, or returned no aware datetime.
    """
    if now.tzinfo is None:  # USE_TZ = False: the server's local time
        now = now.astimezone()
    if step.until is not None:
        return max(0.0, (datetime.fromisoformat(step.until) - now).total_seconds())
    if step.until_from is None:
        return float(step.delay_seconds or 0.0)
    try:
        returned = import_path(step.until_from)(dict(state))
    except Exception as error:  # the site's function: its failure is the run's, not a crash
        raise exceptions.InvalidStepOutput(
            f"The function {step.until_from}(state) of delay_until step {step.name!r} of run "
            f"{run_id} raised {type(error).__name__}: {error}.") from error
    try:
        when = aware_time(returned, f"The time {step.until_from}(state) returned for "
                                    f"delay_until step {step.name!r} of run {run_id}")
    except exceptions.WorkflowDefinitionError as error:
        raise exceptions.InvalidStepOutput(str(error)) from None
    return max(0.0, (when - now).total_seconds())
