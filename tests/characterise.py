"""A characterisation record of every run a test session makes, and a tool to compare two.

Made to show that a refactoring changes no behaviour: record the integration suite before the
change and after it, then compare. Inert unless ``QUEUETY_CHARACTERISE`` names the JSON file to
write: only then does tests/integration/conftest.py load this module as a plugin, so a normal
run neither imports it nor pays for it. With the servers ``./dev test`` uses::

    QUEUETY_CHARACTERISE=$PWD/var/characterisation/before.json ./dev test -q tests/integration
    QUEUETY_CHARACTERISE=$PWD/var/characterisation/after.json ./dev test -q tests/integration
    python -m tests.characterise compare var/characterisation/before.json \\
        var/characterisation/after.json --noisy var/characterisation/noisy.txt --only-diff
    python -m tests.characterise show before.json NODEID   # one test's record, as JSON
    python -m tests.characterise renormalise before.json   # rebuild it from before.raw.json

Next to the record, ``<name>.raw.json`` keeps the rows as read (and which test made which
run), so a change of the normalisation below needs no new recording: ``renormalise``.

What it records, per test node id (with the test's outcome): every ``WorkflowRun`` the test
created, with its row's columns (name, status, current_step, total_steps, revision, state,
transitions, cost_units, started_workflows, loops, groups, state_writes, error, cleanup,
group, idempotency_key, the parent and started_by links and their steps; whether
wait_expires_at, finished_at, deadline_at and trace_context are set), its timeline (``Event``
rows in pk order: kind, step_index, step_name, attempt, step row, data), its ``StepRun`` rows
(by kind, seq, branch: step, status, attempts, input, output, error, gate fields, ...), its
``Signal`` rows (name, payload, sender, consumption) and its ``WorkflowDependency`` rows.

When: once, at the end of the session, while the session's worker still runs and after the
database has been quiet for QUIET_SECONDS, so runs a test left in flight have settled as far
as they will. Each run is filed under the test during which it was created (by its pk: the
highest pk is noted after each test), a child or started run under its parent's test.

Normalised, so that two recordings of the same code compare equal:

* Ids. The session's run, step-row and signal sequences are moved to 10,000,001, 40,000,001
  and 70,000,001 at its start, so an id is unambiguous wherever it appears (a state value,
  event data, a dict key, a message) and is replaced by a label relative to its test: ``R1``,
  ``R2`` for the runs the test dispatched (pk order), ``R1.c1`` for the first child of R1
  (``run_workflow``), ``R1.s2`` for the second run R1 started (``start_workflows``),
  ``<other-run>`` for another test's run; step rows are ``step:kind/seq/branch``, signals
  ``signal:N`` (their order in their run).
* Time. Values under keys ending in ``_at``, ``_ms``, ``seconds``, ``since``, ... (and
  ``ran_for``, a test step's measure; ``retry_in``, a jittered delay) become ``"set"``; ISO
  timestamps in strings ``<ts>``. Durations of events are not recorded.
* Processes and randomness: worker names and pids (``claimed_by``, host:pid in messages)
  become ``"set"`` / ``<process>``; the test's ``token`` ``<token>``; the session's queue name
  ``<queue>``; UUIDs, random hex (user names, schedule names) and approval-link nonces
  ``<uuid>``, ``<hex>``, ``<nonce>``, in node ids too (a parameter id made of a uuid); a
  traceback is its last line (the exception: its first line is always "Traceback (most recent
  call last):").
* Order. Branches and items of a fan-out finish in whatever order the pool runs them: each
  stretch of consecutive events of one fan-out pass's rows is put in branch order (its place
  in the timeline is kept). A fan-out aggregate's ``winner`` (the first branch to succeed,
  by finish time) is ``"set"``.

``compare`` prints one line per test (``same``, ``DIFF``, or ``noisy`` for a known noisy test
that differs), under each difference a compact diff (the run's label, then the field, the
event or step row index and the path inside it: ``R1 events[3] (step_completed).data.output.x:
1 -> 2``), then a summary: N tests identical, M differ. Known noisy tests (``--noisy FILE``:
one node id a line, ``  # why`` allowed after it; the tests that differ between two recordings
of the same code) are counted apart and do not fail the comparison. Exit status 0 when no
other test differs (or exists in one record only), else 1.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import socket
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "QUEUETY_CHARACTERISE"
#: Where the session's sequences start (see the module docstring).
FLOORS = {"run": 10_000_000, "step": 40_000_000, "signal": 70_000_000}
#: How long the database must stay quiet before the record is taken, and the longest wait.
QUIET_SECONDS, SETTLE_LIMIT = 2.0, 30.0

Json = Any


# -- recording ----------------------------------------------------------------------------------

class Recorder:
    """What the session has seen: which test creates which runs; writes the record at the end."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.ends: list[int] = []  # after test i, the highest run pk
        self.nodeids: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.tokens: dict[str, str] = {}
        self.floor: int | None = None
        self.written = False

    def end_of(self, item: pytest.Item) -> None:
        if self.floor is None:  # the session's database was never set up
            return
        self.nodeids.append(item.nodeid)
        self.ends.append(max(_max_run_pk(), self.ends[-1] if self.ends else self.floor))

    def write(self) -> None:
        self.written = True
        if self.floor is None or not self.nodeids:
            return
        started = time.monotonic()
        _settle()
        raw = {"meta": {"floor": self.floor, "settled_seconds":
                        round(time.monotonic() - started, 1)},
               "session": {"nodeids": self.nodeids, "ends": self.ends, "outcomes": self.outcomes,
                           "tokens": self.tokens,
                           "queue": os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "")},
               "rows": read_rows(self.floor)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(raw, default=str)
        raw_path(self.path).write_text(text + "\n")
        record = build(json.loads(text))  # as renormalise would build it
        self.path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"\ncharacterise: {record['meta']['tests']} tests, {record['meta']['runs']} "
              f"runs -> {self.path}", file=sys.stderr)


