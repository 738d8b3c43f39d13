"""Turn a run's record (results.json) into the Markdown tables of the report.

Every figure is the median over the rounds with its min..max; every ratio is computed within
a round (engine and peer measured minutes apart on the same machine state), then summarised.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from qbench.util import spread

Round = dict[str, Any]


def _get(round_: Round, path: str) -> float | None:
    value: Any = round_
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, (int, float)) else None


def _fmt(value: float, digits: int) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _cell(values: list[float | None], digits: int = 0) -> str:
    s = spread([v for v in values if v is not None])
    if not s["n"]:
        return "-"
    if s["n"] == 1:
        return _fmt(s["median"], digits)
    return f"{_fmt(s['median'], digits)} ({_fmt(s['min'], digits)}..{_fmt(s['max'], digits)})"


def _series(rounds: list[Round], path: str) -> list[float | None]:
    return [_get(r, path) for r in rounds]


def _ratio_series(rounds: list[Round], top: str, bottom: str) -> list[float | None]:
    out = []
    for r in rounds:
        a, b = _get(r, top), _get(r, bottom)
        out.append(a / b if a is not None and b else None)
    return out


def _median(values: list[float | None]) -> float | None:
    s = spread([v for v in values if v is not None])
    return s["median"] if s["n"] else None


VARIANTS = (("queuety", "Queuety, as shipped"),
            ("queuety_keep", "Queuety, connections kept (CELERY_DB_REUSE_MAX)"))


def render(record: dict) -> str:
    rounds: list[Round] = record.get("rounds", [])
    args = record.get("args", {})
    lines: list[str] = []
    add = lines.append
    add(f"## Results ({len(rounds)} rounds; median (min..max) over rounds)\n")
    # Only the tables of the sections that ran (``--only``); a record without the list ran all.
    ran = set(args.get("sections") or ()) or None

    tables: list[tuple[set[str] | None, Callable[[], None]]] = [
        ({"throughput", "ceiling", "dbos"}, lambda: _throughput(rounds, args, add)),
        ({"latency", "dbos"}, lambda: _latency(rounds, args, add)),
        ({"dispatch"}, lambda: _dispatch(rounds, args, add)),
        ({"scaling"}, lambda: _scaling(rounds, args, add)),
        ({"throughput", "roundtrips"}, lambda: _cost(rounds, add)),
        ({"throughput", "latency", "dbos", "ceiling", "roundtrips"}, lambda: _ratios(rounds, add)),
        (None, lambda: _io(rounds, add)),  # these two look for their own results
        (None, lambda: _tasks(rounds, args, add)),
        ({"txn"}, lambda: _txn(rounds, args, add)),
    ]
    for sections, draw in tables if rounds else ():
        if ran is None or sections is None or ran & sections:
            draw()
    extra = record.get("extra", {})
    if "big" in extra:
        _big(extra["big"], add)
    if "memory" in extra:
        _memory(extra["memory"], add)
    if "streaming" in extra:
        _streaming(extra["streaming"], add)
    if "profile" in extra:
        _profile(extra["profile"], add)
    if "tasks_profile" in extra:
        _tasks_profile(extra["tasks_profile"], add)
    _machine(record.get("machine", {}), add)
    return "\n".join(lines) + "\n"


def _throughput(rounds, args, add) -> None:
    add(f"### Throughput: {args.get('n')} three-step no-op workflows, one worker of 2 prefork "
        "processes\n")
    add("| engine | steps/s | runs/s |")
    add("|---|---:|---:|")
    for key, label in VARIANTS:
        add(f"| {label} | {_cell(_series(rounds, f'tp_{key}.steps_per_s'))} | "
            f"{_cell(_series(rounds, f'tp_{key}.runs_per_s'), 1)} |")
    add(f"| Raw Celery, chain of 3 no-op tasks | "
        f"{_cell(_series(rounds, 'tp_celery_noop.steps_per_s'))} | "
        f"{_cell(_series(rounds, 'tp_celery_noop.runs_per_s'), 1)} |")
    add(f"| Raw Celery, chain of 3 tasks, one PG step transaction each | "
        f"{_cell(_series(rounds, 'tp_celery_pg.steps_per_s'))} | "
        f"{_cell(_series(rounds, 'tp_celery_pg.runs_per_s'), 1)} |")
    add(f"| DBOS 3-step workflows, direct, 2 threads ({args.get('dbos_n')} wf) | "
        f"{_cell(_series(rounds, 'dbos.direct_steps_per_s'))} | "
        f"{_cell(_series(rounds, 'dbos.direct_wf_per_s'), 1)} |")
    if args.get("dbos_queue_n"):
        add(f"| DBOS 3-step workflows, queue, worker_concurrency 2, 10 ms poll "
            f"({args.get('dbos_queue_n')} wf) | "
            f"{_cell(_series(rounds, 'dbos.queue_steps_per_s'))} | "
            f"{_cell(_series(rounds, 'dbos.queue_wf_per_s'), 1)} |")
    add(f"| Ceiling: pgbench step-boundary transaction, 2 clients | "
        f"{_cell(_series(rounds, 'pgbench_step_c2.tps'))} | - |")
    add(f"| Ceiling: pgbench step-boundary transaction, 8 clients | "
        f"{_cell(_series(rounds, 'pgbench_step_c8.tps'))} | - |")
    add(f"| pgbench running queuety's exact per-step SQL (claim + transition), 2 clients | "
        f"{_cell(_series(rounds, 'pgbench_queuety_sql_c2.tps'))} | - |")
    add("")


def _latency(rounds, args, add) -> None:
    add(f"### Latency: one three-step workflow dispatched and awaited, {args.get('lat')} "
        "samples per round (ms)\n")
    add("| engine | p50 | p95 |")
    add("|---|---:|---:|")
    for key, label in VARIANTS:
        add(f"| {label}: dispatch to run completed | "
            f"{_cell(_series(rounds, f'lat_{key}.p50_ms'), 1)} | "
            f"{_cell(_series(rounds, f'lat_{key}.p95_ms'), 1)} |")
        add(f"| {label}: dispatch to last step ran (BLPOP) | "
            f"{_cell(_series(rounds, f'lat_{key}.last_step_p50_ms'), 1)} | "
            f"{_cell(_series(rounds, f'lat_{key}.last_step_p95_ms'), 1)} |")
    add(f"| Raw Celery chain of 3 no-op tasks | "
        f"{_cell(_series(rounds, 'lat_celery_noop.p50_ms'), 1)} | "
        f"{_cell(_series(rounds, 'lat_celery_noop.p95_ms'), 1)} |")
    add(f"| Raw Celery chain, one PG step transaction per task | "
        f"{_cell(_series(rounds, 'lat_celery_pg.p50_ms'), 1)} | "
        f"{_cell(_series(rounds, 'lat_celery_pg.p95_ms'), 1)} |")
    add(f"| DBOS 3-step workflow, called inline | "
        f"{_cell(_series(rounds, 'dbos.latency_p50_ms'), 1)} | "
        f"{_cell(_series(rounds, 'dbos.latency_p95_ms'), 1)} |")
    add("")


def _dispatch(rounds, args, add) -> None:
    add("### Dispatch (`dispatch()` to a queue no worker consumes)\n")
    add("| test | result |")
    add("|---|---:|")
    add(f"| 1 process, {args.get('dispatch_count')} calls | "
        f"{_cell(_series(rounds, 'dispatch_p1.per_s'))} calls/s |")
    add(f"| 8 processes, {max(1, (args.get('dispatch_count') or 4) // 4)} calls each | "
        f"{_cell(_series(rounds, 'dispatch_p8.per_s'))} calls/s |")
    races = [r.get("dispatch_race32", {}) for r in rounds]
    held = [race.get("exactly_one") for race in races if "exactly_one" in race]
    add(f"| 32 processes, one idempotency key, same instant: wall time | "
        f"{_cell([1000 * r['seconds'] if 'seconds' in r else None for r in races], 1)} ms |")
    verdict = ("yes, every round" if held and all(held) and len(held) == len(rounds)
               else f"NO ({held})")
    add(f"| ... exactly one run, one step row, one key row, one message, one id | {verdict} |")
    add("")


def _scaling(rounds, args, add) -> None:
    add(f"### Scaling: steps/s by pool processes of one worker ({args.get('scale_n')} runs for "
        f"1 and 4, {args.get('n')} for 2)\n")
    add("| processes | " + " | ".join(label for _, label in VARIANTS) + " |")
    add("|---:|" + "---:|" * len(VARIANTS))
    for c in (1, 2, 4):
        cells = []
        for key, _ in VARIANTS:
            path = f"tp_{key}.steps_per_s" if c == 2 else f"scale_{key}_c{c}.steps_per_s"
            cells.append(_cell(_series(rounds, path)))
        add(f"| {c} | " + " | ".join(cells) + " |")
    add("")


def _cost(rounds, add) -> None:
    trips = next((r["roundtrips"] for r in reversed(rounds)
                  if isinstance(r.get("roundtrips"), dict) and "step 2" in r["roundtrips"]),
                 None)
    add("### Database cost per step\n")
    if trips:
        add("In-process (`CaptureQueriesContext` around `execute_step`, publishing captured; "
            "median ms per statement, last round; BEGIN is sent by psycopg with the next "
            "statement, whose time includes it):\n")
        add("| phase | statements (round trips) | ms per statement | SQL ms | wall ms |")
        add("|---|---|---|---:|---:|")
        for phase in ("dispatch", "step 1", "step 2", "step 3 (last)",
                      "3 steps, one task (inline)"):
            p = trips.get(phase)
            if p:
                add(f"| {phase} | {' '.join(p['statements'])} ({p['round_trips']}) | "
                    f"{' / '.join(f'{t:.2f}' for t in p['statement_ms'])} | "
                    f"{p['sql_ms']:.2f} | {p['wall_ms']:.2f} |")
        add("")
    first = rounds[0]
    add("In the worker (round 1, `pg_stat_database` deltas of the throughput test divided by "
        "its steps):\n")
    add("| worker | transactions committed / step | new PostgreSQL sessions / step | "
        "rows inserted / step | rows updated / step |")
    add("|---|---:|---:|---:|---:|")
    for key, label in VARIANTS:
        tp = first.get(f"tp_{key}", {})
        add(f"| {label} | {_fmt(tp.get('xact_per_step', math.nan), 2)} | "
            f"{_fmt(tp.get('sessions_per_step', math.nan), 2)} | "
            f"{_fmt(tp.get('rows_inserted_per_step', math.nan), 2)} | "
            f"{_fmt(tp.get('rows_updated_per_step', math.nan), 2)} |")
    dbos = first.get("dbos", {})
    if "xact_per_wf" in dbos:
        add(f"| DBOS (per step = per workflow / 3) | {_fmt(dbos['xact_per_wf'] / 3, 2)} | - "
            "| - | - |")
    add("")


def _goal(values: list[float | None], test: Callable[[float], bool]) -> str:
    m = _median(values)
    if m is None:
        return "-"
    return "met" if test(m) else "**not met**"


def _ratios(rounds, add) -> None:
    add("### Ratios (computed within each round; median (min..max))\n")
    add("| ratio | goal | " + " | ".join(label for _, label in VARIANTS) + " |")
    add("|---|---|" + "---|" * len(VARIANTS))
    rows: list[tuple[str, str, Callable[[str], list], Callable[[float], bool] | None, int]] = [
        ("steps/s ÷ DBOS direct steps/s", "≥ 1.5",
         lambda k: _ratio_series(rounds, f"tp_{k}.steps_per_s", "dbos.direct_steps_per_s"),
         lambda v: v >= 1.5, 2),
        ("steps/s ÷ raw Celery no-op tasks/s", "≥ 0.6",
         lambda k: _ratio_series(rounds, f"tp_{k}.steps_per_s", "tp_celery_noop.steps_per_s"),
         lambda v: v >= 0.6, 2),
        ("p50 latency ÷ DBOS inline p50", "≤ 1.0",
         lambda k: _ratio_series(rounds, f"lat_{k}.p50_ms", "dbos.latency_p50_ms"),
         lambda v: v <= 1.0, 2),
        ("p50 latency ÷ Celery PG-chain p50", "≤ 1.2",
         lambda k: _ratio_series(rounds, f"lat_{k}.p50_ms", "lat_celery_pg.p50_ms"),
         lambda v: v <= 1.2, 2),
        ("steps/s ÷ raw Celery PG-chain steps/s", "(info)",
         lambda k: _ratio_series(rounds, f"tp_{k}.steps_per_s", "tp_celery_pg.steps_per_s"),
         None, 2),
        ("steps/s ÷ DBOS queued steps/s", "(info)",
         lambda k: _ratio_series(rounds, f"tp_{k}.steps_per_s", "dbos.queue_steps_per_s"),
         None, 2),
        ("steps/s ÷ ceiling (pgbench step txn, 2 clients)", "(info)",
         lambda k: _ratio_series(rounds, f"tp_{k}.steps_per_s", "pgbench_step_c2.tps"),
         None, 3),
        ("steps/s ÷ ceiling (pgbench step txn, 8 clients)", "(info)",
         lambda k: _ratio_series(rounds, f"tp_{k}.steps_per_s", "pgbench_step_c8.tps"),
         None, 3),
        ("steps/s ÷ pgbench of queuety's own SQL, 2 clients", "(info)",
         lambda k: _ratio_series(rounds, f"tp_{k}.steps_per_s", "pgbench_queuety_sql_c2.tps"),
         None, 3),
    ]
    for label, goal, series, test, digits in rows:
        cells = []
        for key, _ in VARIANTS:
            values = series(key)
            cell = _cell(values, digits)
            if test is not None and cell != "-":
                cell += f" {_goal(values, test)}"
            cells.append(cell)
        add(f"| {label} | {goal} | " + " | ".join(cells) + " |")
    # Round trips per step: statements in-process, plus connection set-up in the worker.
    trips = next((r["roundtrips"] for r in reversed(rounds)
                  if isinstance(r.get("roundtrips"), dict) and "step 2" in r["roundtrips"]),
                 None)
    if trips:
        # The worst case: a step from its own message. Inline steps cost fewer.
        base = trips["step 2"]["round_trips"]
        inline = trips.get("3 steps, one task (inline)")
        detail = "" if not inline else \
            f"; {inline['round_trips'] / 3:.2f} a step when the next two run inline"
        cells = []
        for key, _ in VARIANTS:
            sessions = rounds[0].get(f"tp_{key}", {}).get("sessions_per_step")
            if sessions is None:
                cells.append(f"{base} in-process{detail}")
            elif sessions >= 0.5:
                cells.append(f"{base} statements + a new connection per step "
                             f"({sessions:.2f} sessions/step) **not met**")
            else:
                cells.append(f"{base}{detail} ({'met' if base <= 6 else '**not met**'})")
        add("| database round trips per step | ≤ 6 | " + " | ".join(cells) + " |")
    add("")


def _streaming(result: dict, add) -> None:
    add("### Streaming steps: chunks one step stores per second\n")
    if "error" in result:
        add(f"failed: {result['error']}\n")
        return
    add("One streaming step yielding short tokens as fast as it can, its attempt run "
        "in-process (claim, generator, chunk writes, transition):\n")
    add("| chunk writes | chunks | chunks/s, median (runs) | ms per chunk |")
    add("|---|---:|---:|---:|")
    for key, label in (("batched", "batched (CHUNK_FLUSH_INTERVAL 0.05 s, as shipped)"),
                       ("per_chunk_insert", "one INSERT per chunk (CHUNK_FLUSH_INTERVAL 0)")):
        row = result[key]
        add(f"| {label} | {row['chunks']:,} | {row['median_chunks_per_second']:,} "
            f"({', '.join(str(r) for r in row['chunks_per_second'])}) | "
            f"{row['median_ms_per_chunk']} |")


IO_ENGINES = (("queuety", "Queuety I/O lane, 1 process, --pool threads -c N, pool of 20"),
              ("dbos", "DBOS, 1 process, async workflow + async step"),
              ("celery_threads", "Raw Celery, --pool threads -c N, a task that sleeps 1 s"))


def _io(rounds, add) -> None:
    """The ``io`` and ``timed`` sections (issue 18), when they ran."""
    if not any(_get(r, f"io{n}_queuety.seconds") is not None for r in rounds
               for n in (200, 1000)) and not any("timed_queuety_timed" in r for r in rounds):
        return
    add("### I/O-bound steps: N concurrent one-step runs whose step awaits 1 s\n")
    add("| N | engine | wall s | peak RSS MiB (all processes) | DB sessions (peak) "
        "| KiB per in-flight step |")
    add("|---:|---|---:|---:|---:|---:|")
    for n in (200, 1000):
        for key, label in IO_ENGINES:
            path = f"io{n}_{key}"
            add(f"| {n} | {label} | {_cell(_series(rounds, path + '.seconds'), 2)} "
                f"| {_cell(_series(rounds, path + '.peak_rss_mib'), 0)} "
                f"| {_cell(_series(rounds, path + '.peak_sessions'), 0)} "
                f"| {_cell(_series(rounds, path + '.kib_per_in_flight_step'), 0)} |")
    add("")
    add("| ratio | goal | result |")
    add("|---|---|---|")
    rows = [
        ("200: wall ÷ DBOS wall", "≤ 1.5", _ratio_series(
            rounds, "io200_queuety.seconds", "io200_dbos.seconds"), lambda v: v <= 1.5),
        ("200: peak RSS ÷ DBOS peak RSS", "≤ 2.0", _ratio_series(
            rounds, "io200_queuety.peak_rss_mib", "io200_dbos.peak_rss_mib"),
         lambda v: v <= 2.0),
        ("1,000: wall ÷ DBOS wall", "≤ 1.2", _ratio_series(
            rounds, "io1000_queuety.seconds", "io1000_dbos.seconds"), lambda v: v <= 1.2),
        ("1,000: DB sessions held by the lane", "≤ 20",
         _series(rounds, "io1000_queuety.peak_sessions"), lambda v: v <= 20),
        ("timed (timeout=30) steps/s ÷ DBOS direct steps/s", "≥ 1.5", _ratio_series(
            rounds, "timed_queuety_timed.steps_per_s", "dbos.direct_steps_per_s"),
         lambda v: v >= 1.5),
        ("timed steps/s ÷ raw Celery no-op tasks/s", "≥ 0.6", _ratio_series(
            rounds, "timed_queuety_timed.steps_per_s", "timed_celery_noop.steps_per_s"),
         lambda v: v >= 0.6),
        ("timed steps/s ÷ the same runs untimed", "(info)", _ratio_series(
            rounds, "timed_queuety_timed.steps_per_s", "timed_queuety_untimed.steps_per_s"),
         None),
    ]
    for name, goal, values, test in rows:
        verdict = "" if test is None else f" {_goal(values, test)}"
        add(f"| {name} | {goal} | {_cell(values, 2)}{verdict} |")
    add("")


def _txn(rounds, args, add) -> None:
    """The ``txn`` section: transactional steps against plain steps (issue 30, part 6)."""
    add(f"### Exactly-once ORM steps: {args.get('n')} three-step runs, each step incrementing "
        "a counter row, one worker of 2 prefork processes\n")
    add("| steps | steps/s |")
    add("|---|---:|")
    add("| `transactional=True` (write, output and transition in one transaction) | "
        f"{_cell(_series(rounds, 'txn_transactional.steps_per_s'))} |")
    add("| plain, the write in its own `transaction.atomic()` | "
        f"{_cell(_series(rounds, 'txn_plain.steps_per_s'))} |")
    add("| transactional ÷ plain | "
        f"{_cell(_ratio_series(rounds, 'txn_transactional.steps_per_s', 'txn_plain.steps_per_s'), 2)} |")
    add("")


TASK_ENGINES = (("queuety", "Queuety's tasks backend (`@task`, Queuety's worker)"),
                ("celery", "Raw Celery tasks (`delay()`, no result backend)"),
                ("celery_late", "Raw Celery tasks, acks late and prefetch 1 (as Queuety's "
                                "worker delivers)"),
                ("db", "django-tasks-db (`db_worker` x 2, 10 ms poll)"))


def _difference_series(rounds: list[Round], top: str, bottom: str) -> list[float | None]:
    out = []
    for r in rounds:
        a, b = _get(r, top), _get(r, bottom)
        out.append(a - b if a is not None and b is not None else None)
    return out


#: The tasks backend's goals (issue 29): (name, goal text, per-round values, test, digits).
def _task_goal_rows(rounds: list[Round]) -> list[tuple[str, str, list, Callable | None, int]]:
    return [
        ("jobs/s ÷ raw Celery no-op tasks/s", "≥ 0.8", _ratio_series(
            rounds, "tasks.queuety_jobs.jobs_per_s", "tasks.celery_jobs.jobs_per_s"),
         lambda v: v >= 0.8, 2),
        ("jobs/s ÷ django-tasks-db jobs/s", "≥ 3", _ratio_series(
            rounds, "tasks.queuety_jobs.jobs_per_s", "tasks.db_jobs.jobs_per_s"),
         lambda v: v >= 3, 2),
        ("p50 enqueue-to-start − Celery's p50 (ms)", "≤ 2 ms", _difference_series(
            rounds, "tasks.queuety_latency.p50_ms", "tasks.celery_latency.p50_ms"),
         lambda v: v <= 2, 1),
        ("jobs/s ÷ raw Celery acks-late prefetch-1 tasks/s", "(info)", _ratio_series(
            rounds, "tasks.queuety_jobs.jobs_per_s", "tasks.celery_late_jobs.jobs_per_s"),
         None, 2),
        ("3 x django-tasks-db jobs/s ÷ raw Celery no-op tasks/s", "(info)", [
            None if v is None else 3 * v for v in _ratio_series(
                rounds, "tasks.db_jobs.jobs_per_s", "tasks.celery_jobs.jobs_per_s")], None, 2),
        ("p50 enqueue-to-start ÷ django-tasks-db's p50", "(info)", _ratio_series(
            rounds, "tasks.queuety_latency.p50_ms", "tasks.db_latency.p50_ms"), None, 2),
        ("enqueue/s ÷ Celery `delay()`/s", "(info)", _ratio_series(
            rounds, "tasks.queuety_enqueue.per_s", "tasks.celery_enqueue.per_s"), None, 2),
        ("enqueue/s ÷ django-tasks-db `enqueue()`/s", "(info)", _ratio_series(
            rounds, "tasks.queuety_enqueue.per_s", "tasks.db_enqueue.per_s"), None, 2),
    ]


def goals(rounds: list[Round]) -> dict[str, list[dict[str, Any]]]:
    """The goals measured so far, for results.json: each with its per-round values, their
    median, min and max, and whether the median meets it."""
    found: dict[str, list[dict[str, Any]]] = {}
    if any("tasks" in r for r in rounds):
        entries = []
        for name, goal, values, test, _ in _task_goal_rows(rounds):
            s = spread([v for v in values if v is not None])
            entries.append({"ratio": name, "goal": goal, "per_round": values,
                            **({k: s[k] for k in ("median", "min", "max")} if s["n"] else {}),
                            "met": None if test is None or not s["n"] else test(s["median"])})
        found["tasks"] = entries
    return found


def _tasks(rounds, args, add) -> None:
    """The ``tasks`` section (issue 29), when it ran."""
    if not any("tasks" in r for r in rounds):
        return
    add(f"### Tasks backend: Django's tasks framework, no-op tasks, 2 worker processes each "
        f"({args.get('n')} tasks; {args.get('dispatch_count')} enqueues; {args.get('lat')} "
        "latency samples)\n")
    add("| engine | jobs/s | enqueue/s, one process | enqueue-to-start p50 ms | p95 ms "
        "| of which the enqueue call, p50 ms |")
    add("|---|---:|---:|---:|---:|---:|")
    for key, label in TASK_ENGINES:
        add(f"| {label} | {_cell(_series(rounds, f'tasks.{key}_jobs.jobs_per_s'))} "
            f"| {_cell(_series(rounds, f'tasks.{key}_enqueue.per_s'))} "
            f"| {_cell(_series(rounds, f'tasks.{key}_latency.p50_ms'), 1)} "
            f"| {_cell(_series(rounds, f'tasks.{key}_latency.p95_ms'), 1)} "
            f"| {_cell(_series(rounds, f'tasks.{key}_latency.enqueue_call_p50_ms'), 2)} |")
    add("")
    _tasks_cpu(rounds, add)
    add("| Queuety's backend: ratio | goal | result |")
    add("|---|---|---|")
    for name, goal, values, test, digits in _task_goal_rows(rounds):
        cell = _cell(values, digits)
        if test is not None and cell != "-":
            cell += f" {_goal(values, test)}"
        add(f"| {name} | {goal} | {cell} |")
    add("")


#: The columns of the tasks section's CPU table: (heading, ``cpu_ms`` key of each engine).
_CPU_COLUMNS = (("worker's main process", ("worker main",)),
                ("pool processes / db_workers", ("pool", "db_worker")),
                ("PostgreSQL", ("postgres",)), ("Redis", ("redis",)), ("whole machine", ("machine",)))


def _tasks_cpu(rounds, add) -> None:
    """CPU ms per job while each engine's throughput test ran (``qbench.cpu``), and how
    much of the machine's CPUs that kept busy: below 100 %, the engine waited, not computed."""
    engines = [(key, label) for key, label in TASK_ENGINES
               if any(_get(r, f"tasks.{key}_jobs.cpu_ms.machine") is not None for r in rounds)]
    if not engines:
        return
    cpus = os.cpu_count() or 1
    add(f"CPU ms per job while the jobs ran (`qbench.cpu`; the machine has {cpus} CPUs):\n")
    add("| engine | " + " | ".join(heading for heading, _ in _CPU_COLUMNS)
        + " | the machine's CPUs busy |")
    add("|---|" + "---:|" * (len(_CPU_COLUMNS) + 1))
    for key, label in engines:
        cells = []
        for _, names in _CPU_COLUMNS:
            values = [next((v for name in names
                            if (v := _get(r, f"tasks.{key}_jobs.cpu_ms.{name}")) is not None),
                           None) for r in rounds]
            cells.append(_cell(values, 2))
        busy = []
        for r in rounds:
            rate, ms = (_get(r, f"tasks.{key}_jobs.jobs_per_s"),
                        _get(r, f"tasks.{key}_jobs.cpu_ms.machine"))
            busy.append(None if rate is None or ms is None else 100 * rate * ms / 1000 / cpus)
        add(f"| {label} | " + " | ".join(cells) + f" | {_cell(busy)} % |")
    add("")


