"""Retries with a real worker: exact back-offs, scoping by isinstance, durable attempt counts.

Criteria R1, R5, R6 and S1-S5 of shared/reference/adk-lessons.md, with their numbers.
"""

from __future__ import annotations

import signal
import time

import pytest

import queuety
from queuety.conf import settings as queuety_settings
from queuety.models import Event, StepRun
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def flaky_run(token, policy=None, **payload):
    builder = queuety.workflow("flaky")
    step = {"retry": policy} if policy else {}
    return (builder.then(workflows.flaky, **step).then(workflows.step_c)
            .dispatch({"token": token, **payload}))


def attempt_events(run_id):
    return list(Event.objects.filter(run_id=run_id, kind__in=(
        "step_retried", "step_failed", "step_completed"), step_name="flaky").order_by("pk"))


def test_R1_exact_backoff_without_jitter(worker, token, semantics):
    policy = queuety.RetryPolicy(max_attempts=5, initial_delay=1, backoff_factor=2, jitter=0,
                                 retry_on=[ValueError])
    run_id = flaky_run(token, policy, **{"raise": "builtins.ValueError"})

    status = wait_for(run_id, timeout=40, worker=worker)

    starts = workflows.execution_times(token)
    gaps = [round(b - a, 3) for a, b in zip(starts, starts[1:])]
    semantics.record("R1 back-off gaps, jitter 0 (s)", "1, 2, 4, 8 (each ≥ nominal, ≤ nominal "
                     "+ 10 % + 0.1 s on the broker, ≤ nominal + sweep period + 0.5 s in the DB)",
                     ", ".join(f"{g:.3f}" for g in gaps))
    assert status.status == "failed" and status.error["type"] == "ValueError"
    assert status.error["attempt"] == 5 and len(starts) == 5
    for gap, nominal in zip(gaps, [1, 2, 4, 8]):
        assert gap >= nominal
        if nominal <= queuety_settings.MAX_ETA:  # carried by the broker: precise
            assert gap <= nominal * 1.1 + 0.1, gaps
        else:  # kept in the database, published by the sweeper
            assert gap <= nominal + queuety_settings.SWEEP_INTERVAL + 0.5, gaps


def test_R1_long_backoff_waits_in_the_database_not_the_broker(worker, token):
    policy = queuety.RetryPolicy(max_attempts=2, initial_delay=6, jitter=0, retry_on=[ValueError])
    run_id = flaky_run(token, policy, **{"raise": "builtins.ValueError"})
    deadline = time.monotonic() + 20
    while not Event.objects.filter(run_id=run_id, kind="step_retried").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)

    waiting = StepRun.objects.get(run_id=run_id, step_name="flaky")
    assert waiting.status == "pending" and waiting.attempt == 1
    assert waiting.published_at is None  # no broker message holds this wait
    status = wait_for(run_id, timeout=30, worker=worker)
    gap = workflows.execution_times(token)[1] - workflows.execution_times(token)[0]
    assert status.status == "failed" and 6 <= gap <= 6 + queuety_settings.SWEEP_INTERVAL + 0.5


def test_R5_one_record_per_attempt_and_never_failed_in_between(worker, token, semantics):
    policy = queuety.RetryPolicy(max_attempts=3, initial_delay=0.3, jitter=0,
                                 retry_on=[ConnectionError])
    run_id = flaky_run(token, policy, fail_times=2, **{"raise": "builtins.ConnectionResetError"})
    seen = set()
    deadline = time.monotonic() + 30
    while (status := queuety.workflow_status(run_id)).status not in ("completed", "failed"):
        seen.add(status.status)
        assert time.monotonic() < deadline
        time.sleep(0.02)

    records = attempt_events(run_id)
    semantics.record("R5 fail twice then succeed", "completed; 3 attempt records (2 retried, "
                     "1 completed); never failed in between",
                     f"{status.status}; {len(records)} records "
                     f"({', '.join(e.kind for e in records)}); states seen {sorted(seen)}")
    assert status.status == "completed" and status.state["succeeded_on"] == 3
    assert seen == {"running"}
    assert [(e.kind, e.attempt) for e in records] == [
        ("step_retried", 1), ("step_retried", 2), ("step_completed", 3)]
    for event in records[:2]:
        assert event.data["error"]["type"] == "ConnectionResetError"
        assert event.data["error"]["message"].startswith(f"attempt {event.attempt} ")
        assert event.data["retry_at"] and event.data["retry_in"] == 0.3 * 2 ** (event.attempt - 1)


