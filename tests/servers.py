"""The servers the integration, reliability and browser suites run against.

``tests.settings`` itself needs none (without ``DATABASE_URL`` it is the demo's embedded SQLite
default), so ``tests/unit`` runs anywhere. The suites that need PostgreSQL and a real broker call
:func:`require_servers` when their conftest is loaded: a missing variable stops the run loudly,
never skips, and never lets a suite fall back to SQLite or the filesystem broker.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def require_servers() -> None:
    """Raise ImproperlyConfigured unless DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL are set."""
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        raise ImproperlyConfigured(
            "The test suite runs against PostgreSQL: set DATABASE_URL=postgres://... "
            "(./dev test sets it to the local server)."
        )
    if "CELERY_BROKER_URL" not in os.environ:
        raise ImproperlyConfigured(
            "The test suite runs a real Celery worker: set CELERY_BROKER_URL (./dev test uses Redis)."
        )
