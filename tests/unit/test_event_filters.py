"""The event log's filters from text (``queuety.events_query``): ages and dates for ``since``,
run ids, refused values; and the queryset each builds (compiled, never run)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from queuety import events_query
from queuety.events_query import EventFilters, InvalidEventFilter

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(("text", "back"), [
    ("30s", timedelta(seconds=30)), ("15m", timedelta(minutes=15)), ("1h", timedelta(hours=1)),
    ("2d", timedelta(days=2)), ("1w", timedelta(weeks=1)), (" 90m ", timedelta(minutes=90)),
])
def test_since__an_age_counts_back_from_now(text, back):
    assert events_query.parse_since(text, NOW) == NOW - back


@pytest.mark.parametrize(("text", "moment"), [
    ("2026-02-01T09:30:00Z", datetime(2026, 2, 1, 9, 30, tzinfo=timezone.utc)),
    ("2026-02-01T09:30:00+02:00", datetime(2026, 2, 1, 7, 30, tzinfo=timezone.utc)),
    ("2026-02-01", datetime(2026, 2, 1, tzinfo=timezone.utc)),  # tests.settings: UTC
    ("2026-02-01 09:30", datetime(2026, 2, 1, 9, 30, tzinfo=timezone.utc)),
])
def test_since__an_iso_date_or_time(text, moment):
    assert events_query.parse_since(text, NOW) == moment


@pytest.mark.parametrize("text", ["yesterday", "1y", "-1h", "2026-02-30", "h", "1.5h", ""])
def test_since__anything_else_is_refused_naming_both_forms(text):
    with pytest.raises(InvalidEventFilter, match="neither an age .* nor an ISO 8601"):
        events_query.parse_since(text, NOW)


@pytest.mark.parametrize("text", ["999999999w", "999999999d"])
def test_since__an_age_past_the_calendar_is_refused(text):
    with pytest.raises(InvalidEventFilter, match="before the year 1"):
        events_query.parse_since(text, NOW)


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5", str(2**63)])
def test_run__only_a_positive_bigint(value):
    with pytest.raises(InvalidEventFilter, match="is not a run id"):
        events_query.parse_run(value)


def test_parse__empty_values_are_unset_and_nul_is_refused():
    assert EventFilters.parse(workflow="", run="", kind="", error_type="", since="") == \
        EventFilters()
    assert EventFilters.parse(run="12", since="1h", now=NOW) == EventFilters(
        run_id=12, since=NOW - timedelta(hours=1))
    for field in ("workflow", "kind", "error_type"):
        with pytest.raises(InvalidEventFilter, match="NUL character"):
            EventFilters.parse(**{field: "a\x00b"})


def test_queryset__each_filter_in_sql_newest_first():
    sql = str(events_query.events_matching(EventFilters(
        workflow="orders", run_id=7, kind="step_failed", error_type="ValueError",
        since=NOW)).query)
    assert 'ORDER BY "queuety_event"."created_at" DESC, "queuety_event"."id" DESC' in sql
    assert '"queuety_workflowrun"."name" = orders' in sql
    assert '"queuety_event"."kind" = step_failed' in sql
    assert '"queuety_event"."run_id" = 7' in sql
    assert "ValueError" in sql and "error" in sql


def test_error_type__read_from_the_error_record_only():
    assert events_query.error_type({"error": {"type": "KeyError", "message": "x"}}) == "KeyError"
    for data in ({}, {"error": "text"}, {"error": {"type": 3}}, [], None):
        assert events_query.error_type(data) is None
