"""Events across runs: the filters of ``manage.py queuety log``, ``GET events/`` and the
admin's events list, as one queryset newest first.

Every filter reads the event table from an index that ends with the order of the answer,
``(created_at, id)`` descending (migration 0019): ``kind`` from ``(kind, created_at, id)``,
``run`` from ``(run, created_at, id)``, ``error_type`` from the expression index on
``data->'error'->>'type'``, ``since`` and the rest from ``(created_at, id)``; a workflow is
matched through its runs' name (indexed on the runs), so no event row carries it. A page is
then an index range scan however big the table is, and a keyset (the last row's
``(created_at, id)``) gives the next one without OFFSET.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from queuety import scope
from queuety.conf import settings
from queuety.core import tags as tag_rules
from queuety.models import ERROR_TYPE, Event, WorkflowRun
from queuety.store.tags import tagged

#: ``since`` as an age: a number and a unit (seconds, minutes, hours, days, weeks).
_AGE = re.compile(r"^\s*(\d{1,9})\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: Run ids are positive bigints: anything past the column is no run.
MAX_RUN_ID = 2**63 - 1


class InvalidEventFilter(ValueError):
    """A filter the log cannot apply; its message says which value and what is accepted."""


@dataclass(frozen=True)
class EventFilters:
    """What to keep: each filter set narrows the log (None: not filtered).

    ``workflow`` is a workflow's name, ``run_id`` one run, ``kind`` an event kind
    (``step_failed``, ``workflow_started`` ...), ``error_type`` the type an event's error
    records (``data["error"]["type"]``, such as ``ValueError`` or ``myapp.errors.Timeout``:
    failed and retried attempts, failed runs), ``since`` the oldest time kept, ``tags``
    tags the event's run carries (every one of them).
    """

    workflow: str | None = None
    run_id: int | None = None
    kind: str | None = None
    error_type: str | None = None
    since: datetime | None = None
    tags: Mapping[str, str] | None = None

    @classmethod
    def parse(cls, *, workflow: str | None = None, run: str | int | None = None,
              kind: str | None = None, error_type: str | None = None,
              since: str | None = None, now: datetime | None = None,
              tags: Iterable[str] = (), tag_separator: str = ":") -> EventFilters:
        """The filters from text (a query string, command-line options); empty means unset.
        ``tags`` are ``key:value`` texts (``key=value`` on the command line, with
        ``tag_separator="="``).

        Raises:
            InvalidEventFilter: a NUL character (no stored text holds one), a run id that is
                not a positive whole number, a ``since`` that is neither an age nor a date, or
                a tag filter that is not ``key:value`` with a valid key.
        """
        try:
            wanted = tag_rules.parse_filters(list(tags), tag_separator)
        except ValueError as error:
            raise InvalidEventFilter(str(error)) from None
        texts = {"workflow": workflow or None, "event": kind or None,
                 "error_type": error_type or None}
        for what, value in texts.items():
            if value is not None and "\x00" in value:
                raise InvalidEventFilter(f"The {what} filter contains a NUL character; no "
                                         "event has one.")
        return cls(workflow=texts["workflow"], run_id=parse_run(run), kind=texts["event"],
                   error_type=texts["error_type"],
                   since=None if not since else parse_since(since, now),
                   tags=wanted or None)


def parse_run(value: str | int | None) -> int | None:
    """A run id from text (None when empty).

    Raises:
        InvalidEventFilter: not a whole number from 1 to 2**63-1.
    """
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 0 < number <= MAX_RUN_ID:
        raise InvalidEventFilter(f"The run filter {value!r} is not a run id (a whole number "
                                 "from 1).")
    return number


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """The oldest time ``since`` keeps: an age back from ``now`` (``30s``, ``15m``, ``1h``,
    ``2d``, ``1w``) or an ISO 8601 date or time (``2026-03-01``, ``2026-03-01T09:30:00Z``;
    without an offset, in the site's time zone).

    Raises:
        InvalidEventFilter: neither form, saying both.
    """
    age = _AGE.match(text)
    if age:
        try:
            return (now or timezone.now()) - timedelta(
                **{_UNITS[age.group(2)]: int(age.group(1))})
        except OverflowError:  # before the year 1
            raise InvalidEventFilter(f"since={text!r} reaches back before the year 1; give "
                                     "a shorter age or a date.") from None
    try:
        moment = parse_datetime(text.strip()) or parse_datetime(f"{text.strip()}T00:00:00")
    except ValueError:  # well-formed but impossible: 2026-02-30
        moment = None
    if moment is None:
        raise InvalidEventFilter(f"since={text!r} is neither an age (such as 30s, 15m, 1h, "
                                 "2d) nor an ISO 8601 date or time (such as 2026-03-01 or "
                                 "2026-03-01T09:30:00Z).")
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return moment


def events_matching(filters: EventFilters, user: Any = None) -> QuerySet[Event]:
    """The events ``filters`` keep, of the runs ``user`` may reach (``QUEUETY["RUN_SCOPE"]``,
    in SQL; None: every run), newest first by ``(created_at, id)``."""
    events = narrow(Event.objects.all(), filters)
    return scope.through_runs(user, events).order_by("-created_at", "-id")


def narrow(events: QuerySet[Event], filters: EventFilters) -> QuerySet[Event]:
    """``events`` with ``filters`` applied (the admin's list filters apply one each)."""
    if filters.kind is not None:
        events = events.filter(kind=filters.kind)
    if filters.run_id is not None:
        events = events.filter(run_id=filters.run_id)
    if filters.workflow is not None:
        events = events.filter(run__name=filters.workflow)
    if filters.error_type is not None:
        # has_key repeats the error-type index's condition, so the planner may use it.
        events = events.alias(error_type=ERROR_TYPE).filter(data__has_key="error",
                                                            error_type=filters.error_type)
    if filters.since is not None:
        events = events.filter(created_at__gte=filters.since)
    if filters.tags:
        # The runs carrying the tags come from the runs' GIN index (queuety_run_tags).
        events = events.filter(tagged(filters.tags, through="run__"))
    return events


def after(events: QuerySet[Event], created_at: datetime, pk: int) -> QuerySet[Event]:
    """``events`` that come after ``(created_at, pk)`` in time, oldest first (the keyset of
    ``--follow``): the ``created_at`` bound is the index's range, the id breaks ties."""
    return (events.filter(created_at__gte=created_at)
            .filter(Q(created_at__gt=created_at) | Q(id__gt=pk))
            .order_by("created_at", "id"))


def rows(events: Iterable[Event], user: Any = None) -> list[dict[str, Any]]:
    """``events`` as the log shows them, each with its run's id and workflow name (one
    query for the page's runs). With ``QUEUETY["RUN_ACCESS"]``, events of runs it refuses
    ``user`` are left out (the page may then hold fewer)."""
    events = list(events)
    runs = WorkflowRun.objects.filter(pk__in={event.run_id for event in events})
    checked = user is not None and settings.RUN_ACCESS is not None
    found = {run.pk: run for run in (runs if checked else runs.only("pk", "name"))}
    return [event_row(event, found[event.run_id].name) for event in events
            if event.run_id in found and (not checked
                                          or scope.may_access(user, found[event.run_id]))]


def event_row(event: Event, workflow: str) -> dict[str, Any]:
    """One event of the log: the timeline's fields, its run and its workflow."""
    return {"id": event.pk, "run_id": event.run_id, "workflow": workflow, "kind": event.kind,
            "step_index": event.step_index, "step_name": event.step_name,
            "attempt": event.attempt, "duration_ms": event.duration_ms, "data": event.data,
            "error_type": error_type(event.data), "created_at": event.created_at}


def error_type(data: Any) -> str | None:
    """The type an event's error records, or None (no error, or not the usual record)."""
    error = data.get("error") if isinstance(data, dict) else None
    found = error.get("type") if isinstance(error, dict) else None
    return found if isinstance(found, str) else None


def latest(filters: EventFilters, user: Any = None, limit: int = 50) -> list[dict[str, Any]]:
    """The newest ``limit`` events ``filters`` keep, newest first."""
    return rows(events_matching(filters, user)[:limit], user)
