"""The registry and schedules on the embedded default (SQLite + filesystem broker), from the
shell as a developer would use them: the demo project's registered workflow dispatched by
name, and an interval schedule fired by the worker's embedded beat."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from tests.demo_order import DEMO_ORDER_JSON
from tests.integration.conftest import ROOT


def test_dispatch_by_name_and_a_schedule_run_on_sqlite_and_the_filesystem_broker(tmp_path):
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_TASK_DEFAULT_QUEUE",
                          "DJANGO_SETTINGS_MODULE")}
    env["QUEUETY_VAR_DIR"] = str(tmp_path)

    def manage(*args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    manage("migrate", "--noinput", "-v0")
    assert "order_fulfilment" in manage("queuety", "workflow", "definitions")
    line = manage("queuety", "workflow", "dispatch", "order_fulfilment",
                  "--payload", DEMO_ORDER_JSON).strip()
    assert line.startswith("Success: dispatched workflow #")
    run_id = int(line.split("#")[1].rstrip("."))
    manage("queuety", "schedule", "add", "demo_orders", "--workflow", "order_fulfilment",
           "--every", "1", "--payload", DEMO_ORDER_JSON)

    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "project", "worker", "-B", "--pool",
             "prefork", "--concurrency", "2", "--loglevel", "INFO", "--without-gossip",
             "--without-mingle", "--schedule", str(tmp_path / "celerybeat-schedule")],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    database = tmp_path / "queuety.sqlite3"
    try:
        deadline = time.monotonic() + 240  # a loaded machine starts a worker slowly
        while time.monotonic() < deadline:
            with sqlite3.connect(database, timeout=10) as db:
                rows = db.execute("SELECT id, status, idempotency_key FROM queuety_workflowrun"
                                  " ORDER BY id").fetchall()
            scheduled = [row for row in rows if (row[2] or "").startswith(
                "queuety-schedule:demo_orders:")]
            finished = {row[0] for row in rows if row[1] == "completed"}
            if run_id in finished and sum(row[0] in finished for row in scheduled) >= 2:
                break
            time.sleep(0.5)
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert run_id in finished, log.read_text()[-3000:]
    assert sum(row[0] in finished for row in scheduled) >= 2, log.read_text()[-3000:]
    keys = [row[2] for row in scheduled]
    assert len(keys) == len(set(keys))
    status = json.loads(manage("queuety", "workflow", "status", str(scheduled[0][0]),
                               "--format", "json"))
    assert status["state"]["receipt_sent_to"] == "ada@example.com"
