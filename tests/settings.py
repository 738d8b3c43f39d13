"""Test settings: the demo project's, with short sweeper and heartbeat periods.

They need no server: without DATABASE_URL / CELERY_BROKER_URL they are the demo's embedded
default (SQLite, filesystem broker), which is all tests/unit needs. The suites that run against
PostgreSQL and a real broker (tests/integration, tests/reliability, tests/browser) check both
variables in their conftest (tests/servers.py) and fail loudly without them.
"""

import json
import os
import uuid

# One queue per test session, shared with the worker subprocess through the environment, so
# messages left over from an earlier session never reach this one's worker.
os.environ.setdefault("CELERY_TASK_DEFAULT_QUEUE", f"queuety-test-{uuid.uuid4().hex[:12]}")
# The suite connects to PostgreSQL directly: prepared statements on, as a direct deployment
# should have them (the demo's default is off, safe behind PgBouncer). The worker subprocesses
# inherit it; tests/reliability/test_pgbouncer.py sets it per worker.
os.environ.setdefault("QUEUETY_PREPARED_STATEMENTS", "1")

from project.settings import *  # noqa: E402,F403

# An app whose workflows.py registers workflows, as a site's would (tests/testapp).
INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]  # noqa: F405

#: A queue with a cost budget of 2 (tests/integration/test_resources.py runs a node for it).
BUDGET_QUEUE = os.environ["CELERY_TASK_DEFAULT_QUEUE"] + "-budget"

QUEUETY = {
    "QUEUE_COST_BUDGETS": {BUDGET_QUEUE: 2},
    "SWEEP_INTERVAL": 1,
    "SWEEP_LEASE": 3.0,
    "STALE_AFTER": 3.0,
    "HEARTBEAT_INTERVAL": 0.5,
    "REDELIVER_AFTER": 3.0,
    "MAX_ETA": 5.0,
    "WORKER_LOST_AFTER": 1.5,
    "WEBHOOK_RETRY_DELAYS": [0.2, 0.5],
    # The webhook tests deliver to a receiver on 127.0.0.1 (tests/integration/test_webhook_ssrf.py
    # turns this off to see such endpoints refused).
    "WEBHOOK_ALLOW_PRIVATE": True,
    "WEBHOOK_TIMEOUT": 2.0,
    # tests/integration/test_agents.py: 20 agent runs share a provider limit of 3 requests.
    "AGENT_LIMITS": {"function:limited": {"concurrency": 3}},
}
# A worker started with QUEUETY_TEST_TIMINGS=shipped runs on the shipped defaults (sweeps every
# 5 s, heartbeats every 10 s, a lost worker after 25 s, a stale step after 60 s), so a test can
# hold recovery to the bounds production sees (tests/reliability/test_recovery_timings.py).
if os.environ.get("QUEUETY_TEST_TIMINGS") == "shipped":
    QUEUETY = {}
# A lane worker started with QUEUETY_TEST_LANE_MAX_ABANDONED=n replaces itself sooner.
if os.environ.get("QUEUETY_TEST_LANE_MAX_ABANDONED"):
    QUEUETY["LANE_MAX_ABANDONED"] = int(os.environ["QUEUETY_TEST_LANE_MAX_ABANDONED"])
# A worker started with QUEUETY_TEST_ADMISSION=starved has no memory headroom by its settings
# (a 1 MB RSS ceiling): it defers every step it claims (tests/integration/test_resources.py).
if os.environ.get("QUEUETY_TEST_ADMISSION") == "starved":
    QUEUETY = {**QUEUETY, "ADMISSION": {"MAX_RSS_MB": 1, "DEFER_SECONDS": 1}}
# A worker started with QUEUETY_TEST_HANDLER_ALIASES='{"old.path": "new.path"}' resolves those
# stored handler paths (tests/integration/test_deploy_check.py: a deploy that renamed one).
if os.environ.get("QUEUETY_TEST_HANDLER_ALIASES"):
    QUEUETY = {**QUEUETY, "HANDLER_ALIASES": json.loads(os.environ["QUEUETY_TEST_HANDLER_ALIASES"])}
# A worker started with QUEUETY_TEST_WEBHOOK_RETRY_DELAYS='[1, 2]' retries webhook deliveries
# after those pauses (tests/reliability/test_faults_features.py: a receiver down for a while).
if os.environ.get("QUEUETY_TEST_WEBHOOK_RETRY_DELAYS"):
    QUEUETY = {**QUEUETY,
               "WEBHOOK_RETRY_DELAYS": json.loads(os.environ["QUEUETY_TEST_WEBHOOK_RETRY_DELAYS"])}
LOGGING["loggers"]["queuety"]["level"] = "INFO"  # noqa: F405
# A worker started with QUEUETY_TEST_SWEEP_LOG=1 logs each sweep's start and end
# (tests/reliability/test_sweep_without_beat.py shows from them that sweeps never overlap).
if os.environ.get("QUEUETY_TEST_SWEEP_LOG"):
    LOGGING["loggers"]["queuety.sweeps"] = {"level": "DEBUG"}  # noqa: F405
# The API fuzzer authenticates every request with HTTP Basic: a fast hasher keeps a request at
# milliseconds instead of a PBKDF2 derivation each (tests only).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# A worker started with QUEUETY_TEST_OBSERVERS=1 records every Queuety signal it sends
# (tests/observers, tests/integration/test_lifecycle_signals.py).
if os.environ.get("QUEUETY_TEST_OBSERVERS"):
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.observers"]  # noqa: F405
# A worker started with PROMETHEUS_MULTIPROC_DIR counts steps and sweeps there
# (tests/integration/test_metrics.py).
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    QUEUETY = {**QUEUETY, "METRICS": True}
# ... and with QUEUETY_TEST_TRACING=1 it traces runs and steps (tests/observers exports them).
if os.environ.get("QUEUETY_TEST_TRACING"):
    QUEUETY = {**QUEUETY, "TRACING": True}

# Django's tasks on Queuety (tests/integration/test_tasks_backend.py): "default" as the demo
# site has it, with a queue no worker consumes; "retrying" with backend-wide job options.
TASKS = {
    "default": {"BACKEND": "queuety.tasks_backend.QueuetyBackend",
                "QUEUES": ["default", "io", "unconsumed"]},
    # No QUEUES: any queue_name (the lane tests' queues are named per run).
    "anyqueue": {"BACKEND": "queuety.tasks_backend.QueuetyBackend", "QUEUES": []},
    "retrying": {"BACKEND": "queuety.tasks_backend.QueuetyBackend",
                 "OPTIONS": {"retry": {"max_attempts": 3, "initial_delay": 0.1, "jitter": 0}}},
}
