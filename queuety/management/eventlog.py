"""``manage.py queuety log``: events across runs (the original's ``wp queuety log``), thin
over ``queuety.events_query``.

The newest ``--limit`` events the filters keep are printed oldest first, as a log reads;
``--follow`` then keeps printing new ones as they are written, until interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from queuety import events_query
from queuety.management import acting
from queuety.management.starting import Error

#: How far back each ``--follow`` poll looks again: an event is stamped when its
#: transaction writes it and seen when that commits, so one committed late may carry a time
#: just before the newest one printed. Those seen already are skipped by id.
FOLLOW_OVERLAP = timedelta(seconds=5)
#: At most this many new events are read per poll (the next poll reads on).
FOLLOW_BATCH = 500

Write = Callable[[str], None]


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 10_000:
        raise argparse.ArgumentTypeError(f"--limit must be a whole number from 1 to 10000 "
                                         f"(got {value!r}).")
    return number


def _interval(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0.05 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"--interval must be a number of seconds from 0.05 "
                                         f"to 3600 (got {value!r}).")
    return seconds


def add_log_group(groups: Any) -> None:
    """Add the ``log`` group to the command's sub-parsers."""
    log = groups.add_parser(
        "log", help="Show events across runs, newest last; filter by workflow, run, event "
                    "kind, error type and age, and --follow new ones.")
    log.add_argument("--workflow", default=None, metavar="NAME",
                     help="Only events of runs of this workflow (its name).")
    log.add_argument("--run", default=None, metavar="ID", help="Only events of this run.")
    log.add_argument("--event", default=None, metavar="KIND",
                     help="Only events of this kind (step_failed, workflow_started ...).")
    log.add_argument("--error-type", default=None, metavar="TYPE",
                     help="Only events whose error has this type (ValueError, "
                          "myapp.errors.Timeout): failed and retried attempts, failed runs.")
    log.add_argument("--since", default=None, metavar="AGE_OR_TIME",
                     help="Only events since then: an age (30s, 15m, 1h, 2d, 1w) or an ISO "
                          "8601 date or time (2026-03-01, 2026-03-01T09:30:00Z).")
    log.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                     help="Only events of runs carrying this tag (customer=42); repeat it "
                          "for several, all of which must match.")
    log.add_argument("--limit", type=_limit, default=50,
                     help="How many of the newest events to show (default 50).")
    log.add_argument("--follow", action="store_true",
                     help="Keep printing new events as they are written, until interrupted.")
    log.add_argument("--interval", type=_interval, default=1.0,
                     help="With --follow, seconds between polls (default 1).")
    log.add_argument("--json", action="store_true", dest="as_json",
                     help="One JSON object per event and line (JSON Lines).")
    log.add_argument("--as-user", default=None, metavar="USERNAME",
                     help="Only events of runs QUEUETY['RUN_SCOPE'] gives this user, each "
                          "decided by QUEUETY['RUN_ACCESS'] (default: every run).")


def log_action(options: dict[str, Any], write: Write,
               flush: Callable[[], None] = lambda: None) -> None:
    """Print the log ``options`` ask for, then follow it if asked (``flush``: after each
    batch, so a pipe sees new events as they come).

    Raises:
        Error: an invalid filter, or an unknown ``--as-user``.
    """
    user = acting.acting_user(options)
    try:
        filters = events_query.EventFilters.parse(
            workflow=options["workflow"], run=options["run"], kind=options["event"],
            error_type=options["error_type"], since=options["since"],
            tags=options.get("tag") or (), tag_separator="=")
    except events_query.InvalidEventFilter as error:
        raise Error(str(error)) from None
    show = _json_lines(write) if options["as_json"] else _table_rows(write)
    try:
        found = list(reversed(events_query.latest(filters, user, options["limit"])))
        if found or options["as_json"]:
            show(found)
        elif not options["follow"]:
            write("No events found.")
        if options["follow"]:
            flush()
            _follow(filters, user, found, show, options["interval"], flush)
    except KeyboardInterrupt:  # Ctrl-C ends --follow, the way it is meant to end
        return


def _follow(filters: events_query.EventFilters, user: Any, shown: list[dict[str, Any]],
            show: Callable[[list[dict[str, Any]]], None], interval: float,
            flush: Callable[[], None]) -> None:
    """Poll for events after the last shown and show them, until Ctrl-C."""
    matching = events_query.events_matching(filters, user)
    last = (shown[-1]["created_at"], shown[-1]["id"]) if shown else (_now_or_since(filters), 0)
    # Every event there is now counts as seen, shown or not (older than --limit showed):
    # what the overlap finds later is only what committed since.
    seen = dict(matching.filter(created_at__gte=last[0] - FOLLOW_OVERLAP,
                                created_at__lte=last[0]).values_list("pk", "created_at"))
    while True:
        # Late commits inside the overlap first (rare, and few), then on from the newest. The
        # keyset moves over the rows read, shown or not (RUN_ACCESS may leave some out).
        window = matching.filter(created_at__gte=last[0] - FOLLOW_OVERLAP,
                                 created_at__lte=last[0]).exclude(pk__in=list(seen))
        late = list(window.order_by("created_at", "id")[:FOLLOW_BATCH])
        new = list(events_query.after(matching, *last)[:FOLLOW_BATCH])
        late = [event for event in late if event.pk not in {each.pk for each in new}]
        found = events_query.rows(late + new, user)
        if found:
            show(found)
            flush()
        if new:
            last = (new[-1].created_at, new[-1].pk)
        seen.update((event.pk, event.created_at) for event in late + new)
        seen = {pk: at for pk, at in seen.items() if at >= last[0] - FOLLOW_OVERLAP}
        if len(new) < FOLLOW_BATCH:
            time.sleep(interval)


def _now_or_since(filters: events_query.EventFilters) -> datetime:
    now = timezone.now()
    return now if filters.since is None else min(now, filters.since)


def _json_lines(write: Write) -> Callable[[list[dict[str, Any]]], None]:
    def show(found: list[dict[str, Any]]) -> None:
        for row in found:
            write(json.dumps({**row, "created_at": row["created_at"].isoformat()},
                             ensure_ascii=False, default=str))
    return show


HEADER = ["ID", "Run", "Workflow", "Step", "Event", "Attempt", "Duration_ms", "Error",
          "Created_at"]
#: Column widths rows keep at least, so the batches --follow prints mostly line up.
MIN_WIDTHS = [8, 6, 16, 12, 18, 7, 11, 24, 32]


def _table_rows(write: Write) -> Callable[[list[dict[str, Any]]], None]:
    """Show events as table rows: the header above the first batch only, so the rows
    ``--follow`` adds continue the table."""
    headed = False

    def show(found: list[dict[str, Any]]) -> None:
        nonlocal headed
        cells = [[str(e["id"]), str(e["run_id"]), e["workflow"], e["step_name"] or "-",
                  e["kind"], str(e["attempt"] or "-"),
                  "-" if e["duration_ms"] is None else f"{e['duration_ms']:g}",
                  _error_text(e), e["created_at"].isoformat()] for e in found]
        lines = cells if headed else [HEADER, *cells]
        widths = [max([len(line[i]) for line in lines] + [MIN_WIDTHS[i]])
                  for i in range(len(HEADER))]
        for line in lines:
            write("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
        headed = True
    return show


def _error_text(event: dict[str, Any]) -> str:
    error = (event["data"] or {}).get("error") if isinstance(event["data"], dict) else None
    if not isinstance(error, dict):
        return "-"
    text = f"{event['error_type'] or 'error'}: {error.get('message', '')}"
    return text[:60]
