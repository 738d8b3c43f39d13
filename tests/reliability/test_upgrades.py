"""An upgrade with runs in flight: the previous release's workers run while ``migrate`` does.

A fresh database is migrated by the code of an earlier commit (``OLD_COMMIT``, exported with
``git archive`` from this repository's history), a real Celery worker of that commit runs, and
that code dispatches live runs: some in a long step, some waiting for a signal, some sleeping
in a delay. Then the CURRENT migrations are applied while the old worker works, with a 2 s
``lock_timeout`` (a statement that queued behind the workers' locks would fail the upgrade)
and a writer probing the step table every few milliseconds (how long a worker's write was held
up). The old code dispatches two more runs, which the old worker alone runs on the new schema
(its inserts name none of the new columns). A worker of the current code starts, the old one runs on for a while and is stopped warm,
the waiting runs are signalled, and every run must complete with each step's output merged
once. docs/guide/deploying.md describes the order; docs/reliability.md quotes the figures.

Without git or the commit in the history, the test fails: CI runs on a full clone of main.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connection

from tests import workflows
from tests.integration.conftest import ROOT, Worker

#: Migrations 0001-0008 (the same files as today's): the upgrade applies 0009 to the last one,
#: new tables, columns with checks added online, indexes built and dropped concurrently.
OLD_COMMIT = "b23655f"
#: Steps of the earlier commit's and today's tests/workflows.py alike.
SLOW, STEP_A, STEP_B = "tests.workflows.slow", "tests.workflows.step_a", "tests.workflows.step_b"
#: Rows the step table holds before the upgrade, so a statement that scans it under a lock
#: shows in the probe's figure: 0009 as it was (each check scanned under ACCESS EXCLUSIVE)
#: held a write up for 0.74 s at this size, over the test's 0.5 s bound (0.17-0.32 s now).
FILLER_STEPS = 1_000_000

DISPATCH = """
import json, sys, django
django.setup()
import queuety
token, nap = sys.argv[1], float(sys.argv[2])
runs = {}
for n in range(2):
    runs[f"long{n}"] = (queuety.workflow("upgrade_long").then("%(slow)s").then("%(a)s")
                        .then("%(b)s").dispatch({"sleep": nap, "token": f"{token}-long{n}"}))
for n in range(3):
    runs[f"wait{n}"] = (queuety.workflow("upgrade_wait").then("%(a)s").wait_for_signal("go")
                        .then("%(b)s").dispatch({"token": f"{token}-wait{n}"}))
for n in range(3):
    runs[f"delay{n}"] = (queuety.workflow("upgrade_delay").delay(seconds=nap + 2 * n)
                         .then("%(a)s").then("%(b)s").dispatch({"token": f"{token}-delay{n}"}))
print(json.dumps(runs))
""" % {"slow": SLOW, "a": STEP_A, "b": STEP_B}

#: Runs the old code dispatches once the schema is the new one: the old worker alone runs them.
QUICK = """
import json, sys, django
django.setup()
import queuety
token = sys.argv[1]
print(json.dumps({f"after{n}": queuety.workflow("upgrade_after").then("%(a)s").then("%(b)s")
                  .dispatch({"token": f"{token}-after{n}"}) for n in range(2)}))
""" % {"a": STEP_A, "b": STEP_B}

SIGNAL = """
import json, sys, django
django.setup()
import queuety
for run_id in json.loads(sys.argv[1]):
    queuety.signal(run_id, "go", {"by": "upgrade"})
"""



def _migrations_since_old_commit() -> list[str]:
    """Today's migrations after the old commit's last (0008): what the upgrade applies."""
    names = sorted(path.stem for path in (ROOT / "queuety" / "migrations").glob("[0-9]*.py"))
    return [name for name in names if name[:4] > "0008"]

def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        pytest.fail("The upgrade test needs git to export the earlier commit's tree; install it.")
    return subprocess.run([git, "-C", str(ROOT), *args], capture_output=True, check=False)


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory) -> Path:
    """The tree of ``OLD_COMMIT``, exported from this repository's history."""
    found = _git("rev-parse", "--verify", "--quiet", f"{OLD_COMMIT}^{{commit}}")
    if found.returncode:
        pytest.fail(f"Commit {OLD_COMMIT} is not in the history of {ROOT}: the upgrade test "
                    "needs a full clone (git fetch --unshallow), not a shallow one or an export.")
    tree = tmp_path_factory.mktemp(f"queuety-{OLD_COMMIT}")
    archive = _git("archive", OLD_COMMIT)
    assert archive.returncode == 0, archive.stderr.decode()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


