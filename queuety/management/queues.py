"""``manage.py queuety queue list|pause|resume|drain|stats``: queue operations, thin over
``queuety.queues``.

``drain NAME`` pauses the queue (no step of it starts any more) and waits until its running
steps end; the queue stays paused (``queue resume NAME`` restarts it). It exits 1 when
``--timeout`` passes first.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from queuety import exceptions, queues
from queuety.management.starting import Error

Write = Callable[[str], None]
Table = Callable[[list[str], list[list[str]]], None]


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86_400:
        raise argparse.ArgumentTypeError(f"--timeout must be a number of seconds from 0 to "
                                         f"86400 (got {value!r}).")
    return seconds


def add_queue_group(groups: Any) -> None:
    """Add the ``queue`` group to the command's sub-parsers."""
    queue = groups.add_parser("queue", help="Pause, resume and drain Celery queues; show "
                                            "each queue's waiting and running steps.")
    actions = queue.add_subparsers(dest="action", required=True,
                                   metavar="{list,stats,pause,resume,drain}")
    for action, what in (("list", "List the known queues: paused or not, with their numbers."),
                         ("stats", "The same, with the oldest wait and the throughput.")):
        listing = actions.add_parser(action, help=what)
        listing.add_argument("--format", choices=["table", "json"], default="table")
    pause = actions.add_parser("pause", help="Pause a queue: its steps wait, none starts.")
    pause.add_argument("name", help="The Celery queue name.")
    pause.add_argument("--reason", default="", help="Why (shown in the list and the admin).")
    resume = actions.add_parser("resume", help="Resume a paused queue: its held steps start.")
    resume.add_argument("name", help="The Celery queue name.")
    drain = actions.add_parser("drain", help="Pause a queue and wait until its running steps "
                                             "end (it stays paused).")
    drain.add_argument("name", help="The Celery queue name.")
    drain.add_argument("--timeout", type=_seconds, default=None,
                       help="Give up (exit 1) after this many seconds (default: wait).")


def queue_action(options: dict[str, Any], write: Write, table: Table) -> None:
    """Run the ``queue`` group's action ``options["action"]``."""
    action = options["action"]
    try:
        if action in ("list", "stats"):
            _list(action, options["format"], write, table)
        elif action == "pause":
            warning = queues.unknown_warning(options["name"])
            if warning:
                write(f"Warning: {warning}")
            stats = queues.pause_queue(options["name"], actor="manage.py",
                                       reason=options["reason"])
            write(f"Success: Queue '{stats.name}' is paused ({stats.waiting} waiting, "
                  f"{stats.running} running).")
        elif action == "resume":
            released = queues.resume_queue(options["name"], actor="manage.py")
            write(f"Success: Queue '{options['name']}' is resumed; {released} held step(s) "
                  "released.")
        else:
            _drain(options["name"], options["timeout"], write)
    except exceptions.QueuetyError as error:
        raise Error(str(error)) from None


def _drain(name: str, timeout: float | None, write: Write) -> None:
    write(f"Queue '{name}' is paused; waiting for its running steps to end...")
    if not queues.drain_queue(name, timeout=timeout, actor="manage.py"):
        running = queues.running(name.strip())
        raise Error(f"Queue '{name}' still has {running} running step(s) after {timeout:g} s; "
                    "it stays paused (run 'queue drain' again, or 'queue resume').")
    write(f"Success: Queue '{name}' is drained (paused, nothing running).")


def _list(action: str, format: str, write: Write, table: Table) -> None:
    stats = queues.queue_stats()
    if format == "json":
        write(json.dumps([item.to_dict() for item in stats], indent=2))
        return
    header = ["QUEUE", "STATE", "WAITING", "RUNNING"]
    if action == "stats":
        header += ["OLDEST WAIT", "FINISHED 5M", "PER MIN"]
    rows = []
    for item in stats:
        row = [item.name, "paused" if item.paused else "active", str(item.waiting),
               str(item.running)]
        if action == "stats":
            row += ["-" if item.oldest_wait is None else f"{item.oldest_wait:.1f}s",
                    str(item.finished), f"{item.throughput:g}"]
        rows.append(row)
    if not rows:
        write("No queue has steps or a pause.")
        return
    table(header, rows)
