"""Shared test set-up: a folder for side-effect marks, visible to the worker subprocess."""

import os
import tempfile

os.environ.setdefault("QUEUETY_TEST_DIR", tempfile.mkdtemp(prefix="queuety-marks-"))


import json  # noqa: E402
import platform  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "var" / "semantics.json"


class Semantics:
    """Collects measured retry/timeout figures; written to var/semantics.json at the end.

    ``python -m tests.semantics_report`` turns the file into docs/semantics.md.
    """

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def record(self, case: str, expected: str, measured: str, python: str | None = None) -> None:
        self.rows.append({"case": case, "expected": expected, "measured": measured,
                          "python": python or platform.python_version()})


# The session's database and worker live here, not in tests/integration/conftest.py, so that
# tests/integration and tests/reliability share ONE of each: a session fixture imported into a
# second conftest is a second fixture, which would create the test database (dropping it) and
# start a worker a second time.

@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker):
    """Create the test database for the session (pytest-django only does it for tests marked
    ``django_db``, whose per-test transactions or flushes a worker process cannot live with)."""
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        created = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        connection.close()
        teardown_databases(created, verbosity=0)


@pytest.fixture(scope="session")
def db_session(django_db_setup, django_db_blocker):
    """Open database access for the whole session (no per-test transaction or flush).

    Used automatically by tests/integration and tests/reliability (their ``_database``)."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="session")
def worker(db_session, tmp_path_factory):
    """The session's Celery worker (started on first use, stopped at the end)."""
    from tests.integration.conftest import Worker

    handle = Worker(tmp_path_factory.mktemp("worker"))
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def token() -> str:
    """A unique token a test puts in its payload to find its own side-effect marks."""
    import uuid

    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def semantics():
    collector = Semantics()
    yield collector
    if collector.rows:
        RESULTS.parent.mkdir(exist_ok=True)
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
        keys = {(row["case"], row["python"]) for row in collector.rows}
        kept = [row for row in previous if (row["case"], row["python"]) not in keys]
        RESULTS.write_text(json.dumps(kept + collector.rows, indent=1))
