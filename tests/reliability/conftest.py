"""Reliability suite fixtures: the integration suite's database and worker, plus a report.

Every test under ``tests/reliability/`` is marked ``reliability`` (``./dev test -m reliability``
runs them alone). Measured figures go to ``var/reliability.json``; docs/reliability.md quotes
them.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from tests.servers import require_servers

# PostgreSQL and a real broker, or the run stops here (tests.settings alone would fall back to
# the demo's SQLite and filesystem broker).
require_servers()

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "var" / "reliability.json"


@pytest.fixture(scope="session", autouse=True)
def _database(db_session):
    """Every reliability test has the session's database (``db_session``, tests/conftest.py)."""
    yield


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(scope="module")
def quiet_session_worker(worker):
    """Stop the session's worker (and its sweeper) while a module's own pools do the work.

    Both sweepers would otherwise re-publish and recover the same rows, and the session's
    worker would take part in work whose faults and limits a test is measuring.
    """
    worker.stop()
    yield
    worker.start()


class Figures:
    """Measured figures, keyed by case; merged into var/reliability.json at the end."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def record(self, case: str, **figures) -> None:
        self.rows[case] = {**figures, "python": platform.python_version()}


@pytest.fixture(scope="session")
def figures():
    collector = Figures()
    yield collector
    if collector.rows:
        RESULTS.parent.mkdir(exist_ok=True)
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        RESULTS.write_text(json.dumps({**previous, **collector.rows}, indent=1, default=str))