def _big(big: dict, add) -> None:
    add("### Status on a large database\n")
    if "error" in big:
        add(f"failed: {big['error']}\n")
        return
    add(f"Database `queuety_big` with {big['runs']:,} runs (loaded in {big['load_seconds']:.0f} s; "
        f"table {big['table_size']}), status of random ids:\n")
    add("| call | median | p95 |")
    add("|---|---:|---:|")
    add(f"| `workflow_status(id)`, in-process ({big['calls']} calls) | "
        f"{big['status_p50_ms']:.2f} ms | {big['status_p95_ms']:.2f} ms |")
    add(f"| `call_command('queuety', 'workflow', 'status', id)`, in-process | "
        f"{big['command_p50_ms']:.2f} ms | {big['command_p95_ms']:.2f} ms |")
    add(f"| `python manage.py queuety workflow status <id>`, new process each "
        f"({big['cli_calls']} calls) | {big['cli_p50_ms']:.0f} ms | {big['cli_p95_ms']:.0f} ms |")
    add(f"| `list_workflows(status='running', limit=50)` | {big['list_p50_ms']:.2f} ms | "
        f"{big['list_p95_ms']:.2f} ms |")
    add(f"| for scale: `python manage.py version` (process start-up, no query) | "
        f"{big['python_startup_ms']:.0f} ms | - |")
    add("")


