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
