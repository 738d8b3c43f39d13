"""The project's settings plus Django's tasks framework on two backends, for ``qbench.tasks_bench``.

``default`` is Queuety's backend (``queuety.tasks_backend.QueuetyBackend``); ``db`` is
django-tasks-db, the framework's reference database backend, whose table lives in the same
``queuety_bench`` database (migrated by ``qbench.tasks_bench``). ``QUEUES`` is empty, which the
framework reads as "any queue name": every test uses a queue of its own, as the other
benchmarks do. Nothing else differs from ``project.settings``, so Queuety's worker runs as
shipped. Only the tasks benchmark's processes use this module.
"""

from project.settings import *  # noqa: F401,F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]

TASKS = {
    "default": {"BACKEND": "queuety.tasks_backend.QueuetyBackend", "QUEUES": []},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []},
}
