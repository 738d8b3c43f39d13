"""Django's tasks framework, wherever it comes from: ``django.tasks`` (Django 6.0 and later)
or the ``django-tasks`` backport (``django_tasks``, Django 5.2; the ``queuety-django[tasks]``
extra). The rest of Queuety imports the framework's names from here only."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

if find_spec("django.tasks") is not None:
    from django.tasks import task_backends  # type: ignore[import-untyped, unused-ignore]
    from django.tasks.backends.base import BaseTaskBackend  # type: ignore[import-untyped, unused-ignore]
    from django.tasks.base import (  # type: ignore[import-untyped, unused-ignore]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist  # type: ignore[import-untyped, unused-ignore]
    from django.tasks.exceptions import InvalidTaskBackend as InvalidTaskBackendError  # type: ignore[import-untyped, unused-ignore]
    from django.tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[import-untyped, unused-ignore]
    from django.utils.json import normalize_json  # type: ignore[import-untyped, unused-ignore]

    SOURCE = "django.tasks"
elif find_spec("django_tasks") is not None:  # pragma: no cover - the Django 5.2 virtualenv
    from django_tasks import task_backends  # type: ignore[no-redef, assignment, misc, unused-ignore]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef, assignment, misc, unused-ignore]
    from django_tasks.base import (  # type: ignore[no-redef, assignment, misc, unused-ignore]
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef, assignment, misc, unused-ignore]
        InvalidTaskBackendError,
        TaskResultDoesNotExist,
    )
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef, assignment, misc, unused-ignore]
    from django_tasks.signals import (  # type: ignore[no-redef, assignment, misc, unused-ignore]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json  # type: ignore[no-redef, assignment, misc, unused-ignore]

    SOURCE = "django_tasks"
else:
    raise ImportError(
        "Queuety's tasks backend needs Django's tasks framework: Django 6.0 or later has it "
        "(django.tasks); on Django 5.2 install the backport with "
        "`pip install 'queuety-django[tasks]'` (the django-tasks package).")

__all__ = [
    "SOURCE", "TASK_MAX_PRIORITY", "TASK_MIN_PRIORITY", "BaseTaskBackend", "InvalidTask",
    "InvalidTaskBackendError", "Task", "TaskContext", "TaskError", "TaskResult",
    "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json", "task_backends",
    "task_enqueued", "task_finished", "task_started", "set_field",
]


def set_field(frozen: Any, name: str, value: Any) -> None:
    """Set a field of one of the framework's frozen dataclasses, as its own backends do."""
    object.__setattr__(frozen, name, value)
