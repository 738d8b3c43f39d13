"""The retention pass's first queries (one per rule clause, run by every sweeper tick) read
the ``queuety_run_finished`` index (status, finished_at), never the whole runs table: on
50,000 kept runs (tests/run_tag_data.py), ``EXPLAIN (FORMAT JSON)`` of each has no Seq Scan
of the runs table and its outer scan is an index other than the primary key, and a tick does not take those kept runs. The rows are
loaded in a transaction that is rolled back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from queuety import retention
from queuety.core.retention import compile_rules
from tests import run_tag_data
from tests.integration.test_tag_plans import plan, scans


@pytest.fixture(scope="module")
def loaded():
    with transaction.atomic():
        yield run_tag_data.load(runs=50_000, per_customer=100)
        transaction.set_rollback(True)
    with connection.cursor() as cursor:  # the statistics of the table as it is again
        cursor.execute("ANALYZE queuety_workflowrun")


@pytest.mark.parametrize("rules", [
    {"default": "30d"},
    {"default": {"completed": "7d"}, "order": {"failed": "90d"}},
])
def test_each_clause_of_a_tick_reads_the_finished_index(loaded, rules):
    compiled = compile_rules(rules)
    queries = retention.first_due_queries(compiled, timezone.now())
    assert len(queries) == len(compiled.clauses())
    for query in queries:
        found = scans(plan(query))
        runs = [s for s in found if s[1] == "queuety_workflowrun"]
        # The outer scan (the first, depth first) walks the finished index (or, for one
        # workflow's clause, may read that name's runs from the name index); the primary
        # key is read only for a parent's or starter's status, one row at a time.
        assert runs[0][0] == "Index Scan" and not runs[0][2].endswith("_pkey"), found
        assert runs[0][2] == "queuety_run_finished" or "name" in runs[0][2], found
        assert not [s for s in runs if s[0] == "Seq Scan"], found
        # The loaded runs finished just now: kept (runs other tests left may be due).
        assert loaded.name not in [row["name"] for row in query]
    # What the pass read before: the due runs by id (a walk of the whole primary key when
    # nothing is due).
    old = scans(plan(retention.due_runs(compile_rules({"default": "30d"}), timezone.now())
                     .order_by("pk").values("name")[:1]))
    assert [s for s in old if s[1] == "queuety_workflowrun"][0][2] != "queuety_run_finished"
    # A day later than every loaded run's retention, the tick does find one.
    later = timezone.now() + timedelta(days=31)
    assert retention.select_batch(compile_rules({loaded.name: "30d"}), later, 10).ids
