"""The one-step workflow a task's jobs are runs of.

A task's workflow is named ``task:<module path>``; its step, named after the function, calls
:func:`queuety.jobs.execute.call_task` (``acall_task`` for an ``async def`` task). The task's
queue and priority are the workflow's, so every ``.using()`` combination is a definition of its
own, stored once and cached like any other.
"""

from __future__ import annotations

from functools import lru_cache
from inspect import iscoroutinefunction
from typing import Any

from queuety.core.builder import workflow
from queuety.core.definition import WorkflowSpec

#: What a task workflow's name starts with; the rest is the task's module path.
PREFIX = "task:"
#: Django's name for the queue a task runs on when it names none.
DEFAULT_QUEUE_NAME = "default"
SYNC_HANDLER = "queuety.jobs.execute.call_task"
ASYNC_HANDLER = "queuety.jobs.execute.acall_task"
#: The handlers of a job throttled after exceptions (``queuety.jobs.throttle``).
THROTTLED_HANDLERS = ("queuety.jobs.throttle.call_throttled",
                      "queuety.jobs.throttle.acall_throttled")


def is_job(workflow_name: str) -> bool:
    """Whether runs of ``workflow_name`` are jobs (a task's runs)."""
    return workflow_name.startswith(PREFIX)


def band(priority: int) -> str | None:
    """Queuety's priority for the framework's ``priority`` (-100 to 100): above 0 runs as
    ``"high"``, below 0 as ``"low"``, 0 as normal (None). Three bands: within a band,
    jobs start in the order they were enqueued."""
    if priority > 0:
        return "high"
    if priority < 0:
        return "low"
    return None


def celery_queue(queue_name: str) -> str | None:
    """The Celery queue of a task's ``queue_name``: ``"default"`` is ``QUEUETY["QUEUE"]``'s
    (None), any other name the Celery queue of that name (``"io"``: the I/O lane's)."""
    return None if queue_name == DEFAULT_QUEUE_NAME else queue_name


def spec_for(task: Any, options: dict[str, Any], *, throttled: bool = False) -> WorkflowSpec:
    """The workflow whose runs are ``task``'s jobs, for its queue, priority and ``options``
    (checked by ``queuety.jobs.options``); ``throttled``: its step checks the task's
    throttle after exceptions first."""
    options = dict(options)
    queue = options.pop("queue", None) or celery_queue(task.queue_name)
    is_async = iscoroutinefunction(task.func)
    handler = (THROTTLED_HANDLERS[is_async] if throttled
               else ASYNC_HANDLER if is_async else SYNC_HANDLER)
    return _spec(task.module_path, task.name, handler, queue, band(task.priority),
                 tuple(sorted(options.items())))


@lru_cache(maxsize=1024)
def _spec(module_path: str, name: str, handler: str, queue: str | None,
          priority: str | None, options: tuple[tuple[str, Any], ...]) -> WorkflowSpec:
    builder = workflow(PREFIX + module_path).then(handler, name=name, **dict(options))
    if queue is not None:
        builder = builder.on_queue(queue)
    if priority is not None:
        builder = builder.with_priority(priority)
    return builder.build()
