"""Queuety as a backend of Django's tasks framework (docs/guide/tasks.md)::

    TASKS = {
        "default": {
            "BACKEND": "queuety.tasks_backend.QueuetyBackend",
            "QUEUES": ["default", "io"],
            "OPTIONS": {"retry": {"max_attempts": 3}, "timeout": 60},
        },
    }

Each enqueued task is a job: a run of a one-step workflow on Queuety's Celery workers, with a
step's guarantees (``queuety.jobs``). On Django 5.2 the framework is the ``django-tasks``
backport (``pip install 'queuety-django[tasks]'``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from queuety import exceptions
from queuety.jobs import enqueue as enqueueing
from queuety.jobs import framework, results
from queuety.jobs import options as job_options
from queuety.jobs.task_class import QueuetyTask


class QueuetyBackend(framework.BaseTaskBackend):  # type: ignore[misc]
    """Runs tasks as Queuety jobs: durable, retried by policy, deferred in the database,
    their results kept with the run."""

    #: The framework's Task with Queuety's job options as fields (``@task(timeout=30)``
    #: where the framework passes extra keywords on: the backport, Django 6.1).
    task_class = QueuetyTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        try:
            #: The options of this backend's jobs (``OPTIONS``), checked once here.
            self.job_options = job_options.check(self.options, f"TASKS[{alias!r}]['OPTIONS']")
        except exceptions.WorkflowDefinitionError as error:
            raise framework.InvalidTaskBackendError(str(error)) from None

    def validate_task(self, task: Any) -> None:
        """Refuse what this backend cannot run, with the framework's ``InvalidTask`` and a
        message naming the task and the fix."""
        try:
            super().validate_task(task)
        except framework.InvalidTask as error:
            if self.queues and task.queue_name not in self.queues:
                raise framework.InvalidTask(
                    f"Task {task.module_path} is on queue {task.queue_name!r}, which the tasks "
                    f"backend {self.alias!r} does not list: add it to TASKS[{self.alias!r}]"
                    f"['QUEUES'] (now {sorted(self.queues)}) or pick one of those."
                ) from None
            raise framework.InvalidTask(f"Task {task.module_path}: {error}") from None

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Start ``task``'s job; see :func:`queuety.jobs.enqueue.enqueue`."""
        return enqueueing.enqueue(self, task, args, kwargs)

    def get_result(self, result_id: str) -> Any:
        """The job ``result_id`` as a ``TaskResult``, read from its run.

        Raises:
            TaskResultDoesNotExist: no job of this backend has that id.
        """
        result = results.read(result_id, self.alias)
        if result.backend != self.alias:
            raise framework.TaskResultDoesNotExist(
                f"Job {result_id} was enqueued on the tasks backend {result.backend!r}, not "
                f"{self.alias!r}; read it with task.using(backend={result.backend!r}).")
        return result

    def check(self, **kwargs: Any) -> Iterable[Any]:
        """The framework's system checks of this backend: none beyond the settings, which
        ``__init__`` validates."""
        return []
