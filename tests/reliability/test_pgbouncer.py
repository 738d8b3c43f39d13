"""Queuety behind a real PgBouncer in transaction mode (the usual production topology).

A private ``pgbouncer`` (Debian's 1.18: no prepared-statement support) listens on a free port
in front of the session's test database, with ``pool_mode = transaction`` and a small server
pool, so that consecutive transactions of one client land on different server sessions. A
Celery worker (two pool processes and beat) connects through it; so do the runs' dispatches,
signals and an idempotency race.

- With prepared statements off (Django's default, and the demo's): a workload of three-step
  runs, signal waits and a dispatch race all complete, each output merged once, and nothing
  about prepared statements is logged.
- With them on (``QUEUETY_PREPARED_STATEMENTS=1``, ``prepare_threshold = 5``), which such a
  pooler cannot keep: a statement fails at Parse or Bind; the process logs ONE error naming the
  fix and prepares nothing more, and every run still completes with each output merged once.

``./dev test`` installs Debian's pgbouncer when it is missing; without it this module fails,
it does not skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db import OperationalError, connection

import queuety
from queuety.models import Event, WorkflowRun
from queuety.store import rows
from tests import workflows
from tests.integration.conftest import ROOT
from tests.reliability.chaos import PoolWorker, delete_queue, free_port, publishing_to

FIX = "goes through a pooler that does not keep prepared statements"
RUNS = 60
SIGNAL_RUNS = 6
CONTENDERS = 8


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
         if os.access(path, os.X_OK)), None)
    if found is None:
        pytest.fail("pgbouncer is not installed: tests/reliability/test_pgbouncer.py runs the "
                    "workload through a real PgBouncer. Install Debian's (apt-get install "
                    "pgbouncer); ./dev test does it when it runs as root.", pytrace=False)
    return found


class PgBouncer:
    """A private ``pgbouncer`` in transaction mode in front of the machine's PostgreSQL."""

    def __init__(self, log_dir: Path, pool_size: int = 2) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.config = log_dir / "pgbouncer.ini"
        upstream = urlsplit(os.environ["DATABASE_URL"])
        host, port = upstream.hostname or "127.0.0.1", upstream.port or 5432
        # auth_type = any: every client logs in as the user named here (no userlist to keep).
        self.config.write_text(f"""\
[databases]
* = host={host} port={port} user={upstream.username or "postgres"}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options
""")
        self.proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / "pgbouncer.log"

    def start(self) -> None:
        command = [pgbouncer_binary(), str(self.config)]
        if os.geteuid() == 0:  # it refuses to run as root; it reads its config before
            command[1:1] = ["-u", "nobody"]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}:\n"
                                   + self.log_path.read_text()[-2000:])
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not answer on port {self.port} within 15 s:\n"
                           + self.log_path.read_text()[-2000:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def url(self, database: str) -> str:
        user = urlsplit(os.environ["DATABASE_URL"]).username or "postgres"
        return f"postgres://{user}@127.0.0.1:{self.port}/{database}"


@pytest.fixture(scope="module")
def bouncer(tmp_path_factory):
    server = PgBouncer(tmp_path_factory.mktemp("pgbouncer"))
    server.start()
    yield server
    server.stop()


@contextmanager
def bounced_worker(bouncer: PgBouncer, log_dir: Path, *, prepared: bool):
    """A worker (2 pool processes, beat) whose every connection goes through ``bouncer``."""
    queue = f"queuety-pgbouncer-{uuid.uuid4().hex[:10]}"
    broker = os.environ["CELERY_BROKER_URL"]
    worker = PoolWorker(log_dir, broker, queue, beat=True, concurrency=2,
                        name="prepared" if prepared else "unprepared")
    worker.env["DATABASE_URL"] = bouncer.url(connection.settings_dict["NAME"])
    worker.env["QUEUETY_PREPARED_STATEMENTS"] = "1" if prepared else "0"
    worker.start()
    try:
        with publishing_to(broker, queue):
            yield worker
    finally:
        worker.stop()
        delete_queue(broker, queue)


@contextmanager
def through(bouncer: PgBouncer):
    """This process's connections (every thread's) go through ``bouncer``, unprepared.

    Every thread's connection is made from the one settings dict ``connection`` holds."""
    settings_dict = connection.settings_dict
    saved = {key: settings_dict.get(key) for key in ("HOST", "PORT", "OPTIONS")}
    connection.close()
    settings_dict.update(HOST="127.0.0.1", PORT=bouncer.port, OPTIONS={
        key: value for key, value in (saved["OPTIONS"] or {}).items()
        if key != "prepare_threshold"})
    try:
        yield
    finally:
        connection.close()
        settings_dict.update(saved)


def wait_all(run_ids, worker, timeout: float, statuses=("completed", "failed", "cancelled")
             ) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        found = dict(WorkflowRun.objects.filter(pk__in=run_ids).values_list("pk", "status"))
        if all(status in statuses for status in found.values()) and len(found) == len(run_ids):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"Runs not finished after {timeout} s: "
                                 f"{Counter(found.values())}\n{worker.log()[-4000:]}")
        time.sleep(0.1)


