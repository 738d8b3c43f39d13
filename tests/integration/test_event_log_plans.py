"""The cross-run event log's first pages read indexes, never the whole event table: on 200,000
events (tests/event_log_data.py), ``EXPLAIN (FORMAT JSON)`` of each filter's first page (and
of a next page, and of the admin's list) shows an index scan of ``queuety_event`` and no Seq
Scan of it. The rows are loaded in a transaction that is rolled back."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import QuerySet
from django.test import RequestFactory, override_settings
from django.utils import timezone

from queuety import events_query
from queuety.admin.events import EventAdmin
from queuety.events_query import EventFilters
from queuety.models import Event
from tests import event_log_data
from tests.settings import QUEUETY as TEST_QUEUETY

PAGE = 51  # a page of 50 and the row that says there is a next one


def plan(queryset: QuerySet[Any]) -> dict[str, Any]:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        found = cursor.fetchone()[0]
    return (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]


def scans(node: dict[str, Any]) -> list[tuple[str, str | None, str | None, int]]:
    """Every (node type, relation, index, rows expected) of a plan."""
    found = [(node["Node Type"], node.get("Relation Name"), node.get("Index Name"),
              int(node["Plan Rows"]))]
    for child in node.get("Plans", ()):
        found += scans(child)
    return found


@pytest.fixture(scope="module")
def loaded():
    with transaction.atomic():
        data = event_log_data.load(events=200_000, runs=2_000, spacing=13)
        yield data
        transaction.set_rollback(True)
    with connection.cursor() as cursor:  # the statistics of the table as it is again
        cursor.execute("ANALYZE queuety_event")


def cases(data: event_log_data.Loaded) -> dict[str, QuerySet[Event]]:
    run = data.run_ids[len(data.run_ids) // 2]
    hour = timezone.now() - timedelta(hours=1)
    found = {
        "no filter": EventFilters(),
        "event": EventFilters(kind="step_failed"),
        "run": EventFilters(run_id=run),
        "workflow": EventFilters(workflow=data.workflows[3]),
        "rare workflow": EventFilters(workflow=data.rare),
        "error_type": EventFilters(error_type="myapp.errors.RateLimited"),
        "since": EventFilters(since=hour),
        "event and since": EventFilters(kind="step_retried", since=hour),
        "workflow and event": EventFilters(workflow=data.workflows[1], kind="step_failed"),
        "error_type and run": EventFilters(error_type="ValueError", run_id=run),
    }
    pages = {name: events_query.events_matching(filters)[:PAGE]
             for name, filters in found.items()}
    # The next page of GET events/: the cursor is a created_at bound.
    middle = timezone.now() - timedelta(days=10)
    pages["next page"] = events_query.events_matching(
        EventFilters(kind="step_completed")).filter(created_at__lt=middle)[:PAGE]
    pages["follow"] = events_query.after(events_query.events_matching(EventFilters()),
                                         timezone.now() - timedelta(seconds=30), 0)[:500]
    return pages


#: A bitmap scan reads every row it matches before the sort: only right for few rows (all the
#: events of one rare workflow's runs), so it is accepted below this estimate.
FEW = 2_000


def assert_index_scan(name: str, queryset: QuerySet[Any], few: int = FEW) -> None:
    found = scans(plan(queryset))
    on_events = [(kind, rows) for kind, relation, _, rows in found
                 if relation == "queuety_event"]
    assert on_events, (name, found)
    assert all(kind != "Seq Scan" for kind, _ in on_events), (name, found)
    assert all(kind in ("Index Scan", "Index Only Scan")
               or (kind == "Bitmap Heap Scan" and rows < few) for kind, rows in on_events), (
        name, found)


def test_plans__each_filter_s_first_page_is_an_index_scan(loaded):
    assert Event.objects.filter(run__name__startswith=loaded.prefix).count() == 200_000
    for name, queryset in cases(loaded).items():
        assert_index_scan(name, queryset)


def test_plans__the_scope_keeps_the_event_table_read_by_index(loaded):
    # The planner weighs the site's own RUN_SCOPE filter (here a JSON key of the runs'
    # state, which it guesses matches 1% of them): with a filter as narrow as step_failed it
    # may read that kind's events by a bitmap and join, a few thousand rows; never the table.
    user = User(username="planner", last_name="a")
    with override_settings(QUEUETY={**TEST_QUEUETY,
                                    "RUN_SCOPE": "tests.workflows.tenant_scope"}):
        for name, filters in (("scoped", EventFilters()),
                              ("scoped event", EventFilters(kind="step_failed"))):
            assert_index_scan(name, events_query.events_matching(filters, user)[:PAGE],
                              few=10_000)


def test_plans__the_admin_list_is_an_index_scan(loaded):
    request = RequestFactory().get("/admin/queuety/event/")
    request.user = User(username="planner", is_superuser=True, is_staff=True)
    from django.contrib import admin

    events = EventAdmin(Event, admin.site).get_queryset(request).order_by("-created_at", "-id")
    assert_index_scan("admin", events[:100])
    assert_index_scan("admin event", events_query.narrow(
        events, EventFilters(kind="step_retried"))[:100])


def test_plans__the_indexes_answer_the_filters_right(loaded):
    # The same rows the plans read fast: each filter's page holds only matching events.
    run = loaded.run_ids[7]
    page = events_query.latest(EventFilters(error_type="KeyError", run_id=None), limit=20)
    assert len(page) == 20 and {row["error_type"] for row in page} == {"KeyError"}
    page = events_query.latest(EventFilters(run_id=run), limit=500)
    assert {row["run_id"] for row in page} == {run} and len(page) == 100
    assert [row["created_at"] for row in page] == sorted(
        (row["created_at"] for row in page), reverse=True)
    page = events_query.latest(EventFilters(workflow=loaded.rare), limit=500)
    assert len(page) == 100 and {row["workflow"] for row in page} == {loaded.rare}
