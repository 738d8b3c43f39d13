"""The ceiling: pgbench running the step-boundary transaction on queuety's own tables.

Database ``pgbench_step`` holds queuety's schema (``manage.py migrate``) seeded with
``RUNS`` running runs (sql/ceiling_seed.sql). Two custom scripts:

- ``sql/step_boundary.pgbench``: what any step boundary must do, in one transaction: update
  the run row, complete the step row, insert the next step row (the ceiling of the issue);
- ``sql/queuety_step.pgbench``: queuety's exact per-step SQL: the claim UPDATE (autocommit),
  then BEGIN, the one-statement transition (with its event insert), COMMIT.

The raw Celery "PG chain" peer runs :data:`STEP_SQL` (the first script's statements) over
psycopg in each task.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from qbench import env

RUNS = 10_000


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise RuntimeError(f"{name} not found (looked in PATH and /usr/lib/postgresql/*/bin)")


def psql(db: str, *args: str, timeout: float = 600) -> str:
    """Run psql against ``db`` on the local server; return its stdout."""
    env.pg_url(db)  # refuses databases that are not ours
    command = [_pg_bin("psql"), "-h", env.PG_HOST, "-p", env.PG_PORT, "-U", env.PG_USER,
               "-d", db, "-X", "-q", "-v", "ON_ERROR_STOP=1", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"psql {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


#: Zero values by column type, for NOT NULL columns the scripts do not name (see below).
_ZERO = {"jsonb": "'{}'::jsonb", "integer": "0", "bigint": "0", "smallint": "0",
         "double precision": "0", "boolean": "false", "text": "''",
         "character varying": "''", "timestamp with time zone": "now()"}


def fill_defaults() -> list[str]:
    """Give every NOT NULL column without a default a zero default, in pgbench_step only.

    The schema evolves; the seed and the pgbench scripts name the columns a step boundary
    writes, so a column added later (filled by the ORM in the engine) would break them. A
    database default keeps them working without changing what the measured statements do.
    Returns the columns changed.
    """
    rows = psql(env.STEP_DB, "-At", "-F", "|", "-c",
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name IN ('queuety_workflowrun', "
                "'queuety_steprun', 'queuety_event') AND is_nullable = 'NO' "
                "AND column_default IS NULL AND is_identity = 'NO'").splitlines()
    changed = []
    for row in rows:
        table, column, kind = row.split("|", 2)
        if kind in _ZERO:
            psql(env.STEP_DB, "-c", f'ALTER TABLE {table} ALTER COLUMN "{column}" '
                                    f"SET DEFAULT {_ZERO[kind]}")
            changed.append(f"{table}.{column}")
    return changed


def seed(runs: int = RUNS) -> None:
    """Reset pgbench_step to ``runs`` fresh runs, then CHECKPOINT (as before any pgbench run)."""
    psql(env.STEP_DB, "-v", f"runs={runs}", "-f", str(env.SQL_DIR / "ceiling_seed.sql"))
    psql(env.STEP_DB, "-c", "CHECKPOINT")


def pgbench(script: str, clients: int, seconds: int, runs: int = RUNS) -> dict[str, float]:
    """Run one custom pgbench script for ``seconds``; return TPS and mean latency (ms)."""
    seed(runs)
    command = [_pg_bin("pgbench"), "-h", env.PG_HOST, "-p", env.PG_PORT, "-U", env.PG_USER,
               "-n", "-f", str(env.SQL_DIR / script), "-c", str(clients),
               "-j", str(min(clients, 2)), "-T", str(seconds), "-D", f"nclients={clients}",
               "-D", f"runs={runs}", env.STEP_DB]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"pgbench {script} failed:\n{out[-3000:]}")
    tps = re.search(r"tps = ([\d.]+) \(without initial", out)
    latency = re.search(r"latency average = ([\d.]+) ms", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    if failed and int(failed.group(1)):
        raise RuntimeError(f"pgbench {script}: {failed.group(1)} failed transactions:\n{out}")
    return {"tps": float(tps.group(1)), "latency_ms": float(latency.group(1))}


#: The step-boundary transaction of sql/step_boundary.pgbench, for psycopg (one per task).
STEP_SQL = (
    """UPDATE queuety_workflowrun
          SET state = jsonb_set(state, '{i}', to_jsonb(transitions + 1)),
              current_step = (current_step + 1) %% 3, transitions = transitions + 1,
              revision = revision + 1, updated_at = now()
        WHERE id = %(rid)s
    RETURNING transitions, current_step""",
    """UPDATE queuety_steprun SET status = 'completed', finished_at = now(), output = '{}'
        WHERE run_id = %(rid)s AND status = 'pending'""",
    """INSERT INTO queuety_steprun (run_id, seq, branch, step_index, step_name, status, attempt,
                                    max_attempts, available_at, published_at, claimed_by,
                                    created_at)
       VALUES (%(rid)s, %(seq)s, 0, %(next)s, 'noop', 'pending', 0, 3, now(), now(), '',
               now())""",
)


def step_transaction(conn, rid: int) -> None:
    """Run the step-boundary transaction for run ``rid`` on a psycopg connection."""
    with conn.transaction():
        with conn.cursor() as cursor:
            cursor.execute(STEP_SQL[0], {"rid": rid})
            seq, following = cursor.fetchone()
            cursor.execute(STEP_SQL[1], {"rid": rid})
            cursor.execute(STEP_SQL[2], {"rid": rid, "seq": seq, "next": following})
