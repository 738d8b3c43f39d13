"""Queuety's options for jobs: per backend (``TASKS[alias]["OPTIONS"]``) and per task
(``@queuety.job_options(...)`` over ``@task``); a task's own options win, key by key.

They are the options of a workflow step (docs/guide/resources.md, docs/guide/retries.md):
``retry``, ``timeout``, ``cost_units``, ``concurrency_group``, ``concurrency_limit``,
``rate_limit`` and ``queue`` (the Celery queue, which otherwise follows the task's
``queue_name``); and the job's own: ``unique_for`` and ``unique_key`` (unique jobs,
``queuety.jobs.unique``), ``throttle_exceptions`` and ``throttle_key`` (throttling after
exceptions, ``queuety.jobs.throttle``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from queuety import exceptions
from queuety.core.handlers import step_options
from queuety.core.retry import RetryPolicy

#: The options a job shares with a workflow step.
STEP_NAMES = ("retry", "timeout", "cost_units", "concurrency_group", "concurrency_limit",
              "rate_limit", "queue")
#: The options of jobs alone.
UNIQUE_NAMES = ("unique_for", "unique_key")
#: Throttling after exceptions (``queuety.jobs.throttle``).
THROTTLE_NAMES = ("throttle_exceptions", "throttle_key")
#: Every option a backend's OPTIONS or job_options() may give.
NAMES = STEP_NAMES + UNIQUE_NAMES + THROTTLE_NAMES

#: The options job_options() gave each task, by the task's module path.
_per_task: dict[str, dict[str, Any]] = {}

T = TypeVar("T")


def check(options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate ``options`` (named ``where`` in errors) and return them with ``retry`` as a
    ``RetryPolicy`` (a dict of its arguments is accepted, as in ``QUEUETY["DEFAULT_RETRY"]``).

    Raises:
        WorkflowDefinitionError: an unknown option, or a value of the wrong type or range;
            the message names the option and the values allowed.
    """
    unknown = sorted(set(options) - set(NAMES))
    if unknown:
        raise exceptions.WorkflowDefinitionError(
            f"{where} has unknown option(s) {', '.join(map(repr, unknown))}; the options are "
            f"{', '.join(NAMES)} (docs/guide/tasks.md).")
    checked = dict(options)
    retry = checked.get("retry")
    if isinstance(retry, Mapping):
        try:
            checked["retry"] = RetryPolicy(**retry)
        except TypeError as error:
            raise exceptions.WorkflowDefinitionError(
                f"{where}'s retry is not a RetryPolicy's arguments: {error}.") from None
    rate = checked.get("rate_limit")
    if isinstance(rate, list):  # as settings files write a pair
        checked["rate_limit"] = tuple(rate)
    # The step's own rules, so a job's options mean what a step's do.
    step_options(where, None, **{key: checked.get(key) for key in STEP_NAMES})
    _check_unique(checked, where)
    _check_throttle(checked, where)
    return checked


def _check_unique(checked: dict[str, Any], where: str) -> None:
    period = checked.get("unique_for")
    if period is not None and (isinstance(period, bool) or not isinstance(period, int | float)
                               or period <= 0):
        raise exceptions.WorkflowDefinitionError(
            f"{where}'s unique_for must be a positive number of seconds (got {period!r}).")
    key = checked.get("unique_key")
    if key is not None and not (isinstance(key, str) and key.strip()) and not callable(key):
        raise exceptions.WorkflowDefinitionError(
            f"{where}'s unique_key must be a non-blank string or a callable of the task's "
            f"arguments that returns one (got {key!r}).")


def _check_throttle(checked: dict[str, Any], where: str) -> None:
    given = checked.get("throttle_exceptions")
    if isinstance(given, list):  # as settings files write a pair
        checked["throttle_exceptions"] = given = tuple(given)
    if given is not None and not _is_throttle(given):
        raise exceptions.WorkflowDefinitionError(
            f"{where}'s throttle_exceptions must be (max_failures, window_seconds): a whole "
            "number of at least 1 and a positive number of seconds up to 3600, such as "
            f"(10, 600) (got {given!r}).")
    key = checked.get("throttle_key")
    if key is not None and not (isinstance(key, str) and key.strip()):
        raise exceptions.WorkflowDefinitionError(
            f"{where}'s throttle_key must be a non-blank string (got {key!r}).")
    if key is not None and given is None:
        raise exceptions.WorkflowDefinitionError(
            f"{where} gives throttle_key without throttle_exceptions; give both, such as "
            "throttle_exceptions=(10, 600), throttle_key='smtp'.")


def _is_throttle(given: Any) -> bool:
    """Whether ``given`` is a valid ``(max_failures, window_seconds)``."""
    if not isinstance(given, tuple) or len(given) != 2:
        return False
    count, window = given
    return (isinstance(count, int) and not isinstance(count, bool) and count >= 1
            and isinstance(window, int | float) and not isinstance(window, bool)
            and 0 < window <= 3600)


def step_part(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that shape a job's step (the rest are the job's own)."""
    return {key: value for key, value in options.items() if key in STEP_NAMES}


def job_options(**options: Any) -> Callable[[T], T]:
    """Give a task Queuety's options for its jobs; put it over ``@task``::

        @queuety.job_options(retry=queuety.RetryPolicy(max_attempts=5), timeout=30)
        @task
        def send_receipt(order_id): ...

    Raises:
        WorkflowDefinitionError: an unknown option or a bad value (at import, so a typo never
            reaches a worker).
        TypeError: what it decorates is not a task (``@task`` must come first, below it).
    """
    checked = check(options, "job_options()")

    def decorate(task: T) -> T:
        path = getattr(task, "module_path", None)
        if not isinstance(path, str) or not hasattr(task, "enqueue"):
            raise TypeError(
                f"@queuety.job_options() decorates a task, not {task!r}: put it above @task.")
        _per_task[path] = checked
        return task
    return decorate


def for_task(module_path: str, backend_options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``module_path``'s jobs: the backend's, overridden by the task's own."""
    return {**backend_options, **_per_task.get(module_path, {})}
