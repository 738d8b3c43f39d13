"""Fresh databases for every invocation, the Redis database cleared, and the machine's facts.

The project's migrations are edited in place during development, so the suite drops and
re-creates its own databases (never any other) and migrates them with the working tree's
code on every run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

import psycopg
import redis

from qbench import env

OWN_DBS = (env.QUEUETY_DB, env.STEP_DB, env.DBOS_DB, env.BIG_DB)


def _admin():
    return psycopg.connect(f"postgresql://{env.PG_USER}@{env.PG_HOST}:{env.PG_PORT}/postgres",
                           autocommit=True, connect_timeout=5)


def recreate(db: str) -> None:
    """Drop (closing its sessions) and create one of the suite's own databases."""
    if db not in OWN_DBS:
        raise ValueError(f"refusing to recreate {db!r}: not a benchmark database")
    with _admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')


def exists(db: str) -> bool:
    with _admin() as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            [db]).fetchone() is not None


def migrate(db: str) -> None:
    """Apply the project's migrations to ``db`` (``manage.py migrate``)."""
    subprocess.run([sys.executable, str(env.ROOT / "manage.py"), "migrate", "-v", "0"],
                   check=True, env=env.django_env(db), cwd=env.ROOT, timeout=600)


def fresh_databases(dbs=(env.QUEUETY_DB, env.STEP_DB, env.DBOS_DB)) -> None:
    """Recreate the per-run databases; migrate the two that hold queuety's schema."""
    from qbench import ceiling

    for db in dbs:
        recreate(db)
        if db != env.DBOS_DB:
            migrate(db)
        if db == env.STEP_DB:
            ceiling.fill_defaults()


def clear_redis() -> None:
    """Empty the suite's own Redis database (db 7 unless QBENCH_REDIS_DB says otherwise)."""
    if env.REDIS_DB == 0:
        raise ValueError("the benchmarks never use Redis database 0 (the test suite's)")
    client = redis.Redis.from_url(env.REDIS_URL)
    client.flushdb()
    client.close()


def check_services() -> None:
    """Fail early, naming what is unreachable."""
    problems = []
    try:
        _admin().close()
    except Exception as error:  # noqa: BLE001
        problems.append(f"PostgreSQL at {env.PG_HOST}:{env.PG_PORT}: {error}")
    try:
        redis.Redis.from_url(env.REDIS_URL, socket_connect_timeout=5).ping()
    except Exception as error:  # noqa: BLE001
        problems.append(f"Redis at {env.REDIS_URL}: {error}")
    if problems:
        raise SystemExit("benchmarks: unreachable services:\n  " + "\n  ".join(problems))


def machine() -> dict[str, str]:
    """The facts the report states: CPU, memory, versions, the commit measured."""
    facts: dict[str, str] = {"nproc": str(os.cpu_count())}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                facts["memory"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    facts["kernel"] = platform.release()
    facts["python"] = platform.python_version()
    with _admin() as conn:
        facts["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
        settings = conn.execute(
            "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) "
            "FROM pg_settings "
            "WHERE name IN ('fsync', 'synchronous_commit', 'shared_buffers', "
            "'max_connections', 'wal_sync_method')").fetchone()[0]
        facts["postgresql_settings"] = settings
    facts["redis server"] = redis.Redis.from_url(env.REDIS_URL).info("server")["redis_version"]
    # The run's own load is not in it yet: this is the machine before the run (shared cores).
    facts["load average at start (1, 5, 15 min)"] = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    for package in ("celery", "kombu", "billiard", "redis", "Django", "psycopg", "dbos",
                    "SQLAlchemy", "django-celery-beat", "django-tasks", "django-tasks-db"):
        try:
            facts[f"{package} (Python package)"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            facts[f"{package} (Python package)"] = "-"
    try:
        facts["pgbench"] = subprocess.run(["pgbench", "--version"], capture_output=True,
                                          text=True).stdout.strip()
    except OSError:
        from qbench.ceiling import _pg_bin

        facts["pgbench"] = subprocess.run([_pg_bin("pgbench"), "--version"],
                                          capture_output=True, text=True).stdout.strip()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(env.ROOT), *args], capture_output=True,
                              text=True).stdout.strip()

    facts["commit"] = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "queuety", "project")
    facts["working_tree"] = (f"{len(dirty.splitlines())} uncommitted changes in queuety/ "
                             "and project/") if dirty else "clean"
    return facts
