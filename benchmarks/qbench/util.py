"""Helpers: statistics, the processes the suite starts (always stopped by PID), RSS from /proc.

Every subprocess is started in its own session, remembered in ``STARTED`` and stopped by its
process-group id (= its PID) by :func:`stop_all`, which the driver runs on exit and on
SIGINT/SIGTERM. Nothing else is ever signalled.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from qbench import env

STARTED: list[subprocess.Popen] = []


# -- statistics -------------------------------------------------------------------------------

def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``values``."""
    data = sorted(values)
    if not data:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(data)))
    return data[rank - 1]


def spread(values: Iterable[float]) -> dict[str, float]:
    """Median, min and max of per-round figures."""
    data = [v for v in values if v is not None and not math.isnan(v)]
    if not data:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": statistics.median(data), "min": min(data), "max": max(data),
            "n": len(data)}


# -- processes --------------------------------------------------------------------------------

def start(command: list[str], *, log: Path, environ: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen:
    """Start ``command`` in its own session with output to ``log``; remember it for stop_all."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, cwd=cwd or env.RESULTS_DIR, env=environ or os.environ,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    STARTED.append(proc)
    return proc


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Stop a process we started, and its children, by its process-group id (its PID)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    else:
        # The leader exited; its pool children (same group) might not have.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc in STARTED:
        STARTED.remove(proc)


def stop_all() -> None:
    """Stop every process this driver started and has not stopped yet."""
    for proc in list(STARTED):
        stop(proc, timeout=15)


def run_json(command: list[str], *, environ: dict[str, str], log: Path,
             timeout: float) -> dict[str, Any]:
    """Run a helper script that prints one JSON object as its last stdout line; return it."""
    import json

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        proc = subprocess.Popen(command, cwd=env.RESULTS_DIR, env=environ,
                                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        STARTED.append(proc)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc, signal.SIGKILL)
            raise RuntimeError(f"{command[:4]} did not finish within {timeout:.0f}s; see {log}")
        finally:
            if proc in STARTED and proc.poll() is not None:
                STARTED.remove(proc)
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command[:4])} failed ({proc.returncode}); see {log}:\n"
                           + log.read_text()[-3000:])
    return json.loads(lines[-1])


def descendants(pid: int) -> list[int]:
    """PIDs of ``pid``'s children, grandchildren, ... (from /proc/PID/task/*/children)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


def rss_kib(pid: int) -> int:
    """Resident set size of one process in KiB (VmRSS), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# -- Celery workers ---------------------------------------------------------------------------

class Worker:
    """A ``celery worker`` subprocess (prefork) on the idle queue, pointed at work on demand.

    ``app_module`` is ``project`` (Queuety) or ``qbench.celery_peer`` (raw Celery).
    """

    def __init__(self, app_module: str, concurrency: int, *, label: str,
                 environ: dict[str, str], extra: list[str] | None = None,
                 pool: str = "prefork") -> None:
        self.app_module = app_module
        self.pool = pool
        self.concurrency = concurrency
        self.environ = environ
        self.extra = extra or []
        self.node = f"qbench-{label}-{uuid.uuid4().hex[:6]}@localhost"
        self.log = env.RESULTS_DIR / "logs" / f"worker-{label}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def app(self):
        if self.app_module == "project":
            from project.celery import app
        else:
            from qbench.celery_peer import app
        return app

    def start(self, timeout: float = 90) -> "Worker":
        command = [sys.executable, "-m", "celery", "-A", self.app_module, "worker",
                   "--pool", self.pool, "--concurrency", str(self.concurrency),
                   "--loglevel", "WARNING", "-Q", env.IDLE_QUEUE, "-n", self.node,
                   "--without-gossip", "--without-mingle", "--without-heartbeat", *self.extra]
        self.proc = start(command, log=self.log, environ=self.environ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.node} exited: {self.log.read_text()[-3000:]}")
            if self.app.control.ping(destination=[self.node], timeout=0.5):
                if self.pool == "threads" or len(self.pool_pids()) >= self.concurrency:
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"worker {self.node} not ready in {timeout}s; see {self.log}")

    def _control(self, command: str, queue: str) -> None:
        method = getattr(self.app.control, command)
        for attempt in range(5):
            replies = method(queue, destination=[self.node], reply=True, timeout=5)
            if replies:
                return
        raise RuntimeError(f"{command}({queue}) got no reply from {self.node}")

    def consume(self, queue: str) -> None:
        """Start consuming ``queue`` (a control message; takes effect within milliseconds)."""
        self._control("add_consumer", queue)

    def ignore(self, queue: str) -> None:
        """Stop consuming ``queue``."""
        self._control("cancel_consumer", queue)

    def pool_pids(self) -> list[int]:
        return descendants(self.proc.pid) if self.proc else []

    def rss_kib(self) -> dict[str, int]:
        """RSS of the main process and the sum over its pool processes (KiB)."""
        main = rss_kib(self.proc.pid)
        pool = sum(rss_kib(pid) for pid in self.pool_pids())
        return {"main": main, "pool": pool, "total": main + pool}

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


# -- PostgreSQL statistics --------------------------------------------------------------------

COUNTERS = ("xact_commit", "sessions", "tup_inserted", "tup_updated")


def db_counters(conn, db: str, settle: bool = True) -> dict[str, int]:
    """``pg_stat_database`` counters of ``db``, read over autocommit psycopg ``conn``.

    A backend flushes its statistics when idle, at most once a second, and one that flushed
    less than a second ago waits 10 s of idleness before the next flush (PostgreSQL 15,
    PGSTAT_IDLE_INTERVAL). With ``settle`` this waits 11 s first, so every idle connection
    (workers', driver's) has flushed. Each read is two transactions on ``conn``'s database,
    returned as ``reads`` for the caller to subtract.
    """
    sql = "SELECT " + ", ".join(COUNTERS) + " FROM pg_stat_database WHERE datname = %s"
    time.sleep(11 if settle else 1.05)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(sql, [db]).fetchone()
    return {**dict(zip(COUNTERS, row)), "reads": 2}
