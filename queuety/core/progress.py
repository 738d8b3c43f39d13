"""Progress a running step reports with its heartbeat: what is accepted, and how it reads.

Pure Python. ``context.heartbeat(progress={...})`` checks the value here before the worker
hands it to its heartbeat thread; the admin, the CLI and ``workflow_status()`` render it with
:func:`progress_text`.
"""

from __future__ import annotations

import json
from typing import Any

from queuety import exceptions

#: Keys read as "how much is done" when the progress also has a ``total`` (in this order).
DONE_KEYS = ("done", "processed", "current", "completed", "count", "step")


def check_progress(run_id: int, step_name: str, progress: Any, limit: int) -> dict[str, Any]:
    """Return ``progress`` if a step may report it: a dict of at most ``limit`` bytes of JSON.

    Raises:
        InvalidProgress: not a dict with string keys, not JSON, or too large.
    """
    where = f"Step {step_name!r} of run {run_id}"
    if not isinstance(progress, dict) or not all(isinstance(k, str) for k in progress):
        raise exceptions.InvalidProgress(
            f"{where} reported progress {type(progress).__name__}; report a dict with string "
            "keys, such as {'done': 450, 'total': 1000}.")
    try:
        text = json.dumps(progress, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise exceptions.InvalidProgress(
            f"{where} reported progress that is not JSON: {error}. Report only dicts, lists, "
            "strings, numbers, booleans and None.") from None
    size = len(text.encode())
    if size > limit:
        raise exceptions.InvalidProgress(
            f"{where} reported {size} bytes of progress; the limit is {limit} "
            "(QUEUETY['MAX_PROGRESS_BYTES']). Report counters, not results: results belong "
            "in the step's output.")
    return progress


def progress_text(progress: dict[str, Any] | None) -> str:
    """Progress in a few words: ``450/1000`` (``done``/``total``), ``45%``, or ``key=value``.

    Examples:
        ``{"processed": 450, "total": 1000}`` reads ``450/1000 (45%)``; ``{"percent": 45}``
        reads ``45%``; ``{"stage": "embedding"}`` reads ``stage=embedding``.
    """
    if not progress:
        return ""
    total = progress.get("total")
    done = next((progress[k] for k in DONE_KEYS if _number(progress.get(k))), None)
    parts: list[str] = []
    if _number(total) and done is not None:
        text = f"{_plain(done)}/{_plain(total)}"
        if total:
            text += f" ({100 * done / total:.0f}%)"
        parts.append(text)
    elif _number(progress.get("percent")):
        parts.append(f"{_plain(progress['percent'])}%")
    shown = {"total", "percent", *DONE_KEYS} if parts else set()
    parts += [f"{key}={_plain(value)}" for key, value in progress.items()
              if key not in shown and isinstance(value, str | int | float | bool)]
    return " ".join(parts)[:200]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plain(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
