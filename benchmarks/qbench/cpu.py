"""CPU seconds by process kind over a stretch of a benchmark, from ``/proc`` (Linux only).

The tasks benchmark (``qbench.tasks_bench``) takes a :class:`Meter` reading when a
throughput test's jobs are released and another when the last one finished, and reports the
difference per job: the worker's main process, its pool processes (or django-tasks-db's
``db_worker`` processes), every PostgreSQL process, Redis, and the whole machine (user +
system, all CPUs). It tells a latency-bound engine (the machine partly idle) from a CPU-bound
one, and which process spends the CPU.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

_TICK = os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 for a process that is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _pids_of(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def machine_seconds() -> float:
    """User, nice and system CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as stat:
        return sum(int(value) for value in stat.readline().split()[1:4]) / _TICK


class Meter:
    """CPU seconds of named groups of processes; ``groups`` maps a name to a callable giving
    the group's PIDs at the time of a reading (pool processes come and go)."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = {**groups, "postgres": lambda: _pids_of("postgres"),
                       "redis": lambda: _pids_of("redis-server")}
        self._start: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        found = {name: sum(process_seconds(pid) for pid in pids())
                 for name, pids in self.groups.items()}
        found["machine"] = machine_seconds()
        return found

    def start(self) -> None:
        self._start = self._read()

    def per_job_ms(self, jobs: int) -> dict[str, float]:
        """CPU ms per job of each group since :meth:`start`."""
        now = self._read()
        return {name: round((now[name] - self._start[name]) * 1000 / jobs, 3) for name in now}