def _memory(mem: dict, add) -> None:
    add("### Worker memory (RSS of the main process plus its 2 pool processes, from /proc)\n")
    if "error" in mem:
        add(f"failed: {mem['error']}\n")
        return
    add("| steps completed | main MiB | pool MiB | total MiB |")
    add("|---:|---:|---:|---:|")
    for point in mem["points"]:
        add(f"| {point['steps']:,} | {point['main'] / 1024:.1f} | {point['pool'] / 1024:.1f} | "
            f"{point['total'] / 1024:.1f} |")
    add(f"\nGrowth from {mem['points'][0]['steps']:,} to {mem['points'][-1]['steps']:,} steps: "
        f"{mem['growth_kib'] / 1024:+.1f} MiB ({mem['growth_per_1k_steps_kib']:+.2f} KiB per "
        f"1,000 steps); {mem['steps_per_s']:.0f} steps/s over the run.\n")


def _profile(prof: dict, add) -> None:
    add("### Profile of the hot path\n")
    if "error" in prof:
        add(f"failed: {prof['error']}\n")
        return
    table = prof.get("pyspy_table", [])
    if table:
        add("py-spy on both pool processes of a worker running the throughput workload: share "
            "of the busy samples (task handling, CPU and waits; waiting for the next task "
            "excluded), inclusive:\n")
        add("| component | as shipped | connections kept |")
        add("|---|---:|---:|")
        for label, shipped, kept in table:
            add(f"| {label.replace('  ', '&nbsp;&nbsp;')} | {shipped:.1f} % | {kept:.1f} % |")
        add("")
    rows = prof.get("pyinstrument", [])
    if rows:
        add("pyinstrument around `execute_step` in-process (persistent connection, publishing "
            "captured), share of execute_step time, inclusive:\n")
        add("| component | share |")
        add("|---|---:|")
        for label, share in rows:
            add(f"| {label.replace('  ', '&nbsp;&nbsp;')} | {share:.1f} % |")
        add("")
    if prof.get("notes"):
        add(prof["notes"] + "\n")


