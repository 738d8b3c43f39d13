"""The describe vocabulary: how the admin, the CLI and the API name steps, waits and runs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

import queuety
from queuety.core.describe import describe_step, format_status, human_duration, waiting_label
from queuety.core.status import RunStatus, WorkflowStatus
from tests import workflows

CHILD = queuety.workflow("child").then(workflows.step_a).then(workflows.step_b)


@pytest.mark.parametrize("seconds, text", [
    (-3, "0.0 s"),  # clock skew reads as nothing, never as a negative duration
    (0, "0.0 s"),
    (0.44, "0.4 s"),
    (9.94, "9.9 s"),
    (10, "10 s"),
    (59.9, "59 s"),
    (60, "1 min 0 s"),
    (182, "3 min 2 s"),
    (3599, "59 min 59 s"),
    (3600, "1 h 0 min"),
    (3 * 3600 + 61, "3 h 1 min"),
    (48 * 3600 - 1, "47 h 59 min"),
    (48 * 3600, "2 d 0 h"),
    (2 * 86400 + 5 * 3600 + 59, "2 d 5 h"),
])
def test_human_duration(seconds, text):
    assert human_duration(seconds) == text


START = queuety.workflow("w").then(workflows.step_a)


@pytest.mark.parametrize("builder, name, text", [
    (START, "step_a", "tests.workflows.step_a"),
    (START.route(workflows.jump_to_c, {"yes": "step_c", queuety.DEFAULT: "step_b"})
     .then(workflows.step_b).then(workflows.step_c),
     "jump_to_c", "tests.workflows.jump_to_c; routes yes → step_c, otherwise → step_b"),
    (START.route(workflows.jump_to_c, {"yes": "step_c"}).then(workflows.step_c),
     "jump_to_c", "tests.workflows.jump_to_c; routes yes → step_c"),
    (START.delay(minutes=5), "delay_0", "sleep 5 min 0 s"),
    (START.delay(), "delay_0", "sleep 0.0 s"),
    (START.wait_for_signal("paid"), "wait_for_paid", "signals: paid"),
    (START.wait_for_signals(["a", "b"], mode="any"), "wait_for_signals_1",
     "signals: a, b (any)"),
    (START.wait_for_signals(["a", "b"]), "wait_for_signals_1", "signals: a, b"),
    (START.wait_for_approval(), "wait_for_approval", "approval from a person: approval"),
    (START.wait_for_decision(), "wait_for_decision",
     "decision from a person: approval, rejection (any)"),
    (START.wait_for_input(), "wait_for_input", "input from a person: input"),
    (START.run_workflow("sub", CHILD), "sub", "child workflow sub (2 steps)"),
    (START.run_workflow("sub", CHILD, retry=queuety.RetryPolicy(max_attempts=2)), "sub",
     "child workflow sub (2 steps); restarted by "
     + queuety.RetryPolicy(max_attempts=2).describe()),
    (START.start_workflows("orders", CHILD), "start_workflows_1",
     "start a child run per item of state['orders'] → state['started_workflow_ids']"),
    (START.start_workflows("orders", CHILD, result_key="ids", group_key="g"),
     "start_workflows_1", "start a child run per item of state['orders'] → state['ids'], "
                          "group 'g'"),
    (START.wait_for_workflows([3, 4]), "wait_for_workflows_1", "wait for runs 3, 4: all"),
    (START.wait_for_workflows("ids", mode="any"), "wait_for_workflows_1",
     "wait for the runs in state['ids']: any"),
    (START.wait_for_workflow_group("g", mode="quorum", quorum=2), "wait_for_workflow_group_1",
     "wait for group 'g': quorum 2"),
    (START.parallel([workflows.step_b, workflows.step_c]), "parallel_1",
     "in parallel: tests.workflows.step_b, tests.workflows.step_c"),
    (START.parallel([workflows.step_b, workflows.step_c], max_concurrency=2), "parallel_1",
     "in parallel: tests.workflows.step_b, tests.workflows.step_c, at most 2 at once"),
    (START.for_each("items", workflows.step_b), "items_for_each",
     "tests.workflows.step_b for each item of state['items'], join all"),
    (START.for_each("items", workflows.step_b, mode="quorum", quorum=2, max_concurrency=3),
     "items_for_each", "tests.workflows.step_b for each item of state['items'], join "
                       "quorum 2, at most 3 at once"),
    (START.repeat_until("step_a", "done", max_iterations=5), "repeat_until_1",
     "back to step_a until state['done'] == true, at most 5 times"),
    (START.repeat_while("step_a", "mode", expected="again"), "repeat_while_1",
     "back to step_a while state['mode'] == \"again\""),
    (START.repeat_while("step_a", condition=workflows.loop_until_three), "repeat_while_1",
     "back to step_a while tests.workflows.loop_until_three"),
])
def test_describe_step(builder, name, text):
    step = next(s for s in builder.build().steps if s.name == name)
    assert describe_step(step) == text


WAITS = (queuety.workflow("w").then(workflows.step_a).delay(hours=2)
         .wait_for_signals(["a", "b"], mode="any").wait_for_signals(["a", "b"])
         .wait_for_signal("paid").wait_for_approval().wait_for_input()
         .wait_for_workflows([3]).build())
STEP = {s.name: i for i, s in enumerate(WAITS.steps)}


@pytest.mark.parametrize("status, step, label", [
    (RunStatus.RUNNING, "step_a", ""),
    (RunStatus.RUNNING, "delay_0", "a delay of 2 h 0 min"),
    (RunStatus.PAUSED, "delay_0", ""),
    (RunStatus.WAITING_FOR_SIGNAL, "wait_for_signals_2", "signal: a, b (any)"),
    (RunStatus.WAITING_FOR_SIGNAL, "wait_for_signals_3", "signal: a, b"),
    (RunStatus.WAITING_FOR_SIGNAL, "wait_for_paid", "signal: paid"),
    (RunStatus.WAITING_FOR_SIGNAL, "wait_for_approval", "approval (a person)"),
    (RunStatus.WAITING_FOR_SIGNAL, "wait_for_input", "input (a person)"),
    (RunStatus.PAUSED, "wait_for_approval", ""),  # paused at a wait: not waiting on it now
    (RunStatus.WAITING_FOR_SIGNAL, "step_a", ""),  # no wait at that step
    (RunStatus.WAITING_FOR_WORKFLOWS, "wait_for_workflows_7", "child workflows"),
    (RunStatus.FAILED, "wait_for_paid", ""),
    (RunStatus.COMPLETED, None, ""),  # current_step == len(steps) once completed
    (RunStatus.WAITING_FOR_WORKFLOWS, None, "child workflows"),
])
def test_waiting_label(status, step, label):
    current = len(WAITS.steps) if step is None else STEP[step]
    assert waiting_label(status, current, WAITS) == label
    # The run row holds the status as a plain string: the same words.
    assert waiting_label(status.value, current, WAITS) == label


NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
RUNNING = WorkflowStatus(
    id=7, name="order", status="running", current_step=1, total_steps=3,
    current_step_name="charge", state={}, error=None, definition_hash="abc123",
    definition_version=None, idempotency_key=None, budget=None, retry_policy=None,
    created_at=NOW, updated_at=NOW, finished_at=None)
HEAD = ["Workflow: order (#7)", "Status:   running", "Step:     1/3", "StepName: charge"]


@pytest.mark.parametrize("changes, lines", [
    ({}, [*HEAD, "Hash:     abc123"]),
    ({"definition_version": "v2", "idempotency_key": "order-1"},
     [*HEAD, "Version:  v2", "Hash:     abc123", "Key:      order-1"]),
    ({"status": "waiting_for_signal", "wait_type": "signal", "waiting_for": ["a", "b"],
      "wait_mode": "any", "wait_details": {"step_name": "charge", "matched": []}},
     ["Workflow: order (#7)", "Status:   waiting_for_signal", "Step:     1/3",
      "StepName: charge", "Hash:     abc123", "Waiting:  signal => a, b", "WaitMode: any",
      'WaitInfo: {"step_name":"charge","matched":[]}']),
    ({"wait_type": "signal", "waiting_for": []}, [*HEAD, "Hash:     abc123"]),
    ({"budget": {"max_transitions": 20, "transitions": 3}, "retry_policy": "max_attempts=3"},
     [*HEAD, "Hash:     abc123", 'Budget:   {"max_transitions":20,"transitions":3}',
      "Retry:    max_attempts=3"]),
    ({"status": "completed", "current_step": 3, "current_step_name": None,
      "retry_policy": "max_attempts=3"},
     ["Workflow: order (#7)", "Status:   completed", "Step:     3/3", "Hash:     abc123"]),
    ({"status": "cancelled", "retry_policy": "max_attempts=3"},
     ["Workflow: order (#7)", "Status:   cancelled", "Step:     1/3", "StepName: charge",
      "Hash:     abc123"]),
    ({"status": "failed", "retry_policy": "max_attempts=3",
      "error": {"type": "ValueError", "message": "no card", "step": "charge", "attempt": 3,
                "max_attempts": 3}},
     ["Workflow: order (#7)", "Status:   failed", "Step:     1/3", "StepName: charge",
      "Hash:     abc123", "Retry:    max_attempts=3",
      "Error:    ValueError: no card (step 'charge', attempt 3/3)"]),
    ({"status": "failed", "error": {"type": "BudgetExceeded", "message": "too many"}},
     ["Workflow: order (#7)", "Status:   failed", "Step:     1/3", "StepName: charge",
      "Hash:     abc123", "Error:    BudgetExceeded: too many"]),
    ({"artifact_count": 2, "artifact_keys": ["citations", "draft"]},
     [*HEAD, "Hash:     abc123", "Artifacts: 2", "ArtifactKeys: citations, draft"]),
    ({"state": {"city": "Zürich", "n": 1}},
     [*HEAD, "Hash:     abc123", "State:", '{\n    "city": "Zürich",\n    "n": 1\n}']),
])
def test_format_status(changes, lines):
    assert format_status(replace(RUNNING, **changes)) == lines
