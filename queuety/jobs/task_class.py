"""The backend's ``Task`` class: the framework's, with Queuety's job options as fields.

Where the framework's ``@task`` passes extra keyword arguments on to the backend's
``task_class`` (the django-tasks backport, and Django 6.1), a task takes the job options
directly: ``@task(retry=queuety.RetryPolicy(max_attempts=5), timeout=30)``. On Django 6.0, whose
``@task`` takes none, ``@queuety.job_options(...)`` over ``@task`` gives the same. Options given
here win over ``job_options()``'s, which win over the backend's ``OPTIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from queuety import exceptions
from queuety.jobs import framework
from queuety.jobs import options as job_options


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuetyTask(framework.Task):  # type: ignore[misc]
    """A task of the Queuety backend; each option is None unless the task sets it."""

    retry: Any = None
    timeout: float | None = None
    cost_units: int | None = None
    concurrency_group: str | None = None
    concurrency_limit: int | None = None
    rate_limit: tuple[int, float] | None = None
    queue: str | None = None
    unique_for: float | None = None
    unique_key: Any = None

    def __post_init__(self) -> None:
        # Zero-argument super() does not work in a dataclass with slots.
        framework.Task.__post_init__(self)
        given = own_options(self)
        if not given:
            return
        try:
            checked = job_options.check(given, f"task {self.module_path}")
        except exceptions.WorkflowDefinitionError as error:
            raise framework.InvalidTask(str(error)) from None
        for name, value in checked.items():  # a retry dict as a RetryPolicy, and so on
            framework.set_field(self, name, value)


#: The fields of QueuetyTask that are job options.
OPTION_FIELDS = tuple(field.name for field in fields(QueuetyTask)
                      if field.name in job_options.NAMES)


def own_options(task: Any) -> dict[str, Any]:
    """The job options ``task`` sets itself (none for a task of the framework's own class)."""
    return {name: value for name in OPTION_FIELDS
            if (value := getattr(task, name, None)) is not None}
