"""The README's demo command runs on the embedded default (SQLite + filesystem broker)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integration.conftest import ROOT


def test_demo__runs_the_order_workflow_on_sqlite_and_the_filesystem_broker(tmp_path):
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_TASK_DEFAULT_QUEUE",
                          "DJANGO_SETTINGS_MODULE")}
    env["QUEUETY_VAR_DIR"] = str(tmp_path)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)

    result = subprocess.run([*manage, "demo"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=180)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Database: sqlite3" in result.stdout and "Broker:   filesystem://" in result.stdout
    assert "Status:   completed" in result.stdout
    assert '"receipt_sent_to": "ada@example.com"' in result.stdout
    assert (tmp_path / "queuety.sqlite3").exists()
    mode = subprocess.run([sys.executable, "-c", "import sqlite3,sys; print(sqlite3.connect("
                           "sys.argv[1]).execute('pragma journal_mode').fetchone()[0])",
                           str(tmp_path / "queuety.sqlite3")], capture_output=True, text=True)
    assert mode.stdout.strip() == "wal"