@pytest.fixture
def upgrade_db():
    """A database of its own, dropped at the end (its sessions only are ended first)."""
    name = f"{connection.settings_dict['NAME']}_upgrade"[:63]
    url = urlsplit(os.environ["DATABASE_URL"])
    server = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield urlunsplit(url._replace(path="/" + name))
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _env(tree: Path, database_url: str, queue: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(tree), "CELERY_TASK_DEFAULT_QUEUE": queue,
            "PYTHONDONTWRITEBYTECODE": "1"}


def _run(tree: Path, env: dict[str, str], *args: str) -> str:
    """Run ``python *args`` in ``tree`` (that commit's code); its output, or the test fails."""
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, (f"python {' '.join(args)[:80]} in {tree} exited with "
                                  f"{done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def _fill_steps(database_url: str) -> None:
    """A finished run with ``FILLER_STEPS`` completed step rows (the 0008 schema's columns)."""
    with psycopg.connect(database_url, autocommit=True) as db:
        definition = db.execute(
            "INSERT INTO queuety_workflowdefinition (name, definition, definition_hash,"
            " created_at) VALUES ('upgrade_filler', '{}', 'filler', now()) RETURNING id"
        ).fetchone()[0]
        run = db.execute(
            "INSERT INTO queuety_workflowrun (name, status, state, current_step, total_steps,"
            " revision, transitions, cost_units, started_workflows, loops, created_at,"
            " updated_at, definition_id) VALUES ('upgrade_filler', 'completed', '{}', 0, 1, 0,"
            " 0, 0, 0, '{}', now(), now(), %s) RETURNING id", [definition]).fetchone()[0]
        db.execute(
            "INSERT INTO queuety_steprun (kind, seq, branch, step_index, step_name, status,"
            " attempt, max_attempts, available_at, claimed_by, handler, created_at, run_id)"
            " SELECT 'step', g, 0, 0, 'filler', 'completed', 1, 1, now(), '', '', now(), %s"
            " FROM generate_series(1, %s) g", [run, FILLER_STEPS])
        db.execute("ANALYZE queuety_steprun")


class Probe(threading.Thread):
    """A writer of the step table, as a worker landing a step is: the longest wait it saw."""

    def __init__(self, database_url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.longest, self.writes, self.errors = database_url, 0.0, 0, []
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as db:
            step = db.execute("SELECT min(id) FROM queuety_steprun").fetchone()[0]
            while not self.done.is_set():
                started = time.perf_counter()
                try:
                    db.execute("UPDATE queuety_steprun SET finished_at = now() WHERE id = %s",
                               [step])
                except psycopg.Error as error:  # noqa: PERF203 - recorded, the test fails on it
                    self.errors.append(str(error))
                self.longest = max(self.longest, time.perf_counter() - started)
                self.writes += 1
                time.sleep(0.005)


def _runs(database_url: str, ids: list[int]) -> dict[int, tuple[str, dict]]:
    with psycopg.connect(database_url) as db:
        return {row[0]: (row[1], row[2]) for row in db.execute(
            "SELECT id, status, state FROM queuety_workflowrun WHERE id = ANY(%s)", [ids])}


def _wait_until(database_url: str, ids: list[int], statuses: set[str], timeout: float,
                workers: list[Worker]) -> dict[int, tuple[str, dict]]:
    deadline = time.monotonic() + timeout
    while True:
        runs = _runs(database_url, ids)
        if all(status in statuses for status, _ in runs.values()):
            return runs
        if time.monotonic() > deadline:
            logs = "\n".join(handle.log()[-2500:] for handle in workers)
            late = {run_id: status for run_id, (status, _) in runs.items()
                    if status not in statuses}
            raise AssertionError(f"Runs {late} are not {sorted(statuses)} after {timeout}s "
                                 f"of the upgrade.\n{logs}")
        time.sleep(0.2)


def _schema(database_url: str) -> set[tuple]:
    """The indexes and constraints of the queuety tables, as PostgreSQL describes them."""
    with psycopg.connect(database_url) as db:
        indexes = db.execute("SELECT tablename, indexname, indexdef FROM pg_indexes "
                             "WHERE tablename LIKE 'queuety%%'").fetchall()
        constraints = db.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), convalidated"
            " FROM pg_constraint WHERE conrelid::regclass::text LIKE 'queuety%%'").fetchall()
        invalid = db.execute("SELECT indexrelid::regclass::text FROM pg_index "
                             "WHERE NOT indisvalid").fetchall()
    return {("index", *row) for row in indexes} | {("constraint", *row) for row in constraints} \
        | {("invalid index", *row) for row in invalid}


