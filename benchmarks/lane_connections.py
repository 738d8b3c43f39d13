"""An I/O lane worker's PostgreSQL connections, on a private PostgreSQL server.

    .venv/bin/python benchmarks/lane_connections.py [--max-connections 100] \\
        [--old-root DIR] [SCENARIO ...]

Starts a PostgreSQL of its own (``initdb`` into a temporary folder, as the ``postgres`` user
when run as root), then for each scenario one lane worker (``-P threads -c 200``): 200 runs
whose one ``async`` step awaits 1 s, dispatched in one transaction (all 200 messages go out
at once), while a sampler reads the server's sessions every 50 ms and a "web" probe opens a
fresh connection every 0.1 s. Scenarios: ``nopool`` and ``pool20`` run this checkout's code;
``old_nopool`` and ``old_pool20`` the code of ``--old-root`` (e.g. ``git archive`` of an
earlier commit, unpacked). Prints one JSON line per scenario: refused at start (and the
message), or peak sessions, runs completed within 90 s, the seconds they took, "too many
clients" in the worker's log and refused probes. Needs CELERY_BROKER_URL (Redis).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = 200


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivatePostgres:
    """A PostgreSQL server in a temporary folder, stopped at the end of the block."""

    def __init__(self, max_connections: int) -> None:
        self.bin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.port = free_port()
        self.folder = tempfile.mkdtemp(prefix="lane-pg-")
        self.max_connections = max_connections

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *command], check=True, stdout=subprocess.DEVNULL)

    def __enter__(self) -> PrivatePostgres:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run(f"{self.bin}/initdb", "-D", f"{self.folder}/data", "-U", "postgres",
                  "--auth=trust")
        self._run(f"{self.bin}/pg_ctl", "-D", f"{self.folder}/data", "-l",
                  f"{self.folder}/log", "-w", "start", "-o",
                  f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                  f"-c max_connections={self.max_connections}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(f"{self.bin}/pg_ctl", "-D", f"{self.folder}/data", "-m", "fast", "stop")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


def sample(admin: str, url: str, app: str, stop: threading.Event) -> dict[str, int]:
    """Start the sampler and the probe; return the dict they fill until ``stop`` is set."""
    import psycopg

    peak = {"lane": 0, "total": 0, "probe_refused": 0, "probes": 0}

    def sessions() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            while not stop.is_set():
                lane, total = conn.execute(
                    "SELECT count(*) FILTER (WHERE application_name = %s), count(*) "
                    "FROM pg_stat_activity WHERE backend_type = 'client backend'",
                    [app]).fetchone()
                peak["lane"], peak["total"] = max(peak["lane"], lane), max(peak["total"], total)
                time.sleep(0.05)

    def probe() -> None:
        while not stop.is_set():
            peak["probes"] += 1
            try:
                psycopg.connect(url, connect_timeout=2).close()
            except psycopg.OperationalError as error:
                peak["probe_refused"] += "too many clients" in str(error)
            time.sleep(0.1)

    for target in (sessions, probe):
        threading.Thread(target=target, daemon=True).start()
    return peak


def scenario(name: str, root: Path, pool: int | None, env: dict[str, str], admin: str,
             url: str, folder: str) -> dict[str, object]:
    from django.db import connection, transaction

    import queuety
    from queuety.models import WorkflowRun
    from tests import lane_steps

    app = f"measure-{name}"
    worker_env = {**env, "PYTHONPATH": str(root), "QUEUETY_DB_APPLICATION_NAME": app}
    if pool:
        worker_env["QUEUETY_DB_POOL"] = str(pool)
    queue = f"{env['CELERY_TASK_DEFAULT_QUEUE']}-{name}"
    log_path = Path(folder) / f"{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "project", "worker", "-P", "threads", "-c",
             str(RUNS), "-Q", queue, "-n", f"{name}@localhost", "--without-gossip",
             "--without-mingle", "-l", "INFO"],
            cwd=root, env=worker_env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    deadline = time.monotonic() + 60
    while " ready." not in log_path.read_text():
        if proc.poll() is not None:
            lines = [line for line in log_path.read_text().splitlines() if "queuety:" in line]
            return {"refused": True, "exit": proc.returncode, "message": lines[-1:]}
        if time.monotonic() > deadline:
            raise RuntimeError(f"The lane worker did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    stop = threading.Event()
    peak = sample(admin, url, app, stop)
    flow = queuety.workflow("lane_measure").then(lane_steps.await_network, queue=queue)
    started = time.monotonic()
    with transaction.atomic():  # all the messages go out at once, on commit
        runs = [flow.dispatch({"token": uuid.uuid4().hex[:12], "body": 1})
                for _ in range(RUNS)]
    completed = 0
    while completed < RUNS and time.monotonic() < started + 90:
        completed = WorkflowRun.objects.filter(pk__in=runs, status="completed").count()
        time.sleep(0.1)
    seconds = time.monotonic() - started
    stop.set()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    connection.close()
    return {"refused": False, "peak_lane_sessions": peak["lane"],
            "peak_server_sessions": peak["total"], "completed": completed,
            "seconds": round(seconds, 1),
            "too_many_clients_in_log": log_path.read_text().count("too many clients"),
            "probe_refused": peak["probe_refused"], "probes": peak["probes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-connections", type=int, default=100)
    parser.add_argument("--old-root", type=Path)
    parser.add_argument("scenarios", nargs="*", default=["nopool", "pool20"])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with PrivatePostgres(args.max_connections) as server:
        import psycopg

        admin = server.url("postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE queuety_measure")
        url = server.url("queuety_measure")
        env = {**os.environ, "DATABASE_URL": url.replace("postgresql://", "postgres://"),
               "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
               "CELERY_TASK_DEFAULT_QUEUE": f"lane-measure-{uuid.uuid4().hex[:6]}",
               "QUEUETY_TEST_DIR": tempfile.mkdtemp(prefix="lane-marks-")}
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                       check=True)
        os.environ.update(env)
        import django

        django.setup()
        for name in args.scenarios:
            old = name.startswith("old_")
            if old and args.old_root is None:
                parser.error(f"Scenario {name!r} needs --old-root.")
            pool = 20 if name.endswith("pool20") else None
            result = scenario(name, args.old_root if old else ROOT, pool, env, admin, url,
                              server.folder)
            print(name, json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