def raw_path(path: Path) -> Path:
    """Where the rows behind a record are kept: ``renormalise`` rebuilds the record from them."""
    return path.with_name(path.stem + ".raw" + path.suffix)


# The plugin: this module, imported by tests/integration/conftest.py only when ENV is set.
RECORDER: Recorder | None = None


def pytest_configure(config: pytest.Config) -> None:
    global RECORDER
    RECORDER = Recorder(os.environ[ENV])


@pytest.fixture(scope="session", autouse=True)
def _characterise_sequences(db_session: None) -> Iterator[None]:
    """Move the session's sequences past every literal id the tests use (once)."""
    assert RECORDER is not None
    RECORDER.floor = _bump_sequences()
    yield
    if not RECORDER.written and RECORDER.nodeids:  # stopped early (-x, an interrupt)
        RECORDER.write()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield
    token = (getattr(item, "funcargs", None) or {}).get("token")
    if RECORDER is not None and isinstance(token, str):
        RECORDER.tokens[item.nodeid] = token


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if RECORDER is None:
        return
    if report.failed:
        RECORDER.outcomes[item.nodeid] = f"failed in {report.when}"
    elif report.skipped:
        if not RECORDER.outcomes.get(item.nodeid, "").startswith("failed"):
            RECORDER.outcomes[item.nodeid] = "skipped"
    else:
        RECORDER.outcomes.setdefault(item.nodeid, "passed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if RECORDER is not None and nextitem is None:  # the last test: record while the
        RECORDER.end_of(item)                      # session's fixtures (worker, db) live
        RECORDER.write()
    yield
    if RECORDER is not None and nextitem is not None:
        RECORDER.end_of(item)


def _tables() -> dict[str, str]:
    from queuety.models import Signal, StepRun, WorkflowRun

    return {"run": WorkflowRun._meta.db_table, "step": StepRun._meta.db_table,
            "signal": Signal._meta.db_table}


def _bump_sequences() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        for what, table in _tables().items():
            cursor.execute(f"SELECT setval(pg_get_serial_sequence(%s, 'id'), "
                           f"GREATEST(%s, (SELECT COALESCE(MAX(id), 0) FROM {table})))",
                           [table, FLOORS[what]])
    return max(FLOORS["run"], _max_run_pk())


def _max_run_pk() -> int:
    from django.db.models import Max

    from queuety.models import WorkflowRun

    return WorkflowRun.objects.aggregate(top=Max("pk"))["top"] or 0


def _settle() -> None:
    """Wait until no event is written and no due step row changes for QUIET_SECONDS."""
    from django.db.models import Max
    from django.utils import timezone

    from queuety.models import Event, StepRun

    deadline, last, since = time.monotonic() + SETTLE_LIMIT, None, time.monotonic()
    while time.monotonic() < deadline:
        now = timezone.now()
        mark = (Event.objects.aggregate(top=Max("pk"))["top"],
                list(StepRun.objects.filter(status__in=("pending", "processing"),
                                            available_at__lte=now)
                     .values_list("pk", "status", "attempt").order_by("pk")))
        if mark != last:
            last, since = mark, time.monotonic()
        elif time.monotonic() - since >= QUIET_SECONDS:
            return
        time.sleep(0.25)


RUN_FIELDS = ("name", "status", "current_step", "total_steps", "revision", "state",
              "transitions", "cost_units", "started_workflows", "loops", "groups",
              "state_writes", "error", "cleanup", "group", "idempotency_key", "parent_step",
              "parent_attempt", "started_by_step")
RUN_SET_FIELDS = ("wait_expires_at", "finished_at", "deadline_at", "trace_context")
STEP_FIELDS = ("kind", "seq", "branch", "step_index", "step_name", "status", "attempt",
               "max_attempts", "admitted_attempt", "timeout", "handler", "input", "output",
               "error", "progress", "concurrency_group", "queue", "cost_units", "priority",
               "woken", "throttled_by")


def read_rows(floor: int) -> dict[str, list[dict[str, Any]]]:
    """The session's rows as they are (every run above ``floor``), in JSON-able form."""
    from queuety.models import Event, Signal, StepRun, WorkflowDependency, WorkflowRun

    runs = list(WorkflowRun.objects.filter(pk__gt=floor).order_by("pk").values(
        "pk", "parent_id", "started_by_id", *RUN_FIELDS, *RUN_SET_FIELDS))
    for run in runs:
        run.update({field: run[field] is not None and run[field] != ""
                    for field in RUN_SET_FIELDS})
    mine = {"run_id__gt": floor}
    return {
        "runs": runs,
        "events": list(Event.objects.filter(**mine).order_by("pk").values(
            "run_id", "step_run_id", "kind", "step_index", "step_name", "attempt", "data")),
        "steps": list(StepRun.objects.filter(**mine).order_by("run_id", "kind", "seq", "branch")
                      .values("pk", "run_id", *STEP_FIELDS)),
        "signals": [{**row, "consumed_at": row["consumed_at"] is not None} for row in
                    Signal.objects.filter(**mine).order_by("pk").values(
                        "pk", "run_id", "name", "payload", "sent_by", "consumed_at",
                        "consumed_by_step", "dedupe_key")],
        "dependencies": list(WorkflowDependency.objects.filter(**mine).order_by(
            "run_id", "step_index", "depends_on").values("run_id", "step_index", "depends_on")),
    }


def build(raw: dict[str, Any]) -> dict[str, Any]:
    """The record, keyed by test node id, from what :class:`Recorder` saw and the rows."""
    session, rows = raw["session"], raw["rows"]
    nodeids, ends, tokens = session["nodeids"], session["ends"], session["tokens"]
    runs = rows["runs"]
    by_run: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for what in ("events", "steps", "signals", "dependencies"):
        by_run[what] = defaultdict(list)
        for row in rows[what]:
            by_run[what][row["run_id"]].append(row)

    # Which test made each run: its pk range, or its parent's test.
    owner: dict[int, str] = {}
    for run in runs:
        link = run["parent_id"] or run["started_by_id"]
        at = bisect.bisect_left(ends, run["pk"])
        owner[run["pk"]] = owner.get(link) or nodeids[min(at, len(nodeids) - 1)]
    labels = _labels(runs, owner)
    steps = {row["pk"]: f"step:{row['kind']}/{row['seq']}/{row['branch']}"
             for row in rows["steps"]}
    signals = {row["pk"]: f"signal:{n}" for run_rows in by_run["signals"].values()
               for n, row in enumerate(run_rows, 1)}

    tests: dict[str, dict[str, Any]] = {
        nodeid: {"outcome": session["outcomes"].get(nodeid, "?"), "runs": {}}
        for nodeid in nodeids}
    keys = _test_keys(nodeids)
    normalisers: dict[str, Normaliser] = {}
    for run in runs:
        pk, test = run["pk"], owner[run["pk"]]
        if test not in normalisers:
            ids = {other: (labels[other] if owner[other] == test else "<other-run>")
                   for other in owner}
            normalisers[test] = Normaliser({**ids, **steps, **signals}, [
                (tokens[test], "<token>")] if test in tokens else [], session["queue"])
        norm = normalisers[test]
        entry: dict[str, Any] = {field: norm(run[field]) for field in RUN_FIELDS}
        entry.update({field: run[field] for field in RUN_SET_FIELDS})
        entry["parent"] = norm(run["parent_id"])
        entry["started_by"] = norm(run["started_by_id"])
        entry["events"] = _in_branch_order([
            {"kind": e["kind"], "step_index": e["step_index"], "step_name": norm(e["step_name"]),
             "attempt": e["attempt"], "step_run": norm(e["step_run_id"]),
             "data": norm(e["data"])} for e in by_run["events"][pk]])
        entry["steps"] = [{field: norm(row[field]) for field in STEP_FIELDS}
                          for row in by_run["steps"][pk]]
        entry["signals"] = [
            {"name": s["name"], "payload": norm(s["payload"]), "sent_by": norm(s["sent_by"]),
             "consumed": s["consumed_at"], "consumed_by_step": s["consumed_by_step"],
             "dedupe_key": norm(s["dedupe_key"])} for s in by_run["signals"][pk]]
        entry["dependencies"] = [{"step_index": d["step_index"], "on": norm(d["depends_on"])}
                                 for d in by_run["dependencies"][pk]]
        tests[test]["runs"][labels[pk]] = entry
    return {"meta": {**raw["meta"], "tests": len(tests), "runs": len(runs)},
            "tests": {keys[nodeid]: test for nodeid, test in tests.items()}}


def _test_keys(nodeids: list[str]) -> dict[str, str]:
    """Node id -> the record's key: a random parameter id (a uuid's hex) as ``<hex>``."""
    keys: dict[str, str] = {}
    for nodeid in nodeids:
        key = _HEX.sub("<hex>", _UUID.sub("<uuid>", nodeid)) if "[" in nodeid else nodeid
        while key in keys.values():
            key += "'"
        keys[nodeid] = key
    return keys


def _in_branch_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timeline, each stretch of a fan-out pass's branch and item events (consecutive
    events of step rows ``step:step/<seq>/*`` of one seq) in branch order: branches finish in
    whatever order the pool runs them. Any other event (the join's step_completed, a wait, a
    run event) ends a stretch, so where a stretch stands in the timeline is kept."""
    def pass_of(event: dict[str, Any]) -> str | None:
        label = event["step_run"]
        if not (isinstance(label, str) and label.startswith("step:step/")):
            return None
        return label.rsplit("/", 1)[0]

    def branch_order(event: dict[str, Any]) -> tuple[int, int]:
        return int(event["step_run"].rsplit("/", 1)[1]), event["attempt"] or 0

    ordered: list[dict[str, Any]] = []
    start = 0
    while start < len(events):
        end, key = start + 1, pass_of(events[start])
        while key is not None and end < len(events) and pass_of(events[end]) == key:
            end += 1
        stretch = events[start:end]
        ordered += sorted(stretch, key=branch_order) if key is not None else stretch
        start = end
    return ordered


def _labels(runs: list[dict[str, Any]], owner: dict[int, str]) -> dict[int, str]:
    """``R<n>`` for a test's own runs (pk order), ``<parent>.c<n>`` / ``.s<n>`` below them."""
    labels: dict[int, str] = {}
    roots: dict[str, int] = defaultdict(int)
    children: dict[tuple[int, str], int] = defaultdict(int)
    for run in runs:  # pk order: a parent comes before its children
        pk, parent, starter = run["pk"], run["parent_id"], run["started_by_id"]
        link, mark = (parent, "c") if parent in labels else (starter, "s")
        if link in labels and owner[link] == owner[pk]:
            children[(link, mark)] += 1
            labels[pk] = f"{labels[link]}.{mark}{children[(link, mark)]}"
        else:
            roots[owner[pk]] += 1
            labels[pk] = f"R{roots[owner[pk]]}"
    return labels


_TIME_KEY = re.compile(r"(^|_)(at|ms|us|seconds|secs|elapsed|duration|since|lag|age)$"
                       r"|^(ran_for|retry_in)$")  # a test step's measure, a jittered delay
_OPAQUE_KEYS = frozenset({"worker", "claimed_by", "pid", "host", "hostname", "node",
                          "traceparent", "trace_id", "span_id"})
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ID = re.compile(r"(?<!\d)\d{8}(?!\d)")
# Random hex (a letter and a digit, or ten digits or more), after any non-hex character: a
# test's ``u`` + 10 hex user name is ``u<hex>``.
_HEX = re.compile(r"(?<![0-9a-f])((?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{6,}|[0-9]{10,})"
                  r"(?![0-9a-f])")
#: The keys of a fan-out's aggregate output (``queuety.core.fanout``).
_AGGREGATE = frozenset({"mode", "succeeded", "failed", "winner", "results"})
#: An approval link's single-use nonce (a signal's dedupe key).
_NONCE = re.compile(r"(?<=approval-link:)[A-Za-z0-9_-]{16}")
#: A worker process, as ``claimed_by`` and messages name it: host:pid, or in a worker
#: host:pid@start/pid (its worker's name, then its pid: ``queuety.runtime.claim``).
_PROCESS = re.compile(re.escape(socket.gethostname()) + r":\d+(@\d{8}T\d{6}\.\d{6}/\d+)?")


class Normaliser:
    """Replaces what differs between two recordings of the same code (see the docstring)."""

    def __init__(self, ids: dict[int, str], literals: list[tuple[str, str]],
                 queue: str) -> None:
        self.ids = ids
        self.literals = [*literals, *([(queue, "<queue>")] if queue else [])]

    def __call__(self, value: Json, key: str | None = None) -> Json:
        if value is None or isinstance(value, bool):
            return value
        if key is not None and (_TIME_KEY.search(key) or key in _OPAQUE_KEYS):
            return "set"
        if key == "traceback" and isinstance(value, str):
            lines = [line for line in value.splitlines() if line.strip()]
            return self.text(lines[-1]) if lines else value
        if isinstance(value, int):
            return self.ids.get(value, value)
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple):
            return [self(item) for item in value]
        if isinstance(value, dict):
            if _AGGREGATE <= value.keys() and value["winner"] is not None:
                value = {**value, "winner": "set"}  # the first to succeed, by finish time
            return {self.text(k): self(v, k) for k, v in value.items()}
        return value

    def text(self, value: str) -> str:
        if value.isdigit() and int(value) in self.ids:
            return self.ids[int(value)]
        for literal, mark in self.literals:
            value = value.replace(literal, mark)
        value = _ISO.sub("<ts>", value)
        value = _PROCESS.sub("<process>", value)
        value = _NONCE.sub("<nonce>", value)
        value = _UUID.sub("<uuid>", value)
        value = _ID.sub(lambda m: self.ids.get(int(m.group()), m.group()), value)
        return _HEX.sub("<hex>", value)


# -- comparing ----------------------------------------------------------------------------------

def _short(value: Json, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _paths(a: Json, b: Json, path: str) -> Iterator[str]:
    """``path: a -> b`` for each leaf where two JSON values differ (lists by index)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                yield from _paths(a.get(key), b.get(key), f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (left, right) in enumerate(zip(a, b)):
            if left != right:
                yield from _paths(left, right, f"{path}[{index}]")
    else:
        yield f"{path}: {_short(a)} -> {_short(b)}"


def _diff_rows(what: str, a: list[Json], b: list[Json], limit: int = 3) -> list[str]:
    """The differences of the first differing rows of two lists (events, steps, signals)."""
    lines = [f"{what}: {len(a)} vs {len(b)} rows"] if len(a) != len(b) else []
    shown = 0
    for index in range(max(len(a), len(b))):
        left = a[index] if index < len(a) else None
        right = b[index] if index < len(b) else None
        if left == right:
            continue
        if shown == limit:
            lines.append(f"{what}[{index}...]: more rows differ")
            break
        shown += 1
        kind = (left or right or {}).get("kind") if isinstance(left or right, dict) else None
        lines += [f"{what}{line}" for line in
                  _paths(left, right, f"[{index}]{f' ({kind})' if kind else ''}")]
    return lines


def diff_test(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Compact differences between two records of one test (empty: the same)."""
    lines = []
    if a["outcome"] != b["outcome"]:
        lines.append(f"outcome: {a['outcome']} -> {b['outcome']}")
    runs_a, runs_b = a["runs"], b["runs"]
    for label in sorted(set(runs_a) | set(runs_b)):
        if label not in runs_b or label not in runs_a:
            side = runs_a.get(label) or runs_b[label]
            lines.append(f"{label}: only in {'A' if label in runs_a else 'B'} "
                         f"({side['name']}, {side['status']})")
            continue
        left, right = runs_a[label], runs_b[label]
        for field in sorted(set(left) | set(right)):
            if left.get(field) == right.get(field):
                continue
            if field in ("events", "steps", "signals", "dependencies"):
                lines += [f"{label} {line}" for line in
                          _diff_rows(field, left.get(field, []), right.get(field, []))]
            else:
                lines += [f"{label} {line}" for line in
                          _paths(left.get(field), right.get(field), field)]
    return lines


def read_noisy(path: str | None) -> dict[str, str]:
    """Node id -> reason, from a file of ``nodeid  # reason`` lines."""
    if not path:
        return {}
    noisy = {}
    for line in Path(path).read_text().splitlines():
        nodeid, _, reason = line.partition("  # ")
        if nodeid.strip() and not nodeid.startswith("#"):
            noisy[nodeid.strip()] = reason.strip()
    return noisy


def compare(a_path: str, b_path: str, noisy_path: str | None = None, only_diff: bool = False,
            write_noisy: str | None = None, limit: int = 12, out: Any = sys.stdout) -> int:
    """Print the comparison of two records; return 1 if a test outside ``noisy`` differs."""
    a = json.loads(Path(a_path).read_text())["tests"]
    b = json.loads(Path(b_path).read_text())["tests"]
    noisy = read_noisy(noisy_path)
    same, differ, noisy_differ, noisy_same, only = [], [], [], [], []
    for nodeid in sorted(set(a) | set(b)):
        if nodeid not in a or nodeid not in b:
            only.append(nodeid)
            print(f"only in {'A' if nodeid in a else 'B'}  {nodeid}", file=out)
            continue
        lines = diff_test(a[nodeid], b[nodeid])
        if not lines:
            (noisy_same if nodeid in noisy else same).append(nodeid)
            if not only_diff:
                print(f"same   {nodeid}", file=out)
            continue
        (noisy_differ if nodeid in noisy else differ).append(nodeid)
        tag = "noisy " if nodeid in noisy else "DIFF  "
        reason = f"  ({noisy[nodeid]})" if noisy.get(nodeid) else ""
        print(f"{tag} {nodeid}{reason}", file=out)
        for line in lines[:limit]:
            print(f"         {line}", file=out)
        if len(lines) > limit:
            print(f"         ... {len(lines) - limit} more", file=out)
    print(f"\n{len(same) + len(noisy_same)} tests identical, {len(differ)} differ"
          + (f"; known noisy: {len(noisy_differ)} differ, {len(noisy_same)} identical"
             if noisy else "")
          + (f"; {len(only)} in one record only" if only else ""), file=out)
    if write_noisy:
        Path(write_noisy).write_text("".join(f"{nodeid}\n" for nodeid in differ))
    return 1 if differ or only else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.characterise",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cmp = commands.add_parser("compare", help="compare two records, test by test")
    cmp.add_argument("a")
    cmp.add_argument("b")
    cmp.add_argument("--noisy", help="known noisy tests (one node id a line, '  # why' after)")
    cmp.add_argument("--only-diff", action="store_true", help="do not list identical tests")
    cmp.add_argument("--lines", type=int, default=12, help="diff lines shown per test")
    cmp.add_argument("--write-noisy", metavar="PATH",
                     help="write the node ids of the tests that differ (not already noisy)")
    again = commands.add_parser("renormalise", help="rebuild a record from its .raw.json rows "
                                "(after a change of the normalisation)")
    again.add_argument("record")
    show = commands.add_parser("show", help="print one test's record")
    show.add_argument("record")
    show.add_argument("nodeid")
    args = parser.parse_args(argv)
    if args.command == "renormalise":
        record = build(json.loads(raw_path(Path(args.record)).read_text()))
        Path(args.record).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return 0
    if args.command == "show":
        print(json.dumps(json.loads(Path(args.record).read_text())["tests"][args.nodeid],
                         indent=1, sort_keys=True))
        return 0
    return compare(args.a, args.b, args.noisy, args.only_diff, args.write_noisy, args.lines)


if __name__ == "__main__":
    sys.exit(main())