def merged_once(run_ids, letters: list[str]) -> list[str]:
    """What is wrong with the runs' merged outputs (nothing: each step's output merged once)."""
    problems = []
    completions = Counter(Event.objects.filter(run_id__in=run_ids, kind="step_completed")
                          .values_list("run_id", "step_index"))
    for run_id, state in WorkflowRun.objects.filter(pk__in=run_ids).values_list("pk", "state"):
        if state.get("log") != letters:
            problems.append(f"run {run_id}: log {state.get('log')}")
    problems += [f"run {run_id} step {index}: {count} completions"
                 for (run_id, index), count in completions.items() if count != 1]
    return problems


def race_dispatch(bouncer: PgBouncer, worker: PoolWorker, key: str) -> list[int]:
    """``CONTENDERS`` processes dispatch one idempotency key at once, through the pooler."""
    env = {**worker.env, "DATABASE_URL": bouncer.url(connection.settings_dict["NAME"])}
    contenders = [subprocess.Popen(
        [sys.executable, "-m", "tests.race_dispatch", key, worker.queue],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
        for _ in range(CONTENDERS)]
    ids = []
    try:
        for process in contenders:
            assert process.stdout.readline().strip() == "ready", process.stderr.read()
        for process in contenders:
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in contenders:
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, err
            ids.append(int(out.split()[0]))
    finally:  # a contender left waiting at the line would wait on after a failure
        for process in contenders:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return ids


def test_pgbouncer__the_errors_of_lost_prepared_statements_are_recognised(bouncer):
    """What PostgreSQL answers through PgBouncer 1.18 when clients prepare statements (as
    psycopg does with ``prepare_threshold``): each error is recognised as a pooler mismatch,
    with the fix; no other error is.

    The pool of the maintenance database has two server sessions, and an open transaction
    pins one of them, so that each autocommit statement of the clients lands on the other.
    """
    url = bouncer.url("postgres")
    pinning = [psycopg.connect(url) for _ in range(2)]

    def pin(holder: int) -> int:
        """Hold a server session in a transaction; return its backend pid."""
        return pinning[holder].execute("SELECT pg_backend_pid()").fetchone()[0]

    def client():
        return psycopg.connect(url, autocommit=True, prepare_threshold=0)

    one, two, three = client(), client(), client()
    errors = {}

    def expect(conn, params: list[int]) -> None:
        query = " + ".join(["%s::int"] * len(params))
        with pytest.raises(psycopg.Error) as raised:
            conn.execute(f"SELECT {query}", params)
        errors[raised.value.sqlstate] = raised.value

    try:
        first = pin(0)                      # pins server session A; B is the free one
        one.execute("SELECT %s::int", [1])  # prepares _pg3_0 (1 parameter) on B
        assert pin(1) != first              # pins B
        pinning[0].commit()                 # A is the free one now
        expect(one, [1])                    # _pg3_0 is on B, not on A: does not exist
        two.execute("SELECT %s::int + %s::int", [1, 2])  # prepares _pg3_0 (2) on A
        pin(0)                              # pins A
        pinning[1].commit()                 # B is the free one now
        expect(two, [1, 2])                 # B's _pg3_0 takes 1 parameter
        expect(three, [1, 2, 3])            # a new _pg3_0 on B, which has one already
    finally:
        for conn in (*pinning, one, two, three):
            conn.close()

    seen = {sqlstate: str(error) for sqlstate, error in errors.items()}
    assert set(seen) == {"26000", "42P05", "08P01"}, seen
    assert re.fullmatch(r'prepared statement "_pg3_\d+" does not exist', seen["26000"])
    assert re.fullmatch(r'prepared statement "_pg3_\d+" already exists', seen["42P05"])
    assert re.fullmatch(r'bind message supplies 2 parameters, but prepared statement '
                        r'"_pg3_\d+" requires 1', seen["08P01"])
    assert all(rows.pooler_mismatch(error) is not None for error in errors.values()), seen
    # As Django raises them: its own class, the driver's error as the cause.
    wrapped = OperationalError(str(errors["08P01"]))
    wrapped.__cause__ = errors["08P01"]
    assert rows.pooler_mismatch(wrapped) == rows.pooler_mismatch(errors["26000"])
    fix = rows.pooler_mismatch(psycopg.errors.InvalidSqlStatementName(seen["26000"]))
    assert fix is not None and "remove OPTIONS['prepare_threshold'] from DATABASES['default']" \
        in fix and "PgBouncer 1.21" in fix
    # PgBouncer's own errors are 08P01 too: they are lost connections, not a mismatch.
    for other in (psycopg.errors.ProtocolViolation("query_wait_timeout"),
                  psycopg.errors.ProtocolViolation("server conn crashed?"),
                  psycopg.errors.InvalidSqlStatementName('cursor "c1" does not exist'),
                  psycopg.errors.UniqueViolation("prepared statement already exists")):
        assert rows.pooler_mismatch(other) is None, other


def test_pgbouncer__unprepared__runs_signals_and_a_dispatch_race_all_complete_merged_once(
        quiet_session_worker, bouncer, tmp_path, figures):
    started = time.monotonic()
    with bounced_worker(bouncer, tmp_path, prepared=False) as worker, through(bouncer):
        three = (queuety.workflow("pgbouncer_three").then(workflows.step_a)
                 .then(workflows.step_b).then(workflows.step_c))
        waiting = (queuety.workflow("pgbouncer_signal").then(workflows.step_a)
                   .wait_for_signal("go").then(workflows.step_c))
        prefix = uuid.uuid4().hex[:8]
        run_ids = [three.dispatch({"token": f"{prefix}-{n}"}) for n in range(RUNS)]
        signal_ids = [waiting.dispatch({"token": f"{prefix}-s{n}"}) for n in range(SIGNAL_RUNS)]
        wait_all(signal_ids, worker, 30, statuses=("waiting_for_signal", "failed"))
        answers: list = [None] * SIGNAL_RUNS

        def answer(n: int) -> None:
            try:
                answers[n] = queuety.signal(signal_ids[n], "go", {"n": n}).settled
            finally:
                connection.close()

        threads = [threading.Thread(target=answer, args=(n,)) for n in range(SIGNAL_RUNS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        key = f"pgbouncer-race:{prefix}"
        race_ids = race_dispatch(bouncer, worker, key)
        statuses = wait_all(run_ids + signal_ids + race_ids[:1], worker, 40)
        elapsed = time.monotonic() - started
        log = worker.log()

    assert Counter(statuses.values()) == {"completed": RUNS + SIGNAL_RUNS + 1}, log[-4000:]
    assert answers == [True] * SIGNAL_RUNS
    assert len(set(race_ids)) == 1 and WorkflowRun.objects.filter(idempotency_key=key).count() == 1
    assert merged_once(run_ids, ["a", "b", "c"]) == []
    assert merged_once(signal_ids, ["a", "c"]) == []
    assert merged_once(race_ids[:1], ["a"]) == []
    assert FIX not in log and "prepared statement" not in log, log[-4000:]
    figures.record("pgbouncer_unprepared", runs=RUNS, signal_runs=SIGNAL_RUNS,
                   race_contenders=CONTENDERS, seconds=round(elapsed, 1))


def test_pgbouncer__prepared__the_mismatch_is_logged_once_with_the_fix_and_nothing_merged_twice(
        quiet_session_worker, bouncer, tmp_path, figures):
    started = time.monotonic()
    # Dispatched over this process's direct connection: only the worker prepares.
    with bounced_worker(bouncer, tmp_path, prepared=True) as worker:
        three = (queuety.workflow("pgbouncer_prepared").then(workflows.step_a)
                 .then(workflows.step_b).then(workflows.step_c))
        prefix = uuid.uuid4().hex[:8]
        run_ids = [three.dispatch({"token": f"{prefix}-{n}"}) for n in range(RUNS)]
        statuses = wait_all(run_ids, worker, 45)
        elapsed = time.monotonic() - started
        log = worker.log()

    # Celery's own lines ("[time: ERROR/ForkPoolWorker-N] ..."); the demo's LOGGING prints
    # every queuety record a second time, bare, through its console handler.
    errors = [line for line in log.splitlines() if FIX in line and line.startswith("[")]
    per_process = Counter(re.search(r"\(pid (\d+)\)", line).group(1) for line in errors)
    assert errors, "no pooler mismatch was reported:\n" + log[-4000:]
    assert all(count == 1 for count in per_process.values()), errors
    assert len(per_process) <= 2, errors  # the two pool processes
    assert all(": ERROR/ForkPoolWorker-" in line and "remove OPTIONS['prepare_threshold'] "
               "from DATABASES['default']" in line for line in errors), errors
    assert Counter(statuses.values()) == {"completed": RUNS}, log[-4000:]
    assert merged_once(run_ids, ["a", "b", "c"]) == []
    reruns = sum(max(0, len(workflows.marks(f"{prefix}-{n}-{letter}")) - 1)
                 for n in range(RUNS) for letter in "abc")
    figures.record("pgbouncer_prepared", runs=RUNS, seconds=round(elapsed, 1),
                   processes_reporting=len(per_process), handler_reruns=reruns,
                   sqlstates=sorted(set(re.findall(r"SQLSTATE (\w+)", "\n".join(errors)))))
    # The refused statement never ran: it runs again at once, unprepared, so no handler runs
    # a second time (the sweeper used to take the attempt for a lost worker's).
    assert reruns == 0, reruns
