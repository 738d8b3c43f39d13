"""The tag filter's first page of ``GET runs/`` reads the GIN index ``queuety_run_tags``: on
100,000 tagged runs (tests/run_tag_data.py), ``EXPLAIN (FORMAT JSON)`` of the page
``queries.runs_matching(tags=...)`` gives, for one customer (about 100 runs) and for a
customer and a plan together, uses the index and no Seq Scan of the runs table. The rows are
loaded in a transaction that is rolled back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import QuerySet

from queuety import queries
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
        yield run_tag_data.load(runs=100_000, per_customer=100)
        transaction.set_rollback(True)
    with connection.cursor() as cursor:  # the statistics of the table as it is again
        cursor.execute("ANALYZE queuety_workflowrun")


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


def test_a_common_tag_reads_no_whole_table(loaded):
    """A tag a third of the runs carry: the planner may walk the id index newest first
    instead, stopping at a page; either way, it never scans the table."""
    found = scans(plan(queries.runs_matching(tags={"plan": "team"})[:PAGE]))
    assert not [s for s in found if s[0] == "Seq Scan" and s[1] == "queuety_workflowrun"], found
