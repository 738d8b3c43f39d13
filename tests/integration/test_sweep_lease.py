"""The sweeper's lease (queuety.store.sweeps), decided in this process against PostgreSQL.

Each test claims a lease row of its own name, so the session worker's sweeps (on the site's
row) never meet it. Real worker processes taking turns are in
tests/reliability/test_sweep_without_beat.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.db.models import F

from queuety.models import SweepLease
from queuety.runtime import sweeper
from queuety.store import locks, sweeps


@pytest.fixture
def name():
    chosen = f"test-{uuid.uuid4().hex[:8]}"
    yield chosen
    SweepLease.objects.filter(name=chosen).delete()


def test_claim__the_first_claim_makes_the_row_and_holds_it(name):
    lease = sweeps.claim("w1", interval=5, lease=30, name=name)
    assert lease == sweeps.Lease(1, "w1", None)
    row = SweepLease.objects.get(name=name)
    assert (row.token, row.holder, row.finished_at) == (1, "w1", None)
    assert row.expires_at - row.started_at == timedelta(seconds=30)


def test_claim__refused_within_the_interval_even_after_the_sweep_ended(name):
    first = sweeps.claim("w1", interval=5, lease=30, name=name)
    assert sweeps.release(first.token, name=name)
    refused = sweeps.claim("w2", interval=5, lease=30, name=name)
    assert isinstance(refused, sweeps.Refusal) and refused.holder == "w1"
    # Due again when the interval since the last start has passed, by the database's clock.
    assert 4 < refused.retry_in <= 5


def test_claim__refused_while_a_sweep_runs_past_its_interval_until_its_lease_expires(name):
    first = sweeps.claim("w1", interval=0.2, lease=1.0, name=name)
    time.sleep(0.3)
    busy = sweeps.claim("w2", interval=0.2, lease=1.0, name=name)
    assert isinstance(busy, sweeps.Refusal) and busy.holder == "w1"
    assert 0 < busy.retry_in <= 0.2  # asks again within the interval
    time.sleep(0.8)
    taken = sweeps.claim("w2", interval=0.2, lease=1.0, name=name)
    assert taken == sweeps.Lease(first.token + 1, "w2", took_over="w1")
    # The first sweeper, back, can neither renew nor end the sweep it lost.
    assert not sweeps.renew(first.token, 1.0, name=name)
    assert not sweeps.release(first.token, name=name)
    assert sweeps.release(taken.token, name=name)


def test_renew__keeps_a_long_sweep_from_being_taken_over(name):
    first = sweeps.claim("w1", interval=0.1, lease=0.6, name=name)
    for _ in range(4):
        time.sleep(0.3)
        assert sweeps.renew(first.token, 0.6, name=name)
        assert isinstance(sweeps.claim("w2", interval=0.1, lease=0.6, name=name),
                          sweeps.Refusal)
    assert sweeps.release(first.token, name=name)
    time.sleep(0.15)
    assert sweeps.claim("w2", interval=0.1, lease=0.6, name=name).holder == "w2"


def test_claim__a_claim_under_way_elsewhere_is_skipped_without_waiting(name):
    sweeps.release(sweeps.claim("w1", interval=0, lease=30, name=name).token, name=name)
    held, go = threading.Event(), threading.Event()

    def claiming_elsewhere():
        try:
            with transaction.atomic():
                assert locks.try_hold(locks.SWEEP, [name]) == {name}
                held.set()
                go.wait(10)
        finally:
            connections.close_all()

    other = threading.Thread(target=claiming_elsewhere)
    other.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        refused = sweeps.claim("w2", interval=0, lease=30, name=name)
        # A claim that waited for the other's transaction would wait until go.set(), after.
        assert time.monotonic() - started < 5
        assert refused == sweeps.Refusal("another worker", 0.0)
    finally:
        go.set()
        other.join()
    assert sweeps.claim("w2", interval=0, lease=30, name=name).holder == "w2"


def test_claim__many_claimants_at_once_get_one_sweep(name):
    sweeps.release(sweeps.claim("w0", interval=0, lease=30, name=name).token, name=name)
    # The last sweep started 10 s ago: due for every claimant (interval 5 s), until one wins.
    SweepLease.objects.filter(name=name).update(started_at=F("started_at") - timedelta(seconds=10))
    barrier = threading.Barrier(8)
    won: list[sweeps.Lease] = []

    def claimant(index):
        try:
            barrier.wait(10)
            got = sweeps.claim(f"w{index}", interval=5, lease=30, name=name)
            if isinstance(got, sweeps.Lease):
                won.append(got)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimant, args=(i,)) for i in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and won[0].token == 2


def test_sweep__stops_before_the_phase_at_which_its_lease_is_lost(caplog):
    asked = []

    def still_held():
        asked.append(True)
        return len(asked) <= 2

    with caplog.at_level("WARNING", logger="queuety"):
        report = sweeper.sweep(still_held=still_held)
    assert list(report) == ["workers", "recovered"]
    assert "The sweep stops before its phase 'throttled'" in caplog.text


def test_sweep__a_renewal_that_fails_stops_the_sweep_there(caplog):
    def still_held():
        raise OperationalError("the database went away")

    with caplog.at_level("WARNING", logger="queuety"):
        report = sweeper.sweep(still_held=still_held)
    assert report == {}
    assert "could not renew the sweeper's lease before its phase 'workers'" in caplog.text


def test_fail_overdue__a_run_whose_row_is_held_elsewhere_costs_a_bounded_wait(caplog):
    import os

    import psycopg
    from django.utils import timezone

    import queuety
    from queuety.models import WorkflowRun
    from tests import workflows

    held_id, free_id = (queuety.workflow("sweep_overdue_held").wait_for_approval()
                        .then(workflows.step_a).dispatch({}) for _ in range(2))
    WorkflowRun.objects.filter(pk__in=[held_id, free_id]).update(
        deadline_at=timezone.now() - timedelta(seconds=1))
    with psycopg.connect(os.environ["DATABASE_URL"], dbname=connection.settings_dict["NAME"]
                         ) as blocker:
        # A site's own transaction holding the run's row (the sweeper locks it FOR UPDATE).
        blocker.execute("SELECT 1 FROM queuety_workflowrun WHERE id = %s FOR KEY SHARE",
                        [held_id])
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="queuety"):
            sweeper.fail_overdue(timezone.now())
        waited = time.monotonic() - started
        assert WorkflowRun.objects.get(pk=free_id).status == "failed"
        assert WorkflowRun.objects.get(pk=held_id).status != "failed"
        blocker.rollback()
    # It waited for the held row (about LOCK_WAIT; the worker's own sweep may have waited on
    # it first), gave up on it alone, and said so; the next sweep fails it.
    assert waited < sweeper.LOCK_WAIT * 3, waited
    assert (f"Run id={held_id} is past its deadline but its row stayed locked" in caplog.text
            or WorkflowRun.objects.get(pk=held_id).status == "failed")
    sweeper.fail_overdue(timezone.now())
    assert WorkflowRun.objects.get(pk=held_id).status == "failed"
