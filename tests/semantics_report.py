"""Render the measured semantics as docs/semantics.md.

    python -m tests.semantics_report > docs/semantics.md

Reads var/semantics.json (rows the suite's ``semantics`` fixture writes, tests/conftest.py)
and the "Shipped timings:" entries of var/reliability.json (the ``figures`` fixture of
tests/reliability/conftest.py, written by tests/reliability/test_recovery_timings.py).
tests/unit/test_semantics_page.py checks that the page has a row for every criterion.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from tests.conftest import RESULTS

RELIABILITY = Path(__file__).resolve().parents[1] / "var" / "reliability.json"

#: The 35 criteria of shared/reference/adk-lessons.md ("What a better engine should do on each
#: check"), in its order, with its titles.
CRITERIA: dict[str, str] = {
    "R1": "Exact back-off",
    "R2": "Bounded, documented jitter",
    "R3": "Computable worst case",
    "R4": "Validation",
    "R5": "One record per attempt",
    "R6": "Retry budget survives crashes and resumes",
    "R7": "No silent multiplication",
    "R8": "Dynamically started steps obey policies",
    "S1": "isinstance semantics",
    "S2": "Names are resolved when the definition is built",
    "S3": "Non-retryable errors",
    "S4": "Timeouts fit the exception hierarchy",
    "S5": "No policy means no retry",
    "T1": "Really interrupts blocking code",
    "T2": "Outcome depends only on elapsed time",
    "T3": "No orphaned attempts",
    "T4": "Hard stop",
    "T5": "Predictable worst case",
    "RT1": "An unmatched route is a loud failure",
    "RT2": "Unrouted successors cannot mask it",
    "RT3": "DEFAULT is recorded",
    "RT4": "Labels are strings and compared exactly",
    "RT5": "Build-time checks",
    "F1": "Blocking branches run in parallel",
    "F2": "Deterministic join output",
    "F3": "Join semantics",
    "F4": "Concurrency limit honoured",
    "F5": "Two terminal outputs rejected at build time",
    "H1": "No coercion",
    "H2": "Types are not loosened",
    "H3": "Full JSON Schema validation",
    "H4": "A refused reply has no effect",
    "H5": "Duplicate replies are explicit",
    "H6": "Schema types are checked at definition time",
    "H7": "No re-runs on resume, even across a restart",
}

#: Rows of this suite's own beyond the reference (listed after the criterion they extend).
EXTRA = {"T6": "A body that handles its own interruption still times out (issue 15)",
         "F6": "A large for_each expands once"}

GROUPS = ("R", "S", "T", "RT", "F", "H")

#: Test modules whose tests record rows (``semantics.record``) or the recovery figures.
RECORDING_MODULES = (
    "tests/unit/test_retry.py",
    "tests/integration/test_retries.py",
    "tests/integration/test_timeouts.py",
    "tests/integration/test_timeout_outcome.py",
    "tests/integration/test_routes.py",
    "tests/integration/test_fanout.py",
    "tests/integration/test_signals.py",
    "tests/integration/test_api.py",
)
RECOVERY_MODULE = "tests/reliability/test_recovery_timings.py"

HEADER = f"""# Retry, timeout, route, fan-out and human-input semantics, measured

Each row of the measurements below is a test of this repository, run against PostgreSQL with real
prefork Celery workers; the measured cells are formatted from what the test observed. The
criteria (R1-R8, S1-S5, T1-T5, RT1-RT5, F1-F5, H1-H7: 35) are those of
`shared/reference/adk-lessons.md`, "What a better engine should do on each check"; the first
table says which rows answer each one. A row named for two criteria (`T1/T2`, `T5/S4`) is one
test that measures both. F5 has no definition to reject: a definition here is one list of
steps, so its row measures what that construction guarantees (see
[control flow](guide/control-flow.md), "One terminal output"). T6 and F6 are this suite's own
rows beyond the reference.

Timeout cases (T) and F2 run on a worker of each supported Python version. The other cases
run on the interpreter that ran the suite; a cell is "—" for a version whose suite has not
recorded the case (the CI job on Python 3.12 runs some of these modules too).

Regenerate with

    ./dev test {" ".join(RECORDING_MODULES[:3])} \\
        {" ".join(RECORDING_MODULES[3:6])} \\
        {" ".join(RECORDING_MODULES[6:])} \\
        {RECOVERY_MODULE}
    python -m tests.semantics_report > docs/semantics.md
