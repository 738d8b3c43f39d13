"""Worker admission: whether this worker process has the memory headroom to start a step.

Read only when ``QUEUETY["ADMISSION"]`` asks for it: the process's resident set size (from
``/proc/self/statm``) against ``MAX_RSS_MB``, and the memory left to it against
``MIN_AVAILABLE_MB``: the container's cgroup limit less its usage when a limit is visible
(cgroup v2, then v1), else the machine's ``MemAvailable`` from ``/proc/meminfo``. Where none
of these files exist (not Linux), the check passes.
"""

from __future__ import annotations

import os
from pathlib import Path

from queuety.conf import settings
from queuety.core import resources

_MB = 1024 * 1024
#: A cgroup v1 "limit" this large means no limit (the kernel writes a page-rounded 2**63).
_NO_LIMIT = 1 << 60


def headroom_problem() -> str | None:
    """None when a step may start here; else a sentence saying which headroom is missing."""
    conf = settings.ADMISSION
    if not conf:
        return None
    max_rss = conf.get("MAX_RSS_MB")
    min_available = conf.get("MIN_AVAILABLE_MB")
    return resources.memory_verdict(
        rss_mb=rss_mb() if max_rss is not None else None, max_rss_mb=max_rss,
        available_mb=available_mb() if min_available is not None else None,
        min_available_mb=min_available)


def defer_seconds() -> float:
    """How long a deferred step waits before it is offered to a worker again."""
    return float(settings.ADMISSION.get("DEFER_SECONDS", 5))


def rss_mb() -> float | None:
    """This process's resident memory in MB, or None where ``/proc`` is not available."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / _MB


def available_mb(root: Path = Path("/")) -> float | None:
    """Memory left to this process in MB: its cgroup's limit less its usage when a limit is
    visible, else ``MemAvailable``; None when neither can be read. ``root``: for tests."""
    cgroup = root / "sys/fs/cgroup"
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes",
                                    "memory/memory.usage_in_bytes")):
        limit, usage = _number(cgroup / limit_file), _number(cgroup / usage_file)
        if limit is not None and usage is not None and limit < _NO_LIMIT:
            return max(limit - usage, 0) / _MB
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


def _number(path: Path) -> int | None:
    """The integer a cgroup file holds; None for ``max`` (no limit) or an unreadable file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
