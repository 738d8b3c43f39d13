"""Waits that remind, timeouts on workflow waits and ``delay_until()``, on PostgreSQL with a
real worker that sweeps each second (the session worker's sweep fires reminders and timeouts
from the database)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection
from django.utils import timezone as django_timezone

import queuety
from queuety import signals
from queuety.models import Event, StepRun, WorkflowRun
from queuety.runtime import reminders
from tests import wait_reminder_steps as steps
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def reminder_events(run_id: int) -> list[Event]:
    return list(Event.objects.filter(run_id=run_id, kind="wait_reminder").order_by("pk"))


def kinds(run_id: int) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind", flat=True))


# -- reminders ---------------------------------------------------------------------------------

def test_signal_wait__reminds_at_the_interval_and_never_after_the_signal(worker, token):
    run_id = (queuety.workflow("remind_signal").wait_for_signal("go", remind_every=1)
              .then(workflows.step_a).dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    parked = WorkflowRun.objects.get(pk=run_id)
    assert parked.waiting_since is not None and parked.reminders == 0
    details = queuety.workflow_status(run_id).wait_details
    assert details["remind_at"] == parked.remind_at.isoformat()
    assert parked.remind_at == parked.waiting_since + timedelta(seconds=1)
    deadline = time.monotonic() + 20
    while len(reminder_events(run_id)) < 3:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.1)
    queuety.signal(run_id, "go", {})
    wait_for(run_id, worker=worker)
    sent = reminder_events(run_id)
    elapsed = (sent[-1].created_at - parked.waiting_since).total_seconds()
    # Once per interval: counted 1, 2, 3..., never more than one a second of waiting.
    assert [e.data["count"] for e in sent] == list(range(1, len(sent) + 1))
    assert len(sent) <= elapsed + 1
    assert all(e.data["kind"] == "signal" and e.step_name == "wait_for_go" for e in sent)
    waited = [e.data["waited_seconds"] for e in sent]
    assert waited == sorted(waited) and waited[0] >= 1.0
    # The wait ended: the write that ended it cleared the reminder, and none follows.
    done = WorkflowRun.objects.get(pk=run_id)
    assert (done.remind_at, done.waiting_since, done.reminders) == (None, None, 0)
    time.sleep(2.5)
    assert len(reminder_events(run_id)) == len(sent)
    assert kinds(run_id).index("wait_settled") > kinds(run_id).index("wait_reminder")


def test_remind_after_alone__sends_one_reminder(worker, token):
    run_id = (queuety.workflow("remind_once").wait_for_approval(remind_after=1)
              .then(workflows.step_a).dispatch({"token": token}))
    deadline = time.monotonic() + 20
    while not reminder_events(run_id):
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.1)
    time.sleep(3)
    sent = reminder_events(run_id)
    assert len(sent) == 1 and sent[0].data["kind"] == "approval"
    assert sent[0].data["next_at"] is None
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.remind_at is None and run.reminders == 1
    queuety.cancel(run_id)


def test_cancelled_run__gets_no_reminder(worker, token):
    run_id = (queuety.workflow("remind_cancel").wait_for_signal("go", remind_after=1.5)
              .dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.cancel(run_id)
    time.sleep(3)
    assert reminder_events(run_id) == []
    assert WorkflowRun.objects.get(pk=run_id).remind_at is None


def test_two_sweeps_at_once__never_double_a_reminder(no_sweeps, token):
    """With the lease held by the test, only these threads sweep: each due reminder is
    claimed by one of them, whichever; none is sent twice."""
    runs = [queuety.workflow("remind_race").wait_for_signal("go", remind_every=60)
            .dispatch({"token": f"{token}-{i}"}) for i in range(20)]
    past = django_timezone.now() - timedelta(seconds=1)
    WorkflowRun.objects.filter(pk__in=runs).update(remind_at=past)
    received: list[int] = []

    def receiver(sender, run_id, count, **kwargs):
        received.append(run_id)

    signals.run_reminder.connect(receiver)
    start = threading.Barrier(4)
    sent: list[int] = []

    def sweep() -> None:
        start.wait()
        try:
            sent.append(reminders.remind_due(django_timezone.now()))
        finally:
            connection.close()

    try:
        threads = [threading.Thread(target=sweep) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        signals.run_reminder.disconnect(receiver)
    assert sum(sent) == 20
    assert sorted(received) == sorted(runs)
    for run_id in runs:
        events = reminder_events(run_id)
        assert [e.data["count"] for e in events] == [1], run_id
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.reminders == 1 and run.remind_at > django_timezone.now()
    # A second pass finds none due.
    assert reminders.remind_due(django_timezone.now()) == 0
    for run_id in runs:
        queuety.cancel(run_id)


def test_reminder_scan__uses_the_partial_index():
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("EXPLAIN SELECT id FROM queuety_workflowrun WHERE remind_at <= now() "
                       "AND status IN ('waiting_for_signal', 'waiting_for_workflows') "
                       "ORDER BY remind_at LIMIT 100")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "queuety_run_remind" in plan


def test_wait_reminder__is_a_webhook_event():
    assert signals.BY_WEBHOOK["wait.reminder"] == "run_reminder"


# -- workflow waits with a timeout ---------------------------------------------------------------

def sleeper() -> queuety.WorkflowBuilder:
    return queuety.workflow("remind_sleeper").then(workflows.slow)


def test_workflow_wait_timeout_continue__moves_on_and_the_children_keep_running(worker,
                                                                                   token):
    run_id = (queuety.workflow("wf_timeout_continue")
              .then(workflows.step_a)
              .start_workflows("kids", sleeper(), payload_key="sleep")
              .wait_for_workflows("started_workflow_ids", result_key="children",
                                  timeout=timedelta(seconds=1), on_timeout="continue",
                                  remind_after=0.5)
              .then(workflows.step_b)
              .dispatch({"token": token, "kids": [4]}))
    parked = wait_for(run_id, ("waiting_for_workflows",), worker=worker)
    expires = WorkflowRun.objects.get(pk=run_id).wait_expires_at
    assert expires is not None
    assert parked.wait_details["expires_at"] == expires.isoformat()
    assert parked.wait_details["on_timeout"] == "continue"
    done = wait_for(run_id, timeout=20, worker=worker)
    assert done.status == "completed" and done.state["children"] is None
    assert done.state["done_b"] is True
    events = kinds(run_id)
    assert events.count("wait_timed_out") == 1 and "wait_settled" not in events
    child_id = done.state["started_workflow_ids"][0]
    assert queuety.workflow_status(child_id).status == "running"  # not touched
    assert wait_for(child_id, timeout=20, worker=worker).status == "completed"
    time.sleep(1.5)  # the child's end must not wake the parent again
    assert kinds(run_id).count("workflow_completed") == 1
    assert parked.status == "waiting_for_workflows"


def test_workflow_wait_timeout_fail__fails_with_wait_expired(worker, token):
    run_id = (queuety.workflow("wf_timeout_fail")
              .start_workflows("kids", sleeper(), payload_key="sleep")
              .wait_for_workflows("started_workflow_ids", timeout=1)
              .then(workflows.step_b)
              .dispatch({"token": token, "kids": [4]}))
    failed = wait_for(run_id, ("failed",), timeout=20, worker=worker)
    assert failed.error["type"] == "queuety.exceptions.WaitExpired"
    assert "did not finish within 1s" in failed.error["message"]
    assert failed.error["on_timeout"] == "fail"


def test_workflow_wait_timeout_jump__goes_to_the_named_step(worker, token):
    run_id = (queuety.workflow("wf_timeout_jump")
              .start_workflows("kids", sleeper(), payload_key="sleep")
              .wait_for_workflows("started_workflow_ids", timeout=1, on_timeout="step_c")
              .then(workflows.step_b)
              .then(workflows.step_c, name="step_c")
              .dispatch({"token": token, "kids": [4]}))
    done = wait_for(run_id, timeout=20, worker=worker)
    assert done.status == "completed" and done.state["log"] == ["c"]


def test_workflow_wait__children_done_in_time_settle_it_and_clear_the_expiry(worker, token):
    run_id = (queuety.workflow("wf_in_time")
              .start_workflows("kids", sleeper(), payload_key="sleep")
              .wait_for_workflows("started_workflow_ids", timeout=30, remind_every=30)
              .then(workflows.step_b)
              .dispatch({"token": token, "kids": [0.1, 0.1]}))
    done = wait_for(run_id, timeout=20, worker=worker)
    assert done.status == "completed"
    assert "wait_timed_out" not in kinds(run_id)
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.wait_expires_at, run.remind_at, run.waiting_since) == (None, None, None)


# -- delay_until ---------------------------------------------------------------------------------

def delayed_row(run_id: int) -> StepRun:
    return StepRun.objects.filter(run_id=run_id, step_name="hold").get()


def test_delay_until__an_aware_datetime_holds_the_run_until_then(worker, token):
    paris = timezone(timedelta(hours=1))
    when = (datetime.now(UTC) + timedelta(seconds=2)).astimezone(paris)
    run_id = (queuety.workflow("until_datetime").then(workflows.step_a)
              .delay_until(when, name="hold").then(workflows.step_b)
              .dispatch({"token": token}))
    done = wait_for(run_id, timeout=20, worker=worker)
    assert done.status == "completed"
    row = delayed_row(run_id)
    assert row.available_at == when
    assert row.finished_at >= when


def test_delay_until__a_callable_computes_the_time_from_the_state(worker, token):
    when = datetime.now(UTC) + timedelta(seconds=2)
    run_id = (queuety.workflow("until_callable").then(workflows.step_a)
              .delay_until(steps.when_from_state, name="hold").then(workflows.step_b)
              .dispatch({"token": token, "at": when.isoformat()}))
    done = wait_for(run_id, timeout=20, worker=worker)
    assert done.status == "completed"
    assert delayed_row(run_id).available_at == when
    assert delayed_row(run_id).finished_at >= when


def test_delay_until__a_far_date_waits_in_the_database_not_the_broker(worker, token):
    when = datetime.now(UTC) + timedelta(days=30)
    run_id = (queuety.workflow("until_far").then(workflows.step_a)
              .delay_until(when, name="hold").then(workflows.step_b)
              .dispatch({"token": token}))
    deadline = time.monotonic() + 20
    while not StepRun.objects.filter(run_id=run_id, step_name="hold").exists():
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)
    row = delayed_row(run_id)
    assert row.available_at == when and row.published_at is None  # the sweeper's, when due
    assert queuety.workflow_status(run_id).status == "running"
    queuety.cancel(run_id)


def test_delay_until__a_callable_returning_a_naive_time_fails_the_step(worker, token):
    run_id = (queuety.workflow("until_naive").then(workflows.step_a, name="step_a")
              .delay_until(steps.naive_when, name="hold").then(workflows.step_b)
              .dispatch({"token": token, "at": "2030-01-01T12:00:00+00:00"}))
    failed = wait_for(run_id, ("failed",), timeout=20, worker=worker)
    assert failed.error["type"] == "queuety.exceptions.InvalidStepOutput"
    assert "naive datetime 2030-01-01T12:00:00" in failed.error["message"]
    assert failed.error["step"] == "step_a"
    assert not StepRun.objects.filter(run_id=run_id, step_name="hold").exists()


def test_delay_until__a_naive_datetime_is_refused_when_the_workflow_is_built():
    with pytest.raises(queuety.WorkflowDefinitionError, match="naive datetime"):
        queuety.workflow("until_refused").delay_until(datetime(2030, 1, 1, 12, 0))


def test_workflow_wait_timeout__children_that_finished_before_it_win_over_the_timeout(
        worker, token, no_sweeps):
    from queuety.runtime import expiry

    child = queuety.workflow("wf_race_child").wait_for_signal("go").dispatch({"token": token})
    run_id = (queuety.workflow("wf_race_parent")
              .wait_for_workflows("ids", result_key="children", timeout=60, on_timeout="fail")
              .then(workflows.step_b)
              .dispatch({"token": token, "ids": [child]}))
    wait_for(run_id, ("waiting_for_workflows",), worker=worker)
    # The child finished before the deadline, but its wake-up of the parent has not run
    # yet (it is sent on the child's commit, or by a sweep) when the deadline passes.
    now = django_timezone.now()
    WorkflowRun.objects.filter(pk=child).update(status="completed", finished_at=now)
    WorkflowRun.objects.filter(pk=run_id).update(wait_expires_at=now - timedelta(seconds=1))

    assert expiry.expire_wait(run_id, now) is False

    done = wait_for(run_id, worker=worker)
    assert done.status == "completed" and done.state["done_b"] is True
    assert "wait_timed_out" not in kinds(run_id)