"""


def ids_of(case: str) -> list[str]:
    """The criterion ids a row answers: its first word, split on '/' ("T5/S4" -> T5, S4)."""
    return case.split()[0].split("/")


def sort_key(case: str) -> tuple:
    """Reference order: group R, S, T, RT, F, H, then number (T6 after T5, F6 after F5)."""
    first = re.fullmatch(r"([A-Z]+)(\d+)", ids_of(case)[0])
    if first is None:
        return (len(GROUPS), 0, case)
    group, number = first.groups()
    return (GROUPS.index(group) if group in GROUPS else len(GROUPS), int(number), case)


def load_rows() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    rows = json.loads(RESULTS.read_text())
    by_case: dict[str, dict[str, str]] = defaultdict(dict)
    expected: dict[str, str] = {}
    known = set(CRITERIA) | set(EXTRA)
    for row in rows:
        if not row["case"].split() or not set(ids_of(row["case"])) <= known:
            continue  # not a criterion row (e.g. the idempotency race of test_guardrails)
        by_case[row["case"]][".".join(row["python"].split(".")[:2])] = row["measured"]
        expected[row["case"]] = row["expected"]
    return by_case, expected


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def coverage(by_case: dict[str, dict[str, str]]) -> None:
    print("## Criteria and their rows\n")
    print("| criterion | title | rows in the measurements | measured on Python |")
    print("|---|---|---|---|")
    for criterion, title in CRITERIA.items():
        cases = [c for c in by_case if criterion in ids_of(c)]
        named = defaultdict(int)
        for case in sorted(cases, key=sort_key):
            named[case.split()[0]] += 1
        rows = ", ".join(f"`{name}` ({n} row{'s' if n > 1 else ''})"
                         for name, n in named.items()) or "**no row**"
        versions = sorted({v for c in cases for v in by_case[c]})
        print(f"| {criterion} | {title} | {rows} | {', '.join(versions) or '—'} |")
    print()


def measurements(by_case: dict[str, dict[str, str]], expected: dict[str, str],
                 versions: list[str]) -> None:
    print("## Measurements\n")
    print("| case | expected | " + " | ".join(f"measured, Python {v}" for v in versions) + " |")
    print("|---|---|" + "---|" * len(versions))
    for case in sorted(by_case, key=sort_key):
        cells = [cell(by_case[case].get(v, "—")) for v in versions]
        print(f"| {cell(case)} | {cell(expected[case])} | " + " | ".join(cells) + " |")
    print()


#: Before the fix of issue 15 (item 1), from the issue's own account; the other shapes were
#: not part of it.
SHAPE_BEFORE = {
    "returns_after_catching_exception": "`step_completed`, late output merged, run went on",
    "returns_after_catching_timeout_error": "`step_completed`, late output merged, run went on",
    "raises_another_error_after_catching": "not measured in the issue",
}


def timeouts_by_shape(by_case: dict[str, dict[str, str]], versions: list[str]) -> None:
    """Per body shape, seconds from the attempt's claim to its recorded StepTimeout, and from
    its deadline (claim + timeout), from the T1/T2 and T6 rows."""
    shapes: list[tuple[str, float, dict[str, float]]] = []
    for case in sorted(by_case, key=sort_key):
        if not {"T1", "T6"} & set(ids_of(case)):
            continue
        timeout = float(re.search(r"timeout=([\d.]+)", case).group(1))
        seen: dict[str, dict[str, float]] = defaultdict(dict)
        for version, measured in by_case[case].items():
            for shape, seconds in re.findall(r"\b([a-z][a-z_]+) (\d+\.\d+)s\b", measured):
                seen[shape][version] = float(seconds)
        shapes += [(shape, timeout, figures) for shape, figures in seen.items()]
    if not shapes:
        return
    print("## Deadline to recorded timeout, by body shape\n")
    print("From the `T1/T2` row (timeout 2 s, body 10 s) and the `T6` row (timeout 0.5 s, "
          "body 3 s: bodies that catch the interruption and return, or raise an error of "
          "their own). Each cell: seconds from the attempt's claim to the recorded "
          "`StepTimeout`, and in brackets from its deadline (claim + timeout). \"Before\" is "
          "issue 15's account of the bodies that catch the interruption, before its fix.\n")
    print("| body shape | timeout | before (issue 15) | "
          + " | ".join(f"Python {v}" for v in versions) + " |")
    print("|---|---|---|" + "---|" * len(versions))
    for shape, timeout, figures in shapes:
        cells = [f"{figures[v]:.2f} s (+{figures[v] - timeout:.2f})" if v in figures else "—"
                 for v in versions]
        print(f"| `{shape}` | {timeout:g} s | {SHAPE_BEFORE.get(shape, '— (not in the issue)')} | "
              + " | ".join(cells) + " |")
    print()


def _bounds() -> dict[str, str]:
    from queuety.conf import DEFAULTS

    sweep, lost, grace = (DEFAULTS["SWEEP_INTERVAL"], DEFAULTS["WORKER_LOST_AFTER"],
                          DEFAULTS["HARD_TIMEOUT_GRACE"])
    late = f"≤ WORKER_LOST_AFTER + 2 sweeps + 3 s = {lost + 2 * sweep + 3:g} s late"
    return {
        "pool": "recorded by the worker's main process: < 15 s; WorkerLost; the run completes",
        "timed": f"WorkerLost (retried), ≤ timeout + grace + 2 sweeps + 2 s = "
                 f"{5 + grace + 2 * sweep + 2:g} s after the kill; the run completes",
        "backoff": f"{late}; the run completes",
        "delay": f"{late}; the run completes",
    }


#: The recovery cases: (key in var/reliability.json, what happens, before, bound key).
RECOVERY = (
    ("Shipped timings: pool process SIGKILLed mid-step",
     "a pool process SIGKILLed while its step runs",
     "recorded by the sweeper 50–61 s after the kill (11 of 11 pool kills; issue 22)", "pool"),
    ("Shipped timings: worker SIGKILLed during a step with timeout=5",
     "the whole worker SIGKILLed during a step with `timeout=5` (a new worker started)",
     "recorded as `StepTimeout` (\"ignored its timeout ... killed at the hard limit\"), not "
     "retried: the run failed (issue 22)", "timed"),
    ("Shipped timings: worker SIGKILLed holding a retry back-off",
     "the whole worker SIGKILLed while it holds a retry's 3 s back-off",
     "a retry due 1 s after the crash ran 62 s late (issue 15)", "backoff"),
    ("Shipped timings: worker SIGKILLed holding a delay",
     "the whole worker SIGKILLed while it holds a `delay(seconds=3)`",
     "a `delay(5)` ran 64 s late (0.5 s late after a warm shutdown; issue 15)", "delay"),
)


def recovery() -> None:
    figures = json.loads(RELIABILITY.read_text()) if RELIABILITY.exists() else {}
    shipped = {k: v for k, v in figures.items() if k.startswith("Shipped timings:")}
    print("## Recovery after a crash, on the shipped timings\n")
    print(f"Measured by `{RECOVERY_MODULE}` with the workers on the shipped defaults (a sweep "
          "every 5 s, a heartbeat every 10 s, a worker lost after 25 s, a stale step after "
          "60 s, messages re-published after 60 s), not the suite's shortened ones. The "
          "\"before\" column is quoted from the measurements in issues 15 and 22, taken on "
          "the same defaults before their fixes; it is not re-measured. Each test asserts "
          "the last column.\n")
    if not shipped:
        print("No figures recorded yet: run the module above.\n")
        return
    bounds = _bounds()
    print("| case | before (issues 15 and 22) | measured | the test holds it to |")
    print("|---|---|---|---|")
    listed = set()
    for key, what, before, bound in RECOVERY:
        if key not in shipped:
            continue
        listed.add(key)
        print(f"| {what} | {before} | {cell(_after(shipped[key]))} | {bounds[bound]} |")
    for key in sorted(set(shipped) - listed):
        print(f"| {cell(key.split(':', 1)[1].strip())} | — | {cell(_after(shipped[key]))} | — |")
    print()


def _after(figures: dict) -> str:
    version = f" (Python {figures['python']})" if figures.get("python") else ""
    if "recorded_after_s" in figures:
        return f"recorded {figures['recorded_after_s']:g} s after the kill{version}"
    if "late_s" in figures:
        return f"ran {figures['late_s']:g} s after it was due{version}"
    return ", ".join(f"{k} {v}" for k, v in figures.items() if k != "python") + version


def main() -> None:
    by_case, expected = load_rows()
    versions = sorted({v for cells in by_case.values() for v in cells})
    print(HEADER)
    coverage(by_case)
    measurements(by_case, expected, versions)
    timeouts_by_shape(by_case, versions)
    recovery()


if __name__ == "__main__":
    main()
