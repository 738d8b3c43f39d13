"""The tag filter's first page of ``GET runs/`` reads the GIN index ``queuety_run_tags``: on
100,000 tagged runs (tests/run_tag_data.py), ``EXPLAIN (FORMAT JSON)`` of the page
``queries.runs_matching(tags=...)`` gives, for one customer (about 100 runs) and for a
customer and a plan together, uses the index and no Seq Scan of the runs table; a tag a third
of the runs carry is read newest first from the primary key; the event log's ``tag=`` filter
(``GET events/``, 300,000 events) reads the runs from the GIN index and their events from an
events index, never the whole events table. The rows are loaded in a transaction that is
rolled back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import QuerySet

from queuety import events_query, queries
from queuety.models import WorkflowRun
from tests import run_tag_data

PAGE = 51  # a page of 50 and the row that says there is a next one


def plan(queryset: QuerySet[Any]) -> dict[str, Any]:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        found = cursor.fetchone()[0]
    return (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]


def scans(node: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    found = [(node["Node Type"], node.get("Relation Name"), node.get("Index Name"))]
    for child in node.get("Plans", ()):
        found += scans(child)
    return found


@pytest.fixture(scope="module")
def loaded():
    with transaction.atomic():
        loaded = run_tag_data.load(runs=100_000, per_customer=100)
        run_tag_data.load_events(loaded, per_run=3)
        yield loaded
        transaction.set_rollback(True)
    with connection.cursor() as cursor:  # the statistics of the tables as they are again
        cursor.execute("ANALYZE queuety_workflowrun")
        cursor.execute("ANALYZE queuety_event")


@pytest.mark.parametrize("case", ["customer", "customer and plan", "customer and region"])
def test_first_page_of_a_tag_filter_reads_the_gin_index(loaded, case):
    wanted = {"customer": loaded.customer(7),
              **({"plan": "pro"} if case == "customer and plan" else {}),
              **({"region": "r3"} if case == "customer and region" else {})}
    page = queries.runs_matching(tags=wanted)[:PAGE]
    found = scans(plan(page))
    assert ("Bitmap Index Scan", None, "queuety_run_tags") in found, found
    assert not [s for s in found if s[0] == "Seq Scan" and s[1] == "queuety_workflowrun"]
    # And the page is what the filter says: newest first, every run carrying every tag.
    rows = list(page)
    assert rows and all(run.tags.items() >= wanted.items() for run in rows)
    assert [run.pk for run in rows] == sorted((run.pk for run in rows), reverse=True)


def test_a_common_tag_reads_the_primary_key_newest_first(loaded):
    """A tag a third of the runs carry: the planner walks the id index newest first and
    stops at a page (a Limit over a backward scan of the primary key), filtering each row;
    it never scans the table, nor reads the GIN index for a third of it."""
    top = plan(queries.runs_matching(tags={"plan": "team"})[:PAGE])
    found = scans(top)
    assert not [s for s in found if s[0] == "Seq Scan" and s[1] == "queuety_workflowrun"], found
    assert top["Node Type"] == "Limit", top
    under = top["Plans"][0]
    assert (under["Node Type"], under.get("Scan Direction"), under["Relation Name"]) == (
        "Index Scan", "Backward", "queuety_workflowrun"), under
    assert under["Index Name"].endswith("_pkey"), under


@pytest.mark.parametrize("case", ["customer", "customer and plan"])
def test_event_log_tag_filter_reads_indexes_only(loaded, case):
    wanted = [f"customer:{loaded.customer(7)}", *(["plan:pro"] if case != "customer" else [])]
    filters = events_query.EventFilters.parse(tags=wanted)
    page = events_query.events_matching(filters)[:PAGE]
    found = scans(plan(page))
    assert not [s for s in found if s[0] == "Seq Scan"], found
    assert ("Bitmap Index Scan", None, "queuety_run_tags") in found, found
    assert any(s[1] == "queuety_event" and s[2] for s in found), found
    rows = list(page)
    expected = 300 if case == "customer" else 99
    assert len(rows) == min(PAGE, expected)
    runs = {run.pk: run.tags for run in WorkflowRun.objects.filter(pk__in={e.run_id for e in rows})}
    assert all(tags["customer"] == loaded.customer(7) for tags in runs.values())