def _tasks_profile(prof: dict, add) -> None:
    add("### Profile of a no-op job (Queuety's tasks backend)\n")
    if "error" in prof:
        add(f"failed: {prof['error']}\n")
        return
    spy = prof["pyspy"]
    add(f"py-spy on both pool processes of Queuety's worker running no-op jobs "
        f"({spy['jobs_per_s_while_sampled']:.0f} jobs/s while sampled; "
        f"{spy['busy_ms_per_job']:.1f} ms busy per job; the pool processes were idle, waiting "
        f"for the next message, {spy['idle_percent']:.0f} % of the time). Share of the busy "
        "samples, inclusive:\n")
    add("| component | share |")
    add("|---|---:|")
    for label, share in spy["rows"]:
        if share >= 0.5:
            add(f"| {label.replace('  ', '&nbsp;&nbsp;')} | {share:.1f} % |")
    add("")
    add("What the worker's PostgreSQL sessions waited on while active (pg_stat_activity, "
        "every 5 ms): " + "; ".join(f"{k} {v:.0f} %" for k, v in spy["pg_waits_percent"].items())
        + ".\n")
    add("In-process, publishing captured: " + "; ".join(
        f"`{phase}` {' '.join(p['statements'])} ({len(p['statements'])} statements), "
        f"{p['wall_ms_p50']:.2f} ms" for phase, p in prof["in_process"].items()) + ".\n")


def _machine(facts: dict, add) -> None:
    add("### Machine\n")
    add("| item | value |")
    add("|---|---|")
    for key, value in facts.items():
        add(f"| {key} | {value} |")
    add("")


def failures(record: dict) -> list[str]:
    """Names of failed measurements and correctness checks that did not hold."""
    found = []
    for number, round_ in enumerate(record.get("rounds", []), 1):
        for name, value in round_.items():
            if isinstance(value, dict) and "error" in value:
                found.append(f"round {number} {name}")
        race = round_.get("dispatch_race32", {})
        if "exactly_one" in race and not race["exactly_one"]:
            found.append(f"round {number}: the idempotency race did not yield exactly one run")
    for name, value in record.get("extra", {}).items():
        if isinstance(value, dict) and "error" in value:
            found.append(name)
    return found