def test_upgrade__runs_in_flight_complete_across_a_migrate_under_old_workers(
        old_tree, upgrade_db, tmp_path, figures):
    started = time.monotonic()
    queue = f"upgrade-{uuid.uuid4().hex[:8]}"
    old_env = _env(old_tree, upgrade_db, queue)
    new_env = _env(ROOT, upgrade_db, queue)
    _run(old_tree, old_env, "manage.py", "migrate", "-v0")
    filling = time.monotonic()
    _fill_steps(upgrade_db)
    fill_seconds = time.monotonic() - filling

    old = _worker(tmp_path / "old", old_tree, old_env, queue)
    new = _worker(tmp_path / "new", ROOT, new_env, queue)
    try:
        old.start()
        token = uuid.uuid4().hex[:8]
        runs = json.loads(_run(old_tree, old_env, "-c", DISPATCH, token, "12"))
        _wait_until(upgrade_db, [runs["wait0"], runs["wait1"], runs["wait2"]],
                    {"waiting_for_signal"}, 30, [old])

        at_migrate = _runs(upgrade_db, list(runs.values()))
        in_flight = {name: at_migrate[run_id][0] for name, run_id in runs.items()}
        probe = Probe(upgrade_db)
        probe.start()
        migrate_started = time.monotonic()
        output = _run(ROOT, {**new_env, "PGOPTIONS": "-c lock_timeout=2s"},
                      "manage.py", "migrate", "-v2")
        migrate_seconds = time.monotonic() - migrate_started
        probe.done.set()
        probe.join()
        assert not probe.errors, probe.errors
        after = json.loads(_run(old_tree, old_env, "-c", QUICK, token))
        _wait_until(upgrade_db, list(after.values()), {"completed"}, 30, [old])
        runs.update(after)

        new.start()
        time.sleep(3)  # both releases' workers take steps
        old.stop()  # warm: it finishes what it runs
        _run(ROOT, new_env, "-c", SIGNAL, json.dumps([runs[f"wait{n}"] for n in range(3)]))
        finished = _wait_until(upgrade_db, list(runs.values()), {"completed", "failed",
                                                                 "cancelled"}, 60, [old, new])
    finally:
        old.stop()
        new.stop()

    for name, run_id in runs.items():
        status, state = finished[run_id]
        assert status == "completed", f"Run {name} (id {run_id}) ended {status}: {state}"
        assert state["log"] == ["a", "b"], f"Run {name} (id {run_id}) merged {state['log']}"
        for letter in "ab":
            executed = workflows.marks(f"{token}-{name}-{letter}")
            assert len(executed) == 1, f"Run {name}'s step {letter} ran {len(executed)} times."
    assert _schema(upgrade_db) == _schema(_url_of(connection.settings_dict["NAME"])), \
        "The upgraded database's indexes and constraints differ from a fresh install's."

    applied = re.findall(r"Applying queuety\.(\w+)\.\.\. OK \(([\d.]+)s\)", output)
    assert [name for name, _ in applied] == _migrations_since_old_commit()
    figures.record("upgrade with runs in flight", old_commit=OLD_COMMIT,
                   runs=len(runs), dispatched_after_migrate=len(after), in_flight_at_migrate=sorted(set(in_flight.values())),
                   filler_steps=FILLER_STEPS, fill_s=round(fill_seconds, 1), migrate_s=round(migrate_seconds, 2),
                   migrations={name: float(seconds) for name, seconds in applied},
                   probe_writes=probe.writes, longest_write_ms=round(probe.longest * 1000, 1),
                   total_s=round(time.monotonic() - started, 1))
    assert probe.longest < 0.5, (f"A write of the step table waited {probe.longest:.2f}s for "
                                 "the migration's locks.")


def _worker(log_dir: Path, tree: Path, env: dict[str, str], queue: str) -> Worker:
    log_dir.mkdir()
    handle = Worker(log_dir, queue=queue, concurrency=3)
    handle.cwd, handle.env = tree, env
    return handle


def _url_of(name: str) -> str:
    return urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path="/" + name))