def test_R6_retry_budget_survives_a_worker_crash_during_the_backoff(worker, token, semantics):
    policy = queuety.RetryPolicy(max_attempts=3, initial_delay=1, jitter=0,
                                 retry_on=[ValueError])
    run_id = flaky_run(token, policy, **{"raise": "builtins.ValueError"})
    deadline = time.monotonic() + 20
    while len(workflows.marks(f"{token}-flaky")) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)  # attempt 2 has failed; its 2 s back-off is held by the worker

    worker.restart(signal.SIGKILL)  # the whole worker, main process and pool, dies
    status = wait_for(run_id, timeout=40, worker=worker)

    executions = len(workflows.marks(f"{token}-flaky"))
    step = StepRun.objects.get(run_id=run_id, step_name="flaky")
    semantics.record("R6 SIGKILL of every worker process during the back-off after attempt 2",
                     "exactly 1 more execution; attempt == 3; executions ≤ max_attempts (3)",
                     f"{executions} executions; attempt {step.attempt}; {status.status}")
    assert executions == 3 and step.attempt == 3 and step.status == "failed"
    assert status.status == "failed" and status.error["attempt"] == 3


@pytest.mark.parametrize("raised, calls", [
    ("builtins.ValueError", 1),
    ("builtins.ConnectionResetError", 4),          # a builtin ConnectionError subclass
    ("tests.fake_requests.ConnectionError", 1),    # shares the NAME only
])
def test_S1_retry_on_matches_with_isinstance(worker, token, semantics, raised, calls):
    policy = queuety.RetryPolicy(max_attempts=4, initial_delay=0.05, jitter=0,
                                 retry_on=[ConnectionError])
    run_id = flaky_run(token, policy, **{"raise": raised})

    status = wait_for(run_id, timeout=20, worker=worker)

    made = len(workflows.marks(f"{token}-flaky"))
    semantics.record(f"S1 retry_on=[ConnectionError], raises {raised.rsplit('.', 2)[-2:][-1]}"
                     f"{' (fake requests)' if 'fake' in raised else ''}",
                     f"{calls} call(s)", f"{made} call(s)")
    assert status.status == "failed" and made == calls
    assert status.error["type"] == raised.removeprefix("builtins.")


@pytest.mark.parametrize("how", ["bad_output", "permanent_error", "unknown_jump"])
def test_S3_errors_that_cannot_succeed_run_once_even_if_everything_is_retried(
        worker, token, semantics, how):
    retry_all = queuety.RetryPolicy(max_attempts=4, initial_delay=0.05)  # retry_on=None
    builder = queuety.workflow("never_retried").retry(retry_all)
    if how == "bad_output":
        builder = builder.then(workflows.bad_output)
        payload, marker = {}, "bad"
    elif how == "permanent_error":
        builder = builder.then(workflows.flaky)
        payload, marker = {"raise": "queuety.PermanentError"}, "flaky"
    else:
        builder = builder.then(workflows.step_a).then(workflows.jump_to_nowhere)
        payload, marker = {}, "a"
    run_id = builder.then(workflows.step_c).dispatch({"token": token, **payload})

    status = wait_for(run_id, timeout=20, worker=worker)

    calls = len(workflows.marks(f"{token}-{marker}"))
    semantics.record(f"S3 {how} under retry_on=None, max_attempts=4", "1 call, run failed",
                     f"{calls} call(s), run {status.status}")
    assert status.status == "failed" and calls == 1
    assert Event.objects.filter(run_id=run_id, kind="step_retried").count() == 0


def test_S5_no_policy_means_no_retry(worker, token, semantics):
    run_id = flaky_run(token, **{"raise": "builtins.ValueError"})

    status = wait_for(run_id, timeout=20, worker=worker)

    calls = len(workflows.marks(f"{token}-flaky"))
    semantics.record("S5 no policy, ValueError", "1 call", f"{calls} call(s)")
    assert status.status == "failed" and calls == 1
    assert "retry_on=[no exception (worker losses only)]" in status.retry_policy


def test_policy_precedence__step_then_workflow_then_global(token):
    from queuety.store.definitions import effective_policy

    step_policy = queuety.RetryPolicy(max_attempts=7)
    flow_policy = queuety.RetryPolicy(max_attempts=5)
    spec = (queuety.workflow("precedence").retry(flow_policy)
            .then(workflows.step_a, retry=step_policy).then(workflows.step_b).build())
    bare = queuety.workflow("precedence_bare").then(workflows.step_a).build()

    assert effective_policy(spec, 0) == step_policy
    assert effective_policy(spec, 1) == flow_policy
    assert effective_policy(bare, 0) == queuety_settings.DEFAULT_RETRY


def _nested(token: str, inner_attempts: int, outer: queuety.RetryPolicy | None,
            cap: int | None = None) -> int:
    now = queuety.RetryPolicy(max_attempts=inner_attempts, initial_delay=0, jitter=0)
    inner = queuety.workflow("inner").then(workflows.always_fails, retry=now)
    flow = queuety.workflow("outer").run_workflow("inner", inner, retry=outer)
    if cap is not None:
        flow = flow.max_step_attempts(cap)
    return flow.dispatch({"token": token})


