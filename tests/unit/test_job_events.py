"""Jobs' lifecycle events, derived from their runs' (queuety.signals.JOB_EVENTS): which run
event implies which job event, with which arguments, and what makes a run's event wanted."""

from __future__ import annotations

import pytest

from queuety import models, signals
from queuety.jobs import specs

ERROR = {"type": "ValueError", "message": "no"}


def test_the_job_prefix__is_the_one_the_jobs_name_their_workflows_with():
    assert signals.JOB_PREFIX == specs.PREFIX == models.JOB_PREFIX


@pytest.mark.parametrize(("name", "extra", "expected"), [
    ("run_completed", {"version": None}, ("job_completed", {})),
    ("run_failed", {"error": ERROR}, ("job_buried", {"error": ERROR})),
    ("step_failed", {"attempt": 1, "max_attempts": 3, "error": ERROR, "will_retry": True,
                     "retry_in": 0.5, "step": "add", "step_run_id": 9},
     ("job_failed", {"attempt": 1, "max_attempts": 3, "error": ERROR, "retry_in": 0.5})),
])
def test_a_job_runs_event__implies_its_job_event(name, extra, expected):
    found = signals.job_event(name, {"run_id": 42, "workflow": "task:shop.tasks.add", **extra})
    job, data = expected
    assert found == (job, {"result_id": "42", "run_id": 42, "task": "shop.tasks.add", **data})
    assert set(found[1]) == set(signals.EVENTS[job].arguments)


def test_an_attempt_out_of_retries__implies_no_job_failed_its_run_failed_buries_it():
    assert signals.job_event("step_failed", {
        "run_id": 1, "workflow": "task:a.b", "will_retry": False, "error": ERROR}) is None


@pytest.mark.parametrize("name", ["run_completed", "run_failed", "step_failed", "run_started",
                                  "run_cancelled", "run_waiting"])
def test_a_workflows_run__implies_no_job_event(name):
    assert signals.job_event(name, {"run_id": 1, "workflow": "orders", "will_retry": True}) \
        is None


def test_a_cancelled_or_started_job__implies_no_job_event():
    for name in ("run_started", "run_cancelled", "run_waiting", "run_throttled"):
        assert signals.job_event(name, {"run_id": 1, "workflow": "task:a.b"}) is None


@pytest.fixture
def no_endpoints(monkeypatch):
    """No webhook endpoint subscribes to anything (the outbox's cache, without a database)."""
    from queuety.webhooks import outbox

    monkeypatch.setattr(outbox, "subscribers", lambda: {})


def test_a_job_receiver__makes_a_jobs_run_event_wanted_and_no_workflows(no_endpoints):
    # run_completed: no sink of the app wants it (the chains' and batches' sink wants
    # run_failed, for every run).
    def receiver(sender, **kwargs):
        pass

    assert not signals.wanted("run_completed", "task:a.b")
    signals.job_completed.connect(receiver)
    try:
        assert signals.wanted("run_completed", "task:a.b")
        assert signals.wanted("run_completed")  # the workflow not known: maybe a job's
        assert not signals.wanted("run_completed", "orders")
        assert not signals.wanted("step_failed", "task:a.b")
    finally:
        signals.job_completed.disconnect(receiver)


def test_metrics_on__make_a_jobs_run_events_wanted(settings, no_endpoints):
    settings.QUEUETY = {**settings.QUEUETY, "METRICS": True}
    assert signals.wanted("run_completed", "task:a.b")
    assert not signals.wanted("run_completed", "orders")
