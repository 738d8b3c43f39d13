"""The tasks of the tasks benchmark (``qbench.tasks_bench``), one module for both backends.

Imported only under ``qbench.settings_tasks``: the framework checks a task against its
backend when the decorator runs.
"""

from __future__ import annotations

import time
from importlib.util import find_spec

if find_spec("django.tasks") is not None:  # Django 6.0
    from django.tasks import task
else:  # Django 5.2: the django-tasks backport
    from django_tasks import task

_redis = None


@task
def noop() -> None:
    """Do nothing: the throughput workload."""


@task
def stamp(key: str) -> None:
    """LPUSH the time this call started to ``key``: the latency client BLPOPs it."""
    started = time.time()
    global _redis
    if _redis is None:
        import redis

        from qbench import env

        _redis = redis.Redis.from_url(env.REDIS_URL)
    _redis.lpush(key, repr(started))
