"""Races with exactly one outcome, and a clear answer for every loser.

Already covered elsewhere, and not repeated here: 32 processes dispatching one idempotency
key (tests/integration/test_guardrails.py) and 20 concurrent ``queuety.approve()`` calls
(tests/integration/test_signals.py). This module adds the same approval race through the
REST API, cancel racing a step's completion, and signals racing a budget breach.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

from django.db import connection
from rest_framework.test import APIClient

import queuety
from queuety.models import Event, Signal, WorkflowRun
from tests import workflows
from tests.integration.conftest import wait_for
from tests.integration.test_api import make_user


def race(count: int, action) -> list:
    """Run ``action(n)`` in ``count`` threads released together; return their results."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def contender(n):
        barrier.wait()
        try:
            results[n] = action(n)
        except Exception as error:  # noqa: BLE001 - the outcome is what is measured
            results[n] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=contender, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_20_concurrent_api_approvals__one_200_and_19_conflicts(worker, token, figures):
    run_id = (queuety.workflow("rel_api_race").wait_for_approval().then(workflows.step_a)
              .dispatch({"token": token}))
    user = make_user("view_workflowrun", "signal_workflowrun")

    def approve(n):
        client = APIClient()
        client.force_authenticate(user)
        response = client.post(f"/queuety/api/runs/{run_id}/approve/",
                               data=json.dumps({"by": n}), content_type="application/json")
        return response.status_code, response.json().get("code")

    results = Counter(race(20, approve))

    assert results == {(200, None): 1, (409, "already_answered"): 19}, results
    assert wait_for(run_id, worker=worker).status == "completed"
    assert Signal.objects.filter(run_id=run_id).count() == 1
    assert Event.objects.filter(run_id=run_id, kind="wait_settled").count() == 1
    assert len(workflows.marks(f"{token}-a")) == 1
    figures.record("race_api_approvals", outcomes={f"{k[0]} {k[1] or ''}".strip(): v
                                                   for k, v in results.items()})


def test_cancel_racing_step_completion__one_outcome_per_run(worker, token, figures):
    spec = queuety.workflow("rel_cancel_race").then(workflows.slow).then(workflows.step_c)
    runs = [spec.dispatch({"token": f"{token}-{n}", "sleep": 0.2}) for n in range(20)]

    def cancel(n):
        time.sleep(random.uniform(0.0, 0.6))
        try:
            queuety.cancel(runs[n])
            return "cancelled"
        except queuety.InvalidTransition as error:
            assert "already completed" in str(error), error
            return "refused: completed"

    answers = race(20, cancel)
    outcomes = Counter()
    in_flight = 0
    for n, run_id in enumerate(runs):
        status = wait_for(run_id, worker=worker)
        kinds = list(Event.objects.filter(run_id=run_id).order_by("pk")
                     .values_list("kind", flat=True))
        if answers[n] == "cancelled":
            assert status.status == "cancelled"
            # Nothing completes after the cancel; a step finishing late is discarded.
            after = kinds[kinds.index("workflow_cancelled"):]
            assert "step_completed" not in after and "workflow_completed" not in kinds
            outcomes["cancelled, late step discarded" if "step_discarded" in after
                     else "cancelled"] += 1
        else:
            assert answers[n] == "refused: completed", answers[n]
            assert status.status == "completed" and "workflow_cancelled" not in kinds
            outcomes["completed, cancel refused"] += 1
        assert kinds.count("step_completed") <= 2
        # step_c ran once if the run completed. In a cancelled run it ran only if it was
        # already claimed when the cancel committed (in flight; with inline continuation it is
        # claimed by slow's own transition), and then its outcome was discarded.
        c_ran = len(workflows.marks(f"{token}-{n}-c"))
        if status.status == "completed":
            assert c_ran == 1
        elif c_ran:
            # The run is cancelled at once; the attempt in flight records its discard when
            # it finishes (after a try again if its transition crossed the cancel's locks).
            assert c_ran == 1
            deadline = time.monotonic() + 10
            while not Event.objects.filter(run_id=run_id, kind="step_discarded",
                                           step_name="step_c").exists():
                assert time.monotonic() < deadline, kinds
                time.sleep(0.05)
            in_flight += 1
    assert sum(outcomes.values()) == 20
    figures.record("race_cancel_vs_completion", outcomes=dict(outcomes),
                   cancelled_while_the_last_step_ran=in_flight)


def test_20_signals_whose_transition_breaches__all_refused_nothing_recorded(worker, token,
                                                                            figures):
    run_id = (queuety.workflow("rel_signal_budget").max_transitions(1)
              .then(workflows.step_a).wait_for_signal("go").then(workflows.step_c)
              .dispatch({"token": token}))
    wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)

    results = race(20, lambda n: queuety.signal(run_id, "go", {"n": n}))

    assert all(isinstance(r, queuety.BudgetExceeded) for r in results), results
    assert {(r.budget, r.limit, r.used) for r in results} == {("max_transitions", 1, 2)}
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.transitions) == ("waiting_for_signal", 1)
    assert not Signal.objects.filter(run_id=run_id).exists()
    figures.record("race_signals_vs_budget", refused=len(results), recorded=0)


def test_signal_racing_a_breaching_step__the_run_fails_once_and_never_passes_the_wait(
        worker, token, figures):
    spec = (queuety.workflow("rel_signal_vs_breach").max_cost_units(1)
            .then(workflows.step_a).then(workflows.slow).wait_for_signal("go")
            .then(workflows.step_c))
    runs = [spec.dispatch({"token": f"{token}-{n}", "sleep": 0.2}) for n in range(20)]

    def send(n):
        time.sleep(random.uniform(0.0, 0.6))
        try:
            return "stored" if not queuety.signal(runs[n], "go", {"n": n}).settled else "settled"
        except queuety.RunNotWaiting:
            return "refused: run failed"

    answers = Counter(race(20, send))
    for n, run_id in enumerate(runs):
        status = wait_for(run_id, worker=worker)
        assert status.status == "failed"
        assert (status.error["budget"], status.error["step"]) == ("max_cost_units", "slow")
        assert workflows.marks(f"{token}-{n}-c") == []
        assert Event.objects.filter(run_id=run_id, kind="workflow_failed").count() == 1
        assert not Event.objects.filter(run_id=run_id, kind="wait_settled").exists()
    assert set(answers) <= {"stored", "refused: run failed"}, answers
    figures.record("race_signal_vs_breach", outcomes=dict(answers))
