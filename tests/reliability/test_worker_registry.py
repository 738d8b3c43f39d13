"""Which attempts the worker registry takes back: those whose ``claimed_by`` names a worker
no longer in the registry, once their own heartbeat is ``WORKER_LOST_AFTER`` old.

The sweep is called in-process on rows claimed in-process under a worker's name (the session
worker, whose sweeper would act on the same rows, is stopped meanwhile). The shipped-timings
scenarios with real killed workers are in ``test_recovery_timings.py``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

import queuety
from queuety.conf import settings
from queuety.models import Event, StepRun, Worker
from queuety.runtime import claim, sweeper
from tests import workflows

GONE = "ghost-host:77@20261202T090000.000000"


@pytest.fixture
def claimed(quiet_session_worker, monkeypatch):
    """``claimed(worker, heartbeat_age)``: a run's first step, claimed by this process as a
    process of ``worker`` ('' for no worker: ``host:pid``), its heartbeat that many seconds
    old; on a queue nothing consumes, so only the sweep below touches it."""
    Worker.objects.all().delete()
    queue = f"registry-nobody-{uuid.uuid4().hex[:8]}"

    def make(worker: str, heartbeat_age: float) -> StepRun:
        run_id = (queuety.workflow("registry_claimed").on_queue(queue)
                  .then(workflows.step_a, retry=queuety.RetryPolicy(max_attempts=2))
                  .dispatch({}))
        row = StepRun.objects.get(run_id=run_id)
        monkeypatch.setattr(claim, "_worker", worker)
        assert claim.claim(row.pk) is not None
        StepRun.objects.filter(pk=row.pk).update(
            heartbeat_at=timezone.now() - timedelta(seconds=heartbeat_age))
        return StepRun.objects.get(pk=row.pk)

    return make


def _retried_as_lost(row: StepRun) -> bool:
    return Event.objects.filter(run_id=row.run_id, kind="step_retried",
                                data__error__type="queuety.exceptions.WorkerLost").exists()


def test_an_attempt_of_a_worker_gone_from_the_registry_is_taken_once_it_stopped_beating(
        claimed):
    old = claimed(GONE, settings.WORKER_LOST_AFTER + 1)
    beating = claimed(GONE, 0)

    sweeper.recover_lost_workers(timezone.now())

    assert old.claimed_by == f"{GONE}/{old.claimed_by.rsplit('/', 1)[1]}"
    assert _retried_as_lost(old)
    assert StepRun.objects.get(pk=old.pk).status == "pending"
    # Its process may outlive its main process: it is taken once it stops beating.
    assert StepRun.objects.get(pk=beating.pk).status == "processing"
    assert not _retried_as_lost(beating)


def test_an_attempt_of_a_worker_still_in_the_registry_is_left_to_the_stale_path(claimed):
    row = claimed(GONE, settings.WORKER_LOST_AFTER + 1)
    Worker.objects.create(name=GONE, processes=[], started_at=timezone.now(), beat_at=Now())

    sweeper.recover_lost_workers(timezone.now())

    assert StepRun.objects.get(pk=row.pk).status == "processing"
    assert not _retried_as_lost(row)


def test_an_attempt_claimed_outside_a_worker_names_none(claimed):
    row = claimed("", settings.WORKER_LOST_AFTER + 1)

    sweeper.recover_lost_workers(timezone.now())

    assert ":" in row.claimed_by and "@" not in row.claimed_by
    assert StepRun.objects.get(pk=row.pk).status == "processing"


def test_a_lost_worker_of_an_earlier_version_is_matched_by_its_beat(claimed):
    """A worker on an earlier version claimed as host:pid and listed its pool processes."""
    row = claimed("", settings.WORKER_LOST_AFTER + 1)
    Worker.objects.create(name="old-host:5@20261202T080000.000000",
                          processes=[row.claimed_by], started_at=timezone.now(),
                          beat_at=timezone.now() - timedelta(hours=1))

    assert sweeper.recover_lost_workers(timezone.now()) == 1

    assert _retried_as_lost(row)
    assert not Worker.objects.exists()
