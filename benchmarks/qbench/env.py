"""Names, addresses and environment shared by the driver and every process it starts.

Everything the suite touches is its own: databases ``queuety_bench``, ``queuety_big``,
``dbos_bench`` and ``pgbench_step`` on the local PostgreSQL, Redis database 7 and queues named
``qbench-*``. It never touches the test suite's ``test_queuety`` database, Redis db 0 or its
``queuety-test-*`` queues. All addresses are loopback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = Path(os.environ.get("QBENCH_RESULTS", BENCH_DIR / "results"))
SQL_DIR = BENCH_DIR / "sql"

PG_HOST = os.environ.get("QBENCH_PG_HOST", "127.0.0.1")
PG_PORT = os.environ.get("QBENCH_PG_PORT", "5432")
PG_USER = os.environ.get("QBENCH_PG_USER", "postgres")
REDIS_DB = int(os.environ.get("QBENCH_REDIS_DB", "7"))
REDIS_URL = f"redis://127.0.0.1:6379/{REDIS_DB}"

#: QBENCH_DB_SUFFIX=_mine gives a run databases of its own (several runs on one server).
_SUFFIX = os.environ.get("QBENCH_DB_SUFFIX", "")
QUEUETY_DB = f"queuety_bench{_SUFFIX}"
BIG_DB = f"queuety_big{_SUFFIX}"
DBOS_DB = f"dbos_bench{_SUFFIX}"
STEP_DB = f"pgbench_step{_SUFFIX}"
FORBIDDEN_DBS = {"test_queuety", "queuety", "postgres", "template0", "template1"}

#: Queues. Workers start on the idle queue and are pointed at a workload's queue with
#: ``add_consumer``, so messages can be loaded before the clock starts.
IDLE_QUEUE = "qbench-idle"
DEFAULT_QUEUE = "qbench-default"


def pg_url(db: str, scheme: str = "postgres") -> str:
    """Return the URL of database ``db`` on the local server."""
    if db in FORBIDDEN_DBS:
        raise ValueError(f"The benchmarks never use database {db!r}.")
    return f"{scheme}://{PG_USER}@{PG_HOST}:{PG_PORT}/{db}"


def django_env(db: str = QUEUETY_DB) -> dict[str, str]:
    """Environment of a process running the Django project against database ``db``."""
    path = [str(BENCH_DIR), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": pg_url(db),
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_TASK_DEFAULT_QUEUE": DEFAULT_QUEUE,
        # Production-like: DEBUG keeps every SQL statement in memory (Celery warns about it).
        "DJANGO_DEBUG": "0",
        "QUEUETY_LOG_LEVEL": "WARNING",
        # Direct connections: the demo's prepared statements on (off by default, for
        # PgBouncer; docs/deploy/running-workers.md).
        "QUEUETY_PREPARED_STATEMENTS": "1",
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONUNBUFFERED": "1",
    }


def setup_django(db: str = QUEUETY_DB) -> None:
    """Configure and set up Django in this process (the driver and helper subprocesses)."""
    os.environ.update({k: v for k, v in django_env(db).items() if k != "PYTHONPATH"})
    for entry in (str(BENCH_DIR), str(ROOT)):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    import django

    django.setup()
    import project.celery  # noqa: F401 - makes the project's app the current Celery app
