"""The project's settings plus ``CELERY_DB_REUSE_MAX``: the suggested fix, measured as a variant.

Celery's Django fixup closes every database connection before and after each task unless
``CELERY_DB_REUSE_MAX`` is set (celery/fixups/django.py, ``close_database``), so a stock
worker opens a new PostgreSQL session, with cold catalog caches, for every step. With the
setting, a pool process keeps its connection for 2 x N tasks. Only the benchmark's
"queuety (connections kept)" rows use this module; nothing in the project changes.
"""

from project.settings import *  # noqa: F401,F403

CELERY_DB_REUSE_MAX = 1_000_000
