"""Test settings: the demo project's, on PostgreSQL, with short sweeper and heartbeat periods."""

import os
import uuid

from django.core.exceptions import ImproperlyConfigured

if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
    raise ImproperlyConfigured(
        "The test suite runs against PostgreSQL: set DATABASE_URL=postgres://... "
        "(./dev test sets it to the local server)."
    )
if "CELERY_BROKER_URL" not in os.environ:
    raise ImproperlyConfigured(
        "The test suite runs a real Celery worker: set CELERY_BROKER_URL (./dev test uses Redis)."
    )
# One queue per test session, shared with the worker subprocess through the environment, so
# messages left over from an earlier session never reach this one's worker.
os.environ.setdefault("CELERY_TASK_DEFAULT_QUEUE", f"queuety-test-{uuid.uuid4().hex[:12]}")

from project.settings import *  # noqa: E402,F403

QUEUETY = {
    "SWEEP_INTERVAL": 1,
    "STALE_AFTER": 3.0,
    "HEARTBEAT_INTERVAL": 0.5,
    "REDELIVER_AFTER": 3.0,
    "MAX_ETA": 5.0,
}
LOGGING["loggers"]["queuety"]["level"] = "INFO"  # noqa: F405
# The API fuzzer authenticates every request with HTTP Basic: a fast hasher keeps a request at
# milliseconds instead of a PBKDF2 derivation each (tests only).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
