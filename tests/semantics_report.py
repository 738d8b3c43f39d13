"""Render var/semantics.json (written by the retry and timeout tests) as a Markdown table.

    python -m tests.semantics_report > docs/semantics.md
"""

import json
import re
from collections import defaultdict

from tests.conftest import RESULTS

HEADER = """# Retry, timeout, route and fan-out semantics, measured

Each row is a test in `tests/integration/test_retries.py`, `test_timeouts.py`, `test_routes.py`,
`test_fanout.py` (F rows) or `test_signals.py` (H rows), run against
PostgreSQL with real prefork Celery workers. The criteria (R1-R8, S1-S5, T1-T5, RT1-RT5,
F1-F4) are those of `shared/reference/adk-lessons.md`; F5 (two terminal outputs) cannot be
written as a definition here: see [control flow](guide/control-flow.md), "One terminal output".
Timeout cases run on a worker of each Python version;
retry cases and the pure policy checks run on the main interpreter only ("—" elsewhere).
Regenerate with `./dev test tests/integration/test_retries.py tests/integration/test_timeouts.py
tests/integration/test_routes.py tests/integration/test_fanout.py tests/integration/test_signals.py`
then `python -m tests.semantics_report > docs/semantics.md`.
"""


def main() -> None:
    rows = json.loads(RESULTS.read_text())
    by_case: dict[str, dict] = defaultdict(dict)
    expected: dict[str, str] = {}
    for row in rows:
        if not re.match(r"(R|S|T|RT|H|F)\d", row["case"]):
            continue
        by_case[row["case"]][row["python"][:4]] = row["measured"]
        expected[row["case"]] = row["expected"]
    versions = sorted({v for cells in by_case.values() for v in cells})
    print(HEADER)
    print("| case | expected | " + " | ".join(f"measured, Python {v}" for v in versions) + " |")
    print("|---|---|" + "---|" * len(versions))
    for case in sorted(by_case, key=lambda c: (c.split()[0], c)):
        cells = [by_case[case].get(v, "—") for v in versions]
        print(f"| {case} | {expected[case]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
