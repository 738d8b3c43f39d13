"""Enqueueing a task: its job is a run, written in one statement and published on commit."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils import timezone

from queuety import dispatch
from queuety.jobs import framework, results, specs, unique
from queuety.jobs import options as job_options
from queuety.jobs.task_class import own_options

#: How far in the past a ``run_after`` may be and still be taken for "now": the time it takes
#: to compute a ``run_after`` and enqueue it. Earlier ones are refused.
PAST_GRACE_SECONDS = 1.0


class InvalidTaskArguments(framework.InvalidTask, TypeError):  # type: ignore[misc]
    """A task's arguments cannot be stored as JSON (the framework's ``InvalidTask``, and a
    ``TypeError`` like the one its own backends raise)."""


def enqueue(backend: Any, task: Any, args: Any, kwargs: Any, *,
            key: str | None = None, batch: dict[str, Any] | None = None) -> Any:
    """Start ``task``'s job with ``args`` and ``kwargs`` on ``backend``; return its
    ``TaskResult`` (status ``READY``, its ``id`` the run's). Inside ``transaction.atomic()``
    the job reaches the workers only when the transaction commits, and never if it rolls back.

    Raises:
        InvalidTask: the backend cannot run the task (its own validation), or its
            ``run_after`` is in the past; nothing is enqueued.
        InvalidTaskArguments: an argument is not JSON; nothing is enqueued.

    A unique job's key already taken (``queuety.jobs.unique``) enqueues nothing and returns
    the ``TaskResult`` of the job that holds it, as it stands. ``key`` (a batch's job or
    callback) is such a key given by the caller, in place of the task's unique key; ``batch``
    (a batch's job) is recorded in the job's state as ``"batch"``.
    """
    backend.validate_task(task)
    now = timezone.now()
    delay = _delay(task, now)
    arguments = _arguments(task, list(args), dict(kwargs))
    options = {**job_options.for_task(task.module_path, backend.job_options),
               **own_options(task)}
    spec = specs.spec_for(task, job_options.step_part(options),
                          throttled=options.get("throttle_exceptions") is not None)
    recorded = {"path": task.module_path, "backend": backend.alias,
                "queue_name": task.queue_name, "priority": task.priority,
                "run_after": None if task.run_after is None else task.run_after.isoformat()}
    if key is None:
        key = unique.key_of(task, options, arguments)
        if key is not None:
            unique.expire(key, options, now)
    dispatched = dispatch.dispatch_run(
        spec, {"task": {**recorded, "enqueued_at": now.isoformat()}, **arguments,
               **({} if batch is None else {"batch": batch})},
        delay=delay, idempotency_key=key,
        # The key's job answers whatever run_after, priority or queue this call gives.
        fingerprint={"path": task.module_path, **arguments})
    run_id = dispatched.run_id
    if dispatched.reused:  # a unique job's key was taken: that job answers
        return results.read(str(run_id), backend.alias)
    result = framework.TaskResult(
        task=task, id=str(run_id), status=framework.TaskResultStatus.READY, enqueued_at=now,
        started_at=None, finished_at=None, last_attempted_at=None, args=arguments["args"],
        kwargs=arguments["kwargs"], backend=backend.alias, errors=[], worker_ids=[])
    framework.task_enqueued.send(sender=type(backend), task_result=result)
    return result


def _delay(task: Any, now: datetime) -> float | None:
    """Seconds until the task's ``run_after`` (None: run now)."""
    if task.run_after is None:
        return None
    delay = (task.run_after - now).total_seconds()
    if delay < -PAST_GRACE_SECONDS:
        raise framework.InvalidTask(
            f"Task {task.module_path}'s run_after ({task.run_after.isoformat()}) is "
            f"{-delay:.1f} s in the past; nothing was enqueued. Give a future time, or leave "
            "run_after out to run the task now.")
    return delay if delay > 0 else None


def _arguments(task: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments as JSON, the way the framework normalises them (tuples become lists)."""
    try:
        arguments = {"args": framework.normalize_json(args),
                     "kwargs": framework.normalize_json(kwargs)}
        json.dumps(arguments, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidTaskArguments(
            f"The arguments of task {task.module_path} cannot be stored as JSON ({error}); "
            "nothing was enqueued. Pass ids, strings, numbers, booleans, None, and lists or "
            "dicts of them (a model instance by its pk).") from None
    return arguments


def arguments_of(task: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``{"args": ..., "kwargs": ...}`` as a job of ``task`` stores them (chains and batches
    store theirs the same way).

    Raises:
        InvalidTaskArguments: an argument is not JSON.
    """
    return _arguments(task, args, kwargs)
