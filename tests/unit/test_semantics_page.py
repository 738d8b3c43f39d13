"""docs/semantics.md has a measured row for every criterion of the reference (no services).

The page is generated (``python -m tests.semantics_report > docs/semantics.md``) from what the
suite recorded; this keeps it honest: a criterion whose test stopped recording, or a page
regenerated from a partial run, fails here. The 35 ids are spelled out below rather than taken
from the report, so the report cannot drop one unnoticed.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"

CRITERIA = ([f"R{n}" for n in range(1, 9)] + [f"S{n}" for n in range(1, 6)]
            + [f"T{n}" for n in range(1, 6)] + [f"RT{n}" for n in range(1, 6)]
            + [f"F{n}" for n in range(1, 6)] + [f"H{n}" for n in range(1, 8)])


def section(title: str) -> list[list[str]]:
    """The table rows (cells, header and rule excluded) of the page's section ``title``."""
    text = PAGE.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/semantics.md has no section {title!r}"
    lines = [line for line in match.group(1).splitlines() if line.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[2:]]


def test_there_are_35_criteria():
    assert len(CRITERIA) == len(set(CRITERIA)) == 35


def test_every_criterion_starts_a_measured_row():
    covered: dict[str, int] = {}
    for cells in section("Measurements"):
        ids = cells[0].split()[0].split("/")  # "T5/S4 ..." answers T5 and S4
        measured = [c for c in cells[2:] if c not in ("", "—")]
        assert measured, f"row {cells[0]!r} has no measured value"
        for criterion in ids:
            covered[criterion] = covered.get(criterion, 0) + 1
    missing = [c for c in CRITERIA if c not in covered]
    assert not missing, f"no row in docs/semantics.md for {missing}"


def test_the_criteria_table_lists_each_one_with_its_rows():
    rows = {cells[0]: cells for cells in section("Criteria and their rows")}
    assert list(rows) == CRITERIA
    assert not [c for c, cells in rows.items() if "no row" in cells[2]]


def test_the_recovery_figures_are_on_the_page():
    rows = section("Recovery after a crash, on the shipped timings")
    assert len(rows) >= 4, rows
    for cells in rows:
        assert re.search(r"\d+(\.\d+)? s", cells[2]), cells  # a measured figure
        assert cells[1] not in ("", "—"), cells  # and what it was before