def test_R7_a_run_level_cap_stops_nested_retries_multiplying(worker, token, semantics):
    from queuety.models import WorkflowRun

    outer = queuety.RetryPolicy(max_attempts=3, initial_delay=0, jitter=0)
    capped, uncapped = f"{token}c", f"{token}u"
    capped_id = _nested(capped, 2, outer, cap=4)
    uncapped_id = _nested(uncapped, 2, outer)
    status = wait_for(capped_id, worker=worker)
    free = wait_for(uncapped_id, worker=worker)
    runs = len(workflows.marks(f"{capped}-fails"))
    semantics.record("R7 child policy 2 x parent policy 3, cap max_step_attempts=4",
                     "4 executions, then BudgetExceeded; 6 without the cap",
                     f"{runs} executions then {status.error['type'].rsplit('.', 1)[-1]}; "
                     f"{len(workflows.marks(f'{uncapped}-fails'))} without the cap")
    assert runs == 4
    assert status.status == "failed" and status.error["budget"] == "max_step_attempts"
    assert "over its max_step_attempts budget of 4" in status.error["message"]
    assert WorkflowRun.objects.filter(parent_id=capped_id).count() == 2
    assert len(workflows.marks(f"{uncapped}-fails")) == 6   # documented: 2 x 3, no cap
    assert free.status == "failed"
    assert free.error["type"] == "queuety.exceptions.ChildRunFailed"
    assert WorkflowRun.objects.filter(parent_id=uncapped_id).count() == 3


def test_R8_a_child_step_obeys_its_policy_and_the_parent_its_own(worker, token, semantics):
    from queuety.models import WorkflowRun

    alone, nested = f"{token}a", f"{token}n"
    alone_id = _nested(alone, 3, None)
    nested_id = _nested(nested, 3, queuety.RetryPolicy(max_attempts=2, initial_delay=0.2,
                                                       jitter=0))
    status = wait_for(alone_id, worker=worker)
    outer = wait_for(nested_id, worker=worker)
    restarts = list(Event.objects.filter(run_id=nested_id, kind="child_retried"))
    semantics.record("R8 child step max_attempts=3 always fails; parent policy 2",
                     "3 runs then the parent fails; with the parent policy 2 x 3 = 6",
                     f"{len(workflows.marks(f'{alone}-fails'))} then parent "
                     f"{status.status}; {len(workflows.marks(f'{nested}-fails'))} with "
                     f"{len(restarts)} restart")
    assert len(workflows.marks(f"{alone}-fails")) == 3
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.ChildRunFailed"
    assert "attempt 3 failed" in status.error["message"]
    assert len(workflows.marks(f"{nested}-fails")) == 6
    assert outer.status == "failed" and outer.error["attempt"] == 2
    assert len(restarts) == 1 and restarts[0].data["attempt"] == 2
    assert [r.parent_attempt for r in WorkflowRun.objects.filter(parent_id=nested_id)
            .order_by("pk")] == [1, 2]


def test_a_cancelled_child_is_never_restarted(worker, token):
    from queuety.models import WorkflowRun

    run_id = (queuety.workflow("outer_cancel")
              .run_workflow("inner", queuety.workflow("x").wait_for_approval(),
                            retry=queuety.RetryPolicy(max_attempts=3, initial_delay=0))
              .dispatch({"token": token}))
    child = WorkflowRun.objects.get(parent_id=run_id)
    queuety.cancel(child.pk)
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and "cancelled" in status.error["message"]
    assert WorkflowRun.objects.filter(parent_id=run_id).count() == 1


def test_max_step_attempts__a_cap_reached_inside_the_child_fails_the_parent_with_it(worker,
                                                                                    token):
    outer = queuety.RetryPolicy(max_attempts=3, initial_delay=0, jitter=0)
    run_id = _nested(token, 2, outer, cap=3)
    status = wait_for(run_id, worker=worker)
    assert len(workflows.marks(f"{token}-fails")) == 3
    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.BudgetExceeded"
    assert (status.error["budget"], status.error["limit"]) == ("max_step_attempts", 3)


def test_max_step_attempts__holds_when_parallel_branches_fail_at_once(worker, token):
    policy = queuety.RetryPolicy(max_attempts=5, initial_delay=0, jitter=0)
    run_id = (queuety.workflow("capped_branches")
              .parallel([workflows.always_fails, workflows.always_fails], retry=policy)
              .max_step_attempts(3).dispatch({"token": token}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed" and status.error["budget"] == "max_step_attempts"
    # A scheduled retry counts as an attempt when it is scheduled, so two branches failing
    # at the same instant cannot both pass the check: never more than the cap.
    assert 2 <= len(workflows.marks(f"{token}-fails")) <= 3
