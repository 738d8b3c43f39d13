"""The transition function: what a step's outcome does to its run.

Pure: it takes values and returns values. The runtime (``queuety.runtime``) reads the rows,
calls these functions between its claim and its commit, and writes what they return.
"""

from __future__ import annotations

import json
import random
import traceback
from dataclasses import dataclass
from typing import Any

from queuety import exceptions
from queuety.core.definition import WorkflowSpec
from queuety.core.retry import RetryPolicy

#: Output key a step sets to jump to the named step instead of the next one.
NEXT_STEP_KEY = "_next_step"


@dataclass(frozen=True, slots=True)
class Advance:
    """The effect of a completed step on its run."""

    state: dict[str, Any]
    """The run's new public state."""
    output: dict[str, Any]
    """The public keys the step contributed (what was merged)."""
    next_index: int | None
    """Position of the step to run next, or ``None`` when the run is complete."""
    jumped: bool = False
    raw: Any = None
    """The step's output as returned (reserved keys included), to re-apply under a lock."""
    route: dict[str, Any] | None = None
    """For route steps: the label returned and the target it chose."""


class _Default:
    """The route key for 'any other label' (``queuety.DEFAULT``)."""

    def __repr__(self) -> str:
        return "queuety.DEFAULT"


DEFAULT = _Default()


@dataclass(frozen=True, slots=True)
class Route:
    """What a route step may return: its label and, optionally, output to merge."""

    label: str
    output: dict[str, Any] | None = None


def public(mapping: dict[str, Any]) -> dict[str, Any]:
    """Return ``mapping`` without its reserved keys (those starting with ``_``)."""
    return {key: value for key, value in mapping.items() if not key.startswith("_")}


def check_output(step_name: str, run_id: int, output: Any) -> dict[str, Any]:
    """Return the step's output as a dict, or raise :class:`InvalidStepOutput`."""
    if output is None:
        return {}
    if not isinstance(output, dict):
        raise exceptions.InvalidStepOutput(
            f"Step {step_name!r} of run {run_id} returned {type(output).__name__}; "
            "a step must return a dict (merged into the state) or None."
        )
    try:
        json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise exceptions.InvalidStepOutput(
            f"Step {step_name!r} of run {run_id} returned output that is not JSON: {error}. "
            "Return only dicts, lists, strings, numbers, booleans and None."
        ) from None
    bad_keys = [key for key in output if not isinstance(key, str)]
    if bad_keys:
        raise exceptions.InvalidStepOutput(
            f"Step {step_name!r} of run {run_id} returned non-string keys {bad_keys!r}."
        )
    return output


def advance(
    spec: WorkflowSpec, run_id: int, state: dict[str, Any], step_index: int, output: Any
) -> Advance:
    """Merge a completed step's output into ``state`` and pick the next step.

    Keys starting with ``_`` are reserved and never merged; ``_next_step`` names the step to
    jump to.

    Raises:
        InvalidStepOutput: the output is not a JSON dict, or ``_next_step`` is not a string.
        UnknownStep: ``_next_step`` names no step of the workflow.
    """
    step = spec.steps[step_index]
    if step.routes is not None:
        return _advance_route(spec, run_id, state, step_index, step.routes, output)
    if step.kind == "delay":
        output = None
    raw = output
    output = check_output(step.name, run_id, output)
    merged = public(output)
    jump = output.get(NEXT_STEP_KEY)
    if jump is not None:
        if not isinstance(jump, str):
            raise exceptions.InvalidStepOutput(
                f"Step {step.name!r} of run {run_id} set _next_step to {jump!r}; "
                "it must be the name of a step (a string)."
            )
        try:
            next_index: int | None = spec.index_of(jump)
        except exceptions.UnknownStep as error:
            raise exceptions.UnknownStep(
                f"Step {step.name!r} of run {run_id} jumped to unknown step {jump!r}: {error}",
                name=jump,
            ) from None
    else:
        next_index = spec.next_index(step_index)
    return Advance({**state, **merged}, merged, next_index, jumped=jump is not None, raw=raw)


def _advance_route(spec: WorkflowSpec, run_id: int, state: dict[str, Any], step_index: int,
                   routes: dict[str, str], returned: Any) -> Advance:
    """Advance past route step ``step_index``, whose ``routes`` (label -> target) are given."""
    step = spec.steps[step_index]
    label, output = (returned.label, returned.output) if isinstance(returned, Route) \
        else (returned, None)
    if not isinstance(label, str):
        raise exceptions.InvalidStepOutput(
            f"Route step {step.name!r} of run {run_id} returned {label!r} "
            f"({type(label).__name__}); a route label must be a string, compared exactly."
        )
    output = check_output(step.name, run_id, output)
    if label in routes:
        target, defaulted = routes[label], False
    elif step.default_route is not None:
        target, defaulted = step.default_route, True
    else:
        known = list(routes)
        raise exceptions.UnmatchedRoute(
            f"Route step {step.name!r} of run {run_id} returned label {label!r}, which matches "
            f"none of its routes {known} and it has no DEFAULT route.", label, tuple(known))
    merged = public(output)
    return Advance({**state, **merged}, merged, spec.index_of(target), raw=returned,
                   route={"label": label, "target": target, "default": defaulted})


def retry_delay(
    policy: RetryPolicy, error: BaseException, attempt: int, rng: random.Random | None = None
) -> float | None:
    """Return the wait before the next attempt, or ``None`` when the step has failed for good."""
    if not policy.should_retry(error, attempt):
        return None
    return policy.delay(attempt, rng)


def describe_error(error: BaseException, with_traceback: bool = True) -> dict[str, Any]:
    """Return the JSON record of an exception kept in step rows, events and the run."""
    cls = type(error)
    record: dict[str, Any] = {
        "type": f"{cls.__module__}.{cls.__qualname__}".removeprefix("builtins."),
        "message": str(error),
    }
    if with_traceback and error.__traceback__ is not None:
        record["traceback"] = "".join(traceback.format_exception(error))
    return record
