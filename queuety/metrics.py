"""What the metrics endpoint and ``manage.py queuety metrics`` report.

:func:`handler_stats` is the original's per-handler table (completed, failed, average and p95
duration, error rate) over the last minutes, read from the timeline. :func:`exposition` is the
Prometheus text: the series read from PostgreSQL at scrape time (runs per status, waiting runs
per kind, jobs per task and status, the oldest due step's age), plus the workers' counters
(``queuety.instruments``) added up across this host's processes when
``PROMETHEUS_MULTIPROC_DIR`` is set.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Count, Min
from django.utils import timezone

from queuety.models import JOB_PREFIX, Event, RunStatus, StepRun, StepStatus, WorkflowRun

#: Timeline kinds that end a step attempt, and what they count as.
_ENDINGS = {"step_completed": "completed", "branch_completed": "completed",
            "item_completed": "completed", "step_failed": "failed", "item_failed": "failed",
            "step_retried": "failed"}


@dataclass(frozen=True, slots=True)
class HandlerStats:
    """One workflow step's attempts over the window."""

    workflow: str
    step: str
    completed: int
    failed: int
    avg_ms: float | None
    p95_ms: float | None
    error_rate: float


def handler_stats(minutes: int = 60) -> list[HandlerStats]:
    """Per workflow and step: attempts completed and failed in the last ``minutes``, the
    average and 95th-percentile duration of completed ones, and the share that failed.

    Raises:
        ValueError: ``minutes`` is not a positive whole number.
    """
    if not isinstance(minutes, int) or minutes < 1:
        raise ValueError(f"minutes must be a positive whole number, not {minutes!r}.")
    since = timezone.now() - timedelta(minutes=minutes)
    durations: dict[tuple[str, str], list[float]] = {}
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for workflow, step, kind, duration in (
            Event.objects.filter(created_at__gte=since, kind__in=_ENDINGS)
            .values_list("run__name", "step_name", "kind", "duration_ms").iterator()):
        key = (workflow, step)
        ending = _ENDINGS[kind]
        tally = counts.setdefault(key, {"completed": 0, "failed": 0})
        tally[ending] += 1
        if ending == "completed" and duration is not None:
            durations.setdefault(key, []).append(duration)
    stats = []
    for key, tally in sorted(counts.items()):
        values = sorted(durations.get(key, []))
        total = tally["completed"] + tally["failed"]
        stats.append(HandlerStats(
            key[0], key[1], tally["completed"], tally["failed"],
            round(sum(values) / len(values), 3) if values else None,
            round(values[max(0, math.ceil(0.95 * len(values)) - 1)], 3) if values else None,
            round(tally["failed"] / total, 4) if total else 0.0))
    return stats


def stats_as_json(stats: list[HandlerStats]) -> list[dict[str, Any]]:
    """The JSON form of :func:`handler_stats`."""
    return [asdict(row) for row in stats]


#: Run statuses that wait, and the kind they wait for.
WAITING_KINDS = {RunStatus.WAITING_FOR_SIGNAL: "signal",
                 RunStatus.WAITING_FOR_WORKFLOWS: "workflows"}


class DatabaseCollector:
    """Prometheus series read from the database at each scrape (one grouped query each)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        by_status = dict(WorkflowRun.objects.values_list("status").annotate(n=Count("pk"))
                         .order_by().values_list("status", "n"))
        runs = GaugeMetricFamily("queuety_runs", "Runs per status.", labels=["status"])
        for status in RunStatus:
            runs.add_metric([status.value], by_status.get(status.value, 0))
        yield runs
        waiting = GaugeMetricFamily("queuety_waiting_runs", "Runs parked at a wait, by what "
                                    "they wait for.", labels=["kind"])
        for status, kind in WAITING_KINDS.items():
            waiting.add_metric([kind], by_status.get(status.value, 0))
        yield waiting
        yield self._jobs()
        now = timezone.now()
        oldest = StepRun.objects.filter(status=StepStatus.PENDING, available_at__lte=now
                                        ).aggregate(oldest=Min("available_at"))["oldest"]
        yield GaugeMetricFamily("queuety_oldest_due_step_age_seconds", "How long the oldest "
                                "due pending step has waited for a worker (0: none).",
                                value=0 if oldest is None else (now - oldest).total_seconds())


    @staticmethod
    def _jobs() -> Any:
        """Jobs (Django tasks) per task and run status; a job failed for good (buried) is
        ``failed``."""
        from prometheus_client.core import GaugeMetricFamily

        jobs = GaugeMetricFamily("queuety_jobs_by_status", "Jobs (Django tasks) per task "
                                 "(module path) and status (failed: buried).",
                                 labels=["task", "status"])
        for name, status, count in (
                WorkflowRun.objects.filter(name__startswith=JOB_PREFIX)
                .values_list("name", "status").annotate(n=Count("pk")).order_by()
                .values_list("name", "status", "n")):
            jobs.add_metric([name.removeprefix(JOB_PREFIX), status], count)
        return jobs


def exposition(openmetrics: bool = False) -> tuple[bytes, str]:
    """The Prometheus text (body, content type): the database's series, and the workers'
    counters of this host (all processes, with ``PROMETHEUS_MULTIPROC_DIR``; else this
    process's own)."""
    from prometheus_client import REGISTRY, CollectorRegistry, multiprocess
    from prometheus_client import exposition as text

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Own(REGISTRY))
    if openmetrics:
        from prometheus_client.openmetrics import exposition as open_text

        return (open_text.generate_latest(registry),  # type: ignore[no-untyped-call]
                open_text.CONTENT_TYPE_LATEST)
    return text.generate_latest(registry), text.CONTENT_TYPE_LATEST


class _Own:
    """This process's Queuety instruments from the default registry."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        for family in self.registry.collect():
            if family.name.startswith("queuety_"):
                yield family
