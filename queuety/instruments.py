"""The worker's Prometheus instruments: steps finished, their durations, jobs by outcome, the
sweeper's runs.

Off unless ``QUEUETY["METRICS"]`` is on (then ``prometheus-client``, the ``metrics`` extra, must
be installed). Each call is an in-memory update of this process's values: no query, no network.

A worker runs several pool processes, and a site several workers, so per-process values are
only half the answer. With ``PROMETHEUS_MULTIPROC_DIR`` set in the worker's environment (an
empty directory, wiped when the worker starts), prometheus-client's multiprocess mode keeps
each process's values in files there, and :func:`queuety.metrics.exposition` adds them up for
every process of that host. Prometheus then sums the hosts. What the database knows (runs per
status, waiting runs, the oldest due step) is read from PostgreSQL at scrape time instead, so
it is the same whichever process serves it (docs/guide/observability.md).
"""

from __future__ import annotations

import time
from typing import Any

from queuety.conf import settings

#: Step duration buckets, in seconds: from an inline step's milliseconds to a long LLM call.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

_instruments: dict[str, Any] | None = None


def _make() -> dict[str, Any]:
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "steps": Counter("queuety_steps", "Step attempts finished, by workflow, step and "
                         "outcome (completed, failed, retried, timed_out).",
                         ["workflow", "step", "outcome"]),
        "duration": Histogram("queuety_step_duration_seconds", "How long step attempts ran "
                              "(handler and outcome), by workflow and step.",
                              ["workflow", "step"], buckets=DURATION_BUCKETS),
        "sweep_last": Gauge("queuety_sweeper_last_run_timestamp_seconds", "When the sweeper "
                            "last ran (Unix time).", multiprocess_mode="max"),
        "jobs": Counter("queuety_jobs", "Jobs (Django tasks) by task and outcome: completed, "
                        "failed (an attempt failed, another is scheduled), buried (failed "
                        "for good).", ["task", "outcome"]),
        "swept": Counter("queuety_sweeper_recovered", "What the sweeper did, by phase "
                         "(workers, recovered, republished, parents, overdue, purged, "
                         "webhooks).", ["phase"]),
    }


def _get() -> dict[str, Any] | None:
    global _instruments
    if not settings.METRICS:
        return None
    if _instruments is None:
        _instruments = _make()
    return _instruments


def step_finished(workflow: str, step: str, outcome: str, duration_ms: float | None) -> None:
    """Count one attempt of ``step`` that ended with ``outcome``; observe its duration."""
    found = _get()
    if found is None:
        return
    found["steps"].labels(workflow, step, outcome).inc()
    if duration_ms is not None and outcome != "timed_out":
        found["duration"].labels(workflow, step).observe(duration_ms / 1000)


def job_finished(task: str, outcome: str) -> None:
    """Count one job event of ``task`` (its module path): ``completed``, ``failed`` or
    ``buried``."""
    found = _get()
    if found is not None:
        found["jobs"].labels(task, outcome).inc()


def swept(report: dict[str, int]) -> None:
    """Record a sweep: when it ran and what each phase did (a failed phase counts nothing)."""
    found = _get()
    if found is None:
        return
    found["sweep_last"].set(time.time())
    for phase, done in report.items():
        if done > 0:
            found["swept"].labels(phase).inc(done)
