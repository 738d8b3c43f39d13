"""The claim's commit: on its own it does not wait for the WAL flush, and that never reaches
the statements after it (the attempt's outcome, or the writes of a transaction it runs in)."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import queuety
from queuety.models import StepRun, WorkflowRun
from queuety.runtime import claim
from tests import workflows


@pytest.fixture
def pending_row():
    """A run's first step on a queue nothing consumes, so only this test claims it."""
    assert connection.vendor == "postgresql", "these tests read PostgreSQL's settings"
    run_id = (queuety.workflow("claim_commit").on_queue(f"claim-nobody-{uuid.uuid4().hex[:8]}")
              .then(workflows.step_a).dispatch({}))
    yield StepRun.objects.get(run_id=run_id)
    # Claimed by this process, the row would otherwise wait for the sweeper to retry it.
    WorkflowRun.objects.filter(pk=run_id).delete()


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def _claimed(step_run_id: int) -> tuple[claim.Claim | None, str]:
    with CaptureQueriesContext(connection) as captured:
        taken = claim.claim(step_run_id)
    (statement,) = [query["sql"] for query in captured.captured_queries]
    return taken, statement


def test_a_claim_alone_relaxes_its_own_commit_and_no_other(pending_row):
    before = _synchronous_commit()

    taken, statement = _claimed(pending_row.pk)

    assert taken is not None and taken.attempt == 1
    assert StepRun.objects.get(pk=pending_row.pk).status == "processing"
    assert "set_config('synchronous_commit', 'off', true)" in statement
    # The relaxed setting was the claim's own transaction's: the outcome's commit waits.
    assert _synchronous_commit() == before


def test_a_claim_inside_a_transaction_keeps_its_owners_commit_as_it_was(pending_row):
    before = _synchronous_commit()
    with transaction.atomic():
        taken, statement = _claimed(pending_row.pk)
        assert _synchronous_commit() == before
    assert taken is not None
    assert "set_config" not in statement
    assert StepRun.objects.get(pk=pending_row.pk).status == "processing"


def test_a_claim_out_of_autocommit_keeps_its_owners_commit_as_it_was(pending_row):
    connection.set_autocommit(False)
    try:
        taken, statement = _claimed(pending_row.pk)
        connection.commit()
    finally:
        connection.set_autocommit(True)
    assert taken is not None
    assert "set_config" not in statement
