"""Reminders on waits, timeouts on workflow waits and ``delay_until()``: the builder's checks,
the definition's JSON (and hash) and the landing planner's rules. No database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import queuety
from queuety import exceptions
from queuety.core import flow, waits
from queuety.core.budget import Usage
from queuety.core.definition import DelayStep, StepSpec, WorkflowSpec
from queuety.core.landing import DelayRow, Reminder, RunView, plan

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(minutes=5)


def work(state):
    return {}


def tomorrow_noon(state):
    return datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def naive_time(state):
    return datetime(2026, 12, 2, 12, 0)


def not_a_time(state):
    return "tomorrow"


def from_state(state):
    return datetime.fromisoformat(state["at"])


class Facts:
    def __init__(self, runs: dict[int, tuple[str, dict[str, Any]]] | None = None) -> None:
        self.runs = runs or {}

    def stored_signals(self, names):
        return []

    def awaited(self, ids):
        return {i: self.runs[i] for i in ids if i in self.runs}

    def start_runs(self, index, payloads, group):  # pragma: no cover - not used here
        raise AssertionError


def view(**changes: Any) -> RunView:
    base = RunView(run_id=7, status="running", current_step=0, transitions=3,
                   wait_expires_at=None, state={"at": "2026-12-01T13:00:00+01:00"},
                   usage=Usage(4, 4, 0), writes={}, loops={}, groups={}, now=NOW)
    return replace(base, **changes)


def staying(**changes: Any) -> RunView:
    """A run already parked at step 1 (its row's count equals the landing's)."""
    return view(**{"current_step": 1, "usage": Usage(3, 3, 0), **changes})


def with_wait(**options: Any) -> WorkflowSpec:
    return (queuety.workflow("reminding").then(work, name="first")
            .wait_for_signal("go", name="the_wait", **options).then(work, name="after").build())


def with_workflow_wait(**options: Any) -> WorkflowSpec:
    return (queuety.workflow("reminding_runs").then(work, name="first")
            .wait_for_workflows([50], name="the_wait", **options).then(work, name="after")
            .build())


# -- the builder and the definition ---------------------------------------------------------

@pytest.mark.parametrize("options", [
    {"remind_every": 0}, {"remind_after": -1}, {"remind_every": True},
    {"remind_after": float("inf")}, {"remind_every": "soon"}])
def test_reminders__refuse_what_is_no_positive_duration(options):
    with pytest.raises(exceptions.WorkflowDefinitionError, match="must be a positive"):
        with_wait(**options)


@pytest.mark.parametrize("method", ["wait_for_signal", "wait_for_approval", "wait_for_input",
                                    "wait_for_decision", "wait_for_signals"])
def test_reminders__every_signal_wait_takes_them_in_seconds_or_timedelta(method):
    builder = queuety.workflow("r").then(work)
    args = {"wait_for_signal": ("go",), "wait_for_signals": (["a", "b"],)}.get(method, ())
    spec = getattr(builder, method)(*args, remind_after=timedelta(minutes=2),
                                    remind_every=30).build()
    wait = spec.steps[1].wait
    assert (wait.remind_after, wait.remind_every) == (120.0, 30.0)
    assert spec.steps[1].to_dict()["wait"]["remind_every"] == 30.0


@pytest.mark.parametrize("method", ["wait_for_workflows", "wait_for_workflow",
                                    "wait_for_workflow_group", "wait_for_agents",
                                    "wait_for_agent_group"])
def test_workflow_waits__take_timeout_on_timeout_and_reminders(method):
    builder = queuety.workflow("r").then(work, name="first")
    args = {"wait_for_workflows": ([5],), "wait_for_workflow": (5,),
            "wait_for_workflow_group": ("kids",)}.get(method, ())
    spec = getattr(builder, method)(*args, timeout=timedelta(seconds=90), on_timeout="first",
                                    remind_every=10).build()
    workflows = spec.steps[1].workflows
    assert (workflows.timeout, workflows.on_timeout, workflows.timeout_target,
            workflows.remind_every) == (90.0, "first", "first", 10.0)
    again = StepSpec.from_dict(spec.steps[1].to_dict())
    assert again.workflows == workflows


def test_workflow_waits__refuse_an_unknown_timeout_target_and_on_timeout_alone():
    with pytest.raises(exceptions.WorkflowDefinitionError, match="on_timeout='nowhere'"):
        with_workflow_wait(timeout=5, on_timeout="nowhere")
    with pytest.raises(exceptions.WorkflowDefinitionError, match="without a timeout"):
        with_workflow_wait(on_timeout="continue")


def test_definitions_without_the_new_options__keep_their_json():
    spec = with_wait()
    assert set(spec.steps[1].to_dict()["wait"]) == {
        "signals", "mode", "result_key", "match_payload", "correlation_key", "human",
        "decision", "schema"}
    assert set(with_workflow_wait().steps[1].to_dict()["workflows"]) == {
        "ids", "state_key", "group", "mode", "quorum", "result_key"}
    delay = queuety.workflow("d").delay(seconds=5).build().steps[0].to_dict()
    assert "until" not in delay and "until_from" not in delay


def test_delay_until__refuses_a_naive_datetime_at_definition():
    with pytest.raises(exceptions.WorkflowDefinitionError,
                       match=r"naive datetime 2026-12-02T12:00:00.*time zone"):
        queuety.workflow("d").delay_until(datetime(2026, 12, 2, 12, 0))
    with pytest.raises(exceptions.WorkflowDefinitionError, match="aware datetime or a callable"):
        queuety.workflow("d").delay_until(42)


def test_delay_until__stores_the_instant_in_utc_and_a_callable_by_path():
    paris = timezone(timedelta(hours=1))
    spec = (queuety.workflow("d").delay_until(datetime(2026, 12, 2, 13, 0, tzinfo=paris))
            .delay_until(tomorrow_noon).build())
    first, second = spec.steps
    assert isinstance(first, DelayStep) and first.until == "2026-12-02T12:00:00+00:00"
    assert second.until_from == f"{__name__}.tomorrow_noon"
    assert WorkflowSpec.from_dict(spec.to_dict()).definition_hash == spec.definition_hash


# -- delay_until's due time -------------------------------------------------------------------

def delay_spec(when: Any) -> WorkflowSpec:
    return (queuety.workflow("d").then(work, name="first").delay_until(when, name="hold")
            .then(work, name="after").build())


@pytest.mark.parametrize("when, seconds", [
    (NOW + timedelta(hours=2), 7200.0),
    (NOW - timedelta(hours=2), 0.0),               # already past: on at once
    (tomorrow_noon, 86400.0),
    (from_state, 0.0),                             # 13:00+01:00 is NOW itself
])
def test_delay_until__the_delay_row_is_due_at_the_time(when, seconds):
    planned = plan(delay_spec(when), view(), 1, Facts(), NOW)
    assert planned.entry == DelayRow(1, seconds)


@pytest.mark.parametrize("handler, message", [
    (naive_time, r"naive_time\(state\) returned .* naive datetime"),
    (not_a_time, r"not_a_time\(state\) returned .* must be a datetime.*got str"),
])
def test_delay_until__a_callable_returning_no_aware_time_fails_the_landing(handler, message):
    with pytest.raises(exceptions.InvalidStepOutput, match=message):
        plan(delay_spec(handler), view(), 1, Facts(), NOW)


def test_delay_until__far_dates_are_seconds_the_applier_keeps_off_the_broker():
    step = delay_spec(NOW + timedelta(days=400)).steps[1]
    assert flow.delay_seconds(step, {}, NOW, 7) == 400 * 86400.0


# -- the planner's reminder and timeout rules ---------------------------------------------------

@pytest.mark.parametrize("options, first", [
    ({"remind_after": 60}, 60), ({"remind_every": 30}, 30),
    ({"remind_after": 60, "remind_every": 30}, 60)])
def test_parking__starts_the_reminders(options, first):
    planned = plan(with_wait(**options), view(), 1, Facts(), NOW)
    assert planned.status == "waiting_for_signal"
    assert planned.reminder == Reminder(NOW + timedelta(seconds=first), NOW, 0)


def test_parking__without_reminders_sets_none():
    assert plan(with_wait(timeout=60), view(), 1, Facts(), NOW).reminder is None


def test_staying__keeps_the_reminders_sent_and_due():
    kept = Reminder(NOW + timedelta(seconds=5), EARLIER, 2)
    planned = plan(with_wait(remind_every=30), staying(status="waiting_for_signal",
                                                        reminder=kept), 1, Facts(), NOW)
    assert planned.reminder == kept


def test_arriving_again__starts_afresh():
    old = Reminder(None, EARLIER, 3)
    planned = plan(with_wait(remind_every=30), view(current_step=1, reminder=old,
                                                     status="waiting_for_signal"),
                   1, Facts(), NOW)
    assert planned.reminder == Reminder(NOW + timedelta(seconds=30), NOW, 0)


def test_leaving_the_wait__clears_the_reminders():
    spec = with_wait(remind_every=30)
    planned = plan(spec, view(current_step=1, reminder=Reminder(NOW, EARLIER, 1)), 2,
                   Facts(), NOW)
    assert planned.status == "running" and planned.reminder is None


def test_paused_at_the_wait__keeps_them_and_a_task_clears_them():
    kept = Reminder(NOW, EARLIER, 1)
    held = plan(with_wait(remind_every=30), staying(status="paused", reminder=kept), 1,
                Facts(), NOW, mode=queuety.core.landing.Mode.HOLD)
    assert held.status == "paused" and held.reminder == kept
    task = plan(with_wait(remind_every=30), view(status="paused", reminder=kept), 0,
                Facts(), NOW, mode=queuety.core.landing.Mode.HOLD)
    assert task.reminder is None


def test_workflow_wait__parks_with_its_expiry_and_reminders():
    spec = with_workflow_wait(timeout=60, remind_after=10)
    planned = plan(spec, view(), 1, Facts({50: ("running", {})}), NOW)
    assert planned.status == "waiting_for_workflows"
    assert planned.wait_expires_at == NOW + timedelta(seconds=60)
    assert planned.reminder == Reminder(NOW + timedelta(seconds=10), NOW, 0)
    assert planned.notes[-1].data["expires_at"] == (NOW + timedelta(seconds=60)).isoformat()


def test_workflow_wait__staying_keeps_its_expiry():
    spec = with_workflow_wait(timeout=60)
    planned = plan(spec, staying(status="waiting_for_workflows", wait_expires_at=EARLIER), 1,
                   Facts({50: ("running", {})}), NOW)
    assert planned.wait_expires_at == EARLIER


def test_workflow_wait__settled_clears_expiry_and_reminders():
    spec = with_workflow_wait(timeout=60, remind_every=5)
    planned = plan(spec, staying(status="waiting_for_workflows", wait_expires_at=EARLIER,
                                 reminder=Reminder(NOW, EARLIER, 1)), 1,
                   Facts({50: ("completed", {})}), NOW)
    assert planned.status == "running"
    assert planned.wait_expires_at is None and planned.reminder is None


@pytest.mark.parametrize("due, now, every, expected", [
    (NOW, NOW + timedelta(seconds=1), 30, NOW + timedelta(seconds=30)),
    (NOW, NOW + timedelta(seconds=95), 30, NOW + timedelta(seconds=125)),  # late: no burst
    (NOW, NOW, None, None),
])
def test_next_reminder(due, now, every, expected):
    assert waits.next_reminder(due, now, every) == expected


def test_first_reminder():
    assert waits.first_reminder(None, None) is None
    assert waits.first_reminder(5.0, None) == 5.0
    assert waits.first_reminder(None, 7.0) == 7.0
    assert waits.first_reminder(5.0, 7.0) == 5.0


def test_delay_until__its_callable_is_a_handler_reference_checked_at_deploy():
    from queuety.core.handler_refs import Need, handler_refs

    refs = handler_refs(delay_spec(tomorrow_noon))
    assert [(r.path, r.need) for r in refs if "delay_until" in r.where] == [
        (f"{__name__}.tomorrow_noon", Need.CONDITION)]



def raises_for_delay(state):
    return state["missing"]


def test_delay_until__a_callable_that_raises_fails_the_landing_as_invalid_output():
    with pytest.raises(exceptions.InvalidStepOutput, match=r"raised KeyError: 'missing'"):
        plan(delay_spec(raises_for_delay), view(), 1, Facts(), NOW)


def test_delay_until__a_naive_now_is_the_servers_local_time_not_a_type_error():
    # USE_TZ = False: Django's now() is naive local time.
    naive_now = NOW.astimezone().replace(tzinfo=None)
    step = delay_spec(NOW + timedelta(hours=2)).steps[1]
    assert flow.delay_seconds(step, {}, naive_now, 7) == pytest.approx(7200.0)
