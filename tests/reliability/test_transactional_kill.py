"""Exactly-once ORM steps under SIGKILL: 200 runs of a transactional step that increments one
counter row, while a thread SIGKILLs the worker's pool processes again and again. A killed
attempt's increment was never committed (it rolls back with the connection), the retry runs
on a clean slate, and no attempt's increment commits twice: the counter is exactly 200."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

import queuety
from queuety.models import Event, StepRun, WorkflowRun
from tests import txn_steps
from tests.testapp.models import Counter

pytestmark = pytest.mark.worker

RUNS = 200


def test_transactional_kill__200_runs_under_sigkills_count_exactly_200(worker, token,
                                                                       figures):
    Counter.objects.create(name=token)
    flow = queuety.workflow("txn_kill").then(
        txn_steps.bump_slowly, transactional=True,
        retry=queuety.RetryPolicy(max_attempts=25, initial_delay=0.05, max_delay=0.5))
    run_ids = [flow.dispatch({"counter": token, "linger": 0.03}) for _ in range(RUNS)]

    done = threading.Event()
    kills: list[int] = []

    def killer() -> None:
        time.sleep(0.5)
        while not done.is_set():
            pids = worker.pool_pids()
            if pids:  # none reported between a kill and the replacement
                pid = random.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass
            done.wait(0.4)

    thread = threading.Thread(target=killer, name="txn-killer", daemon=True)
    thread.start()
    deadline = time.monotonic() + 240
    try:
        while WorkflowRun.objects.filter(pk__in=run_ids, status="completed").count() < RUNS:
            assert time.monotonic() < deadline, worker.log()[-3000:]
            assert not WorkflowRun.objects.filter(pk__in=run_ids, status="failed").exists()
            time.sleep(0.2)
    finally:
        done.set()
        thread.join()

    lost = Event.objects.filter(run_id__in=run_ids, kind="step_retried",
                                data__error__type="queuety.exceptions.WorkerLost").count()
    completed = StepRun.objects.filter(run_id__in=run_ids, status="completed").count()
    value = Counter.objects.values_list("value", flat=True).get(name=token)
    figures.record("transactional_kill", runs=RUNS, kills=len(kills), lost_attempts=lost,
                   counter=value)
    assert completed == RUNS
    assert value == RUNS, f"{len(kills)} kills, {lost} lost attempts"
    # The kills landed mid-step, where the increment was written but not committed.
    assert len(kills) >= 5 and lost >= 3
    seen = sorted(StepRun.objects.filter(run_id__in=run_ids, status="completed")
                  .values_list("output__seen", flat=True))
    assert seen == list(range(1, RUNS + 1))  # every committed output saw its own increment
