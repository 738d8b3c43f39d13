"""The benchmark driver: ``benchmarks/run [options]`` (see benchmarks/README.md).

Every round runs each workload once for every engine, in the same run, on the same PostgreSQL
and Redis, so that same-round ratios hold on a noisy shared machine. Each figure is then
summarised over the rounds as a median with its min..max; ratios are computed within a round
first, then summarised the same way.

Sections (``--only`` takes a comma-separated subset):

- ``ceiling``: pgbench, step-boundary transaction (2 and 8 clients) and queuety's exact SQL;
- ``throughput``: N three-step runs, one worker of 2 prefork processes, per engine;
- ``dbos``: DBOS Transact latency, direct and queued throughput (a subprocess);
- ``latency``: one three-step run at a time;
- ``dispatch``: dispatch() from 1 and 8 processes, and 32 processes racing on one key;
- ``scaling``: throughput with 1 and 4 pool processes (2 comes from ``throughput``);
- ``roundtrips``: SQL statements of a step boundary, in-process;
- ``io``: 200 and 1,000 concurrent 1 s async steps on one I/O-lane worker, against DBOS async
  workflows and a raw Celery threads-pool worker (``qbench.io_bench``);
- ``timed``: three-step no-op runs whose steps have ``timeout=30``, on 2 prefork processes;
- ``txn``: three-step runs whose steps increment a counter row, as transactional steps
  (exactly-once ORM writes) and as plain steps with their own ``transaction.atomic()``
  (``qbench.txn_bench``);
- ``tasks``: Django's tasks framework: no-op jobs/s, enqueue/s and enqueue-to-start latency of
  Queuety's backend, raw Celery tasks and django-tasks-db (a subprocess, ``qbench.tasks_bench``).

Optional, outside the rounds: ``--big`` (status on 1,000,000 runs), ``--memory`` (worker RSS
after 1,000 and 100,000 steps), ``--streaming`` (chunks/s of one streaming step), ``--profile`` (py-spy on a worker, pyinstrument in-process; with ``tasks`` among the sections, also
``qbench.tasks_profile``: py-spy on a worker running no-op jobs; ``--only tasks --profile``
runs that one alone).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path

from qbench import env, util

SECTIONS = ("ceiling", "throughput", "dbos", "latency", "dispatch", "scaling", "roundtrips",
            "io", "timed", "txn", "tasks")

#: The two Queuety worker configurations measured side by side.
QUEUETY_VARIANTS = {
    # The project as shipped: project.settings.
    "queuety": "project.settings",
    # The suggested fix, measured: the same settings plus CELERY_DB_REUSE_MAX, so Celery's
    # Django fixup stops closing the database connection around every task.
    "queuety_keep": "qbench.settings_reuse",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks/run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3; about 4 "
                        "minutes each on 2 cores)")
    parser.add_argument("--n", type=int, default=1000,
                        help="three-step runs per throughput test (default 1000)")
    parser.add_argument("--lat", type=int, default=200, help="latency samples (default 200)")
    parser.add_argument("--dbos-n", type=int, default=500,
                        help="DBOS workflows, direct throughput (default 500)")
    parser.add_argument("--dbos-queue-n", type=int, default=300,
                        help="DBOS workflows, queued throughput (default 300; 0 = skip)")
    parser.add_argument("--scale-n", type=int, default=250,
                        help="runs per scaling test, 1 and 4 processes (default 250)")
    parser.add_argument("--dispatch-count", type=int, default=600,
                        help="dispatches from one process; 8 processes do a quarter each")
    parser.add_argument("--pgbench-seconds", type=int, default=6,
                        help="duration of each pgbench run (default 6)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections (default all: {','.join(SECTIONS)})")
    parser.add_argument("--no-rounds", action="store_true",
                        help="skip the rounds (run only --big/--memory/--profile)")
    parser.add_argument("--big", action="store_true",
                        help="also: status on a database of --big-runs runs")
    parser.add_argument("--big-runs", type=int, default=1_000_000)
    parser.add_argument("--memory", action="store_true",
                        help="also: worker RSS after 1,000 and --memory-steps steps")
    parser.add_argument("--memory-steps", type=int, default=100_000)
    parser.add_argument("--streaming", action="store_true",
                        help="also: chunks/s one streaming step stores (--streaming-chunks)")
    parser.add_argument("--streaming-chunks", type=int, default=20_000)
    parser.add_argument("--profile", action="store_true",
                        help="also: py-spy on a worker pool process and pyinstrument in-process "
                        "(with --only tasks: on a worker running no-op jobs)")
    args = parser.parse_args(argv)
    args.sections = [s for s in args.only.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; use {','.join(SECTIONS)}")
    return args


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def attempt(results: dict, name: str, call, *args, **kwargs):
    """Run one measurement; record its result, or its error (the run goes on)."""
    log(f"  {name} ...")
    started = time.monotonic()
    try:
        value = call(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported in the table and the exit code
        log(f"  {name} FAILED: {error}")
        traceback.print_exc(file=sys.stderr)
        value = {"error": f"{type(error).__name__}: {error}"}
    results[name] = value
    log(f"  {name}: {json.dumps(value, default=str)[:300]} ({time.monotonic() - started:.0f}s)")
    return value


def queuety_worker(variant: str, concurrency: int, label: str) -> util.Worker:
    environ = {**env.django_env(), "DJANGO_SETTINGS_MODULE": QUEUETY_VARIANTS[variant]}
    return util.Worker("project", concurrency, label=label, environ=environ)


def one_round(number: int, args, workers: dict[str, util.Worker]) -> dict:
    from qbench import ceiling, celery_bench, queuety_bench

    results: dict = {}
    sections = args.sections
    flip = number % 2 == 0  # alternate the order of engines between rounds

    if "ceiling" in sections:
        for script, clients, name in (("step_boundary.pgbench", 2, "pgbench_step_c2"),
                                      ("step_boundary.pgbench", 8, "pgbench_step_c8"),
                                      ("queuety_step.pgbench", 2, "pgbench_queuety_sql_c2")):
            attempt(results, name, ceiling.pgbench, script, clients, args.pgbench_seconds)

    if "throughput" in sections:
        ceiling.seed()  # rows for the Celery PG chain's transactions
        tests = [
            ("celery_noop", lambda: celery_bench.throughput(workers["peer"], args.n, "noop")),
            ("celery_pg", lambda: celery_bench.throughput(workers["peer"], args.n, "pg")),
            ("queuety", lambda: queuety_bench.throughput(
                workers["queuety"], args.n, account=number == 1)),
            ("queuety_keep", lambda: queuety_bench.throughput(
                workers["queuety_keep"], args.n, account=number == 1)),
        ]
        for name, call in (reversed(tests) if flip else tests):
            attempt(results, f"tp_{name}", call)

    if "dbos" in sections:
        command = [sys.executable, "-m", "qbench.dbos_peer", "--n", str(args.dbos_n),
                   "--lat", str(args.lat), "--threads", "2",
                   "--queue-n", str(args.dbos_queue_n)]
        if number == 1:
            command.append("--account")
        attempt(results, "dbos", util.run_json, command, environ=env.django_env(),
                log=env.RESULTS_DIR / "logs" / "dbos.log", timeout=900)

    if "latency" in sections:
        ceiling.seed()
        tests = [
            ("celery_noop", lambda: celery_bench.latency(workers["peer"], args.lat, "noop")),
            ("celery_pg", lambda: celery_bench.latency(workers["peer"], args.lat, "pg")),
            ("queuety", lambda: queuety_bench.latency(workers["queuety"], args.lat)),
            ("queuety_keep", lambda: queuety_bench.latency(workers["queuety_keep"], args.lat)),
        ]
        for name, call in (reversed(tests) if flip else tests):
            attempt(results, f"lat_{name}", call)

    if "dispatch" in sections:
        def dispatch(*options: str) -> dict:
            return util.run_json([sys.executable, "-m", "qbench.dispatch_bench", *options],
                                 environ=env.django_env(),
                                 log=env.RESULTS_DIR / "logs" / "dispatch.log", timeout=600)

        attempt(results, "dispatch_p1", dispatch, "rate", "--procs", "1",
                "--count", str(args.dispatch_count))
        attempt(results, "dispatch_p8", dispatch, "rate", "--procs", "8",
                "--count", str(max(1, args.dispatch_count // 4)))
        attempt(results, "dispatch_race32", dispatch, "race", "--procs", "32")

    if "scaling" in sections:
        for variant in QUEUETY_VARIANTS:
            for concurrency in (1, 4):
                worker = queuety_worker(variant, concurrency, f"{variant}-c{concurrency}")
                try:
                    worker.start()
                    queuety_bench.warm_up(worker)
                    attempt(results, f"scale_{variant}_c{concurrency}",
                            queuety_bench.throughput, worker, args.scale_n)
                finally:
                    worker.stop()

    if "roundtrips" in sections:
        attempt(results, "roundtrips", queuety_bench.roundtrips, 100)

    if "io" in sections:
        _io_round(results, flip)

    if "timed" in sections:
        from qbench import io_bench

        tests = [("queuety_timed", lambda: io_bench.queuety_timed(workers["queuety"], args.n)),
                 ("queuety_untimed", lambda: queuety_bench.throughput(workers["queuety"],
                                                                      args.n)),
                 ("celery_noop", lambda: celery_bench.throughput(workers["peer"], args.n,
                                                                 "noop"))]
        for name, call in (reversed(tests) if flip else tests):
            attempt(results, f"timed_{name}", call)

    if "txn" in sections:
        from qbench import txn_bench

        tests = [("transactional", True), ("plain", False)]
        for name, transactional in (reversed(tests) if flip else tests):
            attempt(results, f"txn_{name}", txn_bench.counter_steps, workers["queuety"],
                    args.n, transactional=transactional)

    if "tasks" in sections:
        _tasks_round(results, args, flip)
    return results


def _io_round(results: dict, flip: bool) -> None:
    """The ``io`` section: 200, then 1,000 concurrent 1 s steps per engine."""
    from qbench import io_bench

    for n in (200, 1000):
        tests = [("queuety", io_bench.queuety_io), ("dbos", io_bench.dbos_io),
                 ("celery_threads", io_bench.celery_io)]
        for name, call in (reversed(tests) if flip else tests):
            attempt(results, f"io{n}_{name}", call, n)


def _tasks_round(results: dict, args, flip: bool) -> None:
    """The ``tasks`` section: its own process, which starts its own workers."""
    command = [sys.executable, "-m", "qbench.tasks_bench", "--n", str(args.n),
               "--enqueue", str(args.dispatch_count), "--lat", str(args.lat)]
    if flip:
        command.append("--flip")
    attempt(results, "tasks", util.run_json, command, environ=env.django_env(),
            log=env.RESULTS_DIR / "logs" / "tasks.log", timeout=900)


def _profiles(record: dict, args, out_dir: Path) -> None:
    """``--profile``: the workflow hot path, and a no-op job's when ``tasks`` is a section
    (``--only tasks --profile`` runs that one alone)."""
    if args.sections != ["tasks"]:
        from qbench import profile

        log("--profile: py-spy on a worker pool process, pyinstrument in-process")
        attempt(record["extra"], "profile", profile.run, out_dir, args.n)
    if "tasks" in args.sections:
        log("--profile: py-spy on Queuety's worker running no-op jobs, in-process statements")
        attempt(record["extra"], "tasks_profile", util.run_json,
                [sys.executable, "-m", "qbench.tasks_profile", "--n", str(args.n),
                 "--out", str(out_dir)], environ=env.django_env(),
                log=env.RESULTS_DIR / "logs" / "tasks.log", timeout=900)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = env.RESULTS_DIR / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    (env.RESULTS_DIR / "logs").mkdir(parents=True, exist_ok=True)

    def on_signal(signum, frame):
        util.stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    from qbench import setup

    setup.check_services()
    log("fresh databases (queuety_bench, pgbench_step, dbos_bench) and Redis db "
        f"{env.REDIS_DB} ...")
    setup.fresh_databases()
    setup.clear_redis()
    env.setup_django()
    from qbench import report

    record: dict = {"started": stamp, "args": vars(args), "machine": setup.machine(),
                    "rounds": [], "extra": {}}
    workers: dict[str, util.Worker] = {}
    status = 0
    try:
        if not args.no_rounds:
            needs_workers = {"throughput", "latency", "timed", "txn"} & set(args.sections)
            if needs_workers:
                from qbench import ceiling, celery_bench, queuety_bench

                log("starting workers (raw Celery peer, Queuety stock, Queuety keep) ...")
                ceiling.seed()
                workers["peer"] = util.Worker("qbench.celery_peer", 2, label="peer",
                                              environ=env.django_env()).start()
                celery_bench.warm_up(workers["peer"])
                for variant in QUEUETY_VARIANTS:
                    workers[variant] = queuety_worker(variant, 2, variant).start()
                    queuety_bench.warm_up(workers[variant])
            for number in range(1, args.rounds + 1):
                log(f"round {number}/{args.rounds}")
                record["rounds"].append(one_round(number, args, workers))
                record["goals"] = report.goals(record["rounds"])
                _save(out_dir, record)
        for worker in workers.values():
            worker.stop()
        workers.clear()
        if args.big:
            from qbench import big

            log(f"--big: status on {args.big_runs:,} runs")
            attempt(record["extra"], "big", big.run, args.big_runs)
        if args.memory:
            from qbench import memory

            log(f"--memory: worker RSS up to {args.memory_steps:,} steps")
            attempt(record["extra"], "memory", memory.run, args.memory_steps)
        if args.streaming:
            from qbench import streaming

            log(f"--streaming: {args.streaming_chunks:,} chunks from one streaming step")
            attempt(record["extra"], "streaming", streaming.run, args.streaming_chunks)
        if args.profile:
            _profiles(record, args, out_dir)
    finally:
        for worker in workers.values():
            worker.stop()
        util.stop_all()
        record["machine"]["load average at end (1, 5, 15 min)"] = ", ".join(
            f"{v:.2f}" for v in os.getloadavg())
        _save(out_dir, record)
    summary = report.render(record)
    (out_dir / "summary.md").write_text(summary)
    print(summary)
    log(f"results: {out_dir}")
    if report.failures(record):
        log("some measurements failed or a correctness check did not hold: "
            + "; ".join(report.failures(record)))
        status = 1
    return status


def _save(out_dir: Path, record: dict) -> None:
    (out_dir / "results.json").write_text(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
