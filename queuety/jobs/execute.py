"""The step a job's run takes: call the task's function with the job's arguments.

Its return value, made JSON as the framework makes it, becomes the run's ``return_value``; an
exception fails the attempt, which the job's retry policy retries or not, like any step's. The
framework's ``task_started`` and ``task_finished`` signals are sent in the worker as each
attempt starts and ends (an attempt cut short by a dead worker sends no ``task_finished``; the
attempt that replaces it sends both again).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from traceback import format_exception
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from queuety.core.handlers import StepContext
from queuety.exceptions import PermanentError
from queuety.jobs import framework, results
from queuety.runtime.claim import worker_id

logger = logging.getLogger("queuety")


class UnstorableReturnValue(PermanentError, TypeError):
    """A task returned a value that cannot be stored as JSON. Permanent: the function already
    ran, and running it again would only repeat its effects and return the same kind of value."""


def call_task(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Run one attempt of a sync task's job."""
    task = results.task_of(state, context.run_id)
    result = _attempt_result(task, state, context)
    _announce(framework.task_started, task, result)
    try:
        if task.takes_context:
            value = task.func(framework.TaskContext(task_result=result), *result.args,
                              **result.kwargs)
        else:
            value = task.func(*result.args, **result.kwargs)
        value = stored_value(task, value)
    except BaseException as error:
        # Sent inside the handler, so that Django's log line carries the traceback.
        _announce(framework.task_finished, task, _failed(result, error))
        raise
    _announce(framework.task_finished, task, _succeeded(result, value))
    return {"return_value": value}


async def acall_task(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Run one attempt of an ``async def`` task's job (on the I/O lane's event loop when its
    queue is a lane's)."""
    task = results.task_of(state, context.run_id)
    result = _attempt_result(task, state, context) if context.attempt == 1 else \
        await sync_to_async(results.read)(str(context.run_id), task.backend)
    await _aannounce(framework.task_started, task, result)
    try:
        if task.takes_context:
            value = await task.func(framework.TaskContext(task_result=result), *result.args,
                                    **result.kwargs)
        else:
            value = await task.func(*result.args, **result.kwargs)
        value = stored_value(task, value)
    except BaseException as error:
        await _aannounce(framework.task_finished, task, _failed(result, error))
        raise
    await _aannounce(framework.task_finished, task, _succeeded(result, value))
    return {"return_value": value}


def _announce(signal: Any, task: Any, result: Any) -> None:
    """Send one of the framework's signals; a receiver that raises is logged, never allowed to
    fail an attempt whose function already ran (its effects would run again on retry)."""
    for receiver, outcome in signal.send_robust(sender=type(task.get_backend()),
                                                task_result=result):
        if isinstance(outcome, Exception):
            logger.error("A receiver of the tasks framework's signal (%s) raised for job %s: "
                         "%r; the job goes on.", receiver, result.id, outcome,
                         exc_info=outcome)


async def _aannounce(signal: Any, task: Any, result: Any) -> None:
    """:func:`_announce` from an event loop."""
    for receiver, outcome in await signal.asend_robust(sender=type(task.get_backend()),
                                                       task_result=result):
        if isinstance(outcome, Exception):
            logger.error("A receiver of the tasks framework's signal (%s) raised for job %s: "
                         "%r; the job goes on.", receiver, result.id, outcome,
                         exc_info=outcome)


def _attempt_result(task: Any, state: dict[str, Any], context: StepContext) -> Any:
    """The job's ``TaskResult`` as this attempt starts: built here for a first attempt (no
    query), read back for a later one (its earlier attempts' workers and errors)."""
    if context.attempt > 1:
        return results.read(str(context.run_id), task.backend)
    now = timezone.now()
    enqueued = state["task"].get("enqueued_at")
    return framework.TaskResult(
        task=task, id=str(context.run_id), status=framework.TaskResultStatus.RUNNING,
        enqueued_at=None if enqueued is None else datetime.fromisoformat(enqueued),
        started_at=now,
        finished_at=None, last_attempted_at=now, args=state.get("args", []),
        kwargs=state.get("kwargs", {}), backend=task.backend, errors=[],
        worker_ids=[worker_id()])


def stored_value(task: Any, value: Any, where: str = "") -> Any:
    """The return value as the framework stores it, or an UnstorableReturnValue (a TypeError)
    naming the task (and ``where`` it ran, such as a chain's link)."""
    try:
        value = framework.normalize_json(value)
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise UnstorableReturnValue(
            f"Task {task.module_path}{where} returned a value that cannot be stored as JSON "
            f"({error}); return only dicts, lists, strings, numbers, booleans or None."
        ) from None
    return value


def _failed(result: Any, error: BaseException) -> Any:
    """``result`` as a failed attempt leaves it."""
    cls = type(error)
    framework.set_field(result, "status", framework.TaskResultStatus.FAILED)
    framework.set_field(result, "finished_at", timezone.now())
    result.errors.append(framework.TaskError(
        exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
        traceback="".join(format_exception(error))))
    return result


def _succeeded(result: Any, value: Any) -> Any:
    """``result`` as a successful attempt leaves it."""
    framework.set_field(result, "status", framework.TaskResultStatus.SUCCESSFUL)
    framework.set_field(result, "finished_at", timezone.now())
    framework.set_field(result, "_return_value", value)
    return result
