"""The step boundary when the run or the step changes while a handler runs (in-process)."""

from __future__ import annotations

import pytest

import queuety
from queuety import publish
from queuety.models import Event, StepRun
from queuety.runtime import attempt
from tests import workflows


def run_inline(token: str, interfere: str, builder=None):
    """Dispatch (by default interfere -> step_c) and execute every published message here."""
    builder = builder or (queuety.workflow("interfered").retry(initial_delay=0, jitter=0)
                          .then(workflows.interfere).then(workflows.step_c))
    with publish.captured() as sent:
        run_id = builder.dispatch({"token": token, "interfere": interfere})
        done = 0
        while done < len(sent):
            attempt.execute_step(sent[done].step_run_id)
            done += 1
    return run_id, sent


def kinds(run_id):
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind", flat=True))


def test_run_changed_meanwhile__transition_is_recomputed_under_the_lock(token):
    run_id, _ = run_inline(token, "bump_revision")

    status = queuety.workflow_status(run_id)
    assert status.status == "completed"
    assert status.state["interfered"] == "bump_revision" and status.state["log"] == ["c"]
    assert kinds(run_id) == ["workflow_started", "step_completed", "step_completed",
                             "workflow_completed"]
    assert StepRun.objects.filter(run_id=run_id).count() == 2


def test_run_cancelled_meanwhile__outcome_is_recorded_but_nothing_advances(token):
    run_id, sent = run_inline(token, "cancel")

    status = queuety.workflow_status(run_id)
    assert status.status == "cancelled" and status.current_step == 0
    assert "interfered" not in status.state
    assert kinds(run_id) == ["workflow_started", "step_discarded"]
    assert len(sent) == 1 and workflows.marks(f"{token}-c") == []


def test_attempt_recovered_meanwhile__late_outcome_is_discarded_and_retry_owns_the_step(token):
    run_id, sent = run_inline(token, "recover")

    status = queuety.workflow_status(run_id)
    assert status.status == "completed" and status.state["interfered"] == "none"
    assert len(workflows.marks(f"{token}-interfere")) == 2  # at least once per attempt
    step = StepRun.objects.get(run_id=run_id, seq=0)
    assert (step.status, step.attempt) == ("completed", 2)
    timeline = kinds(run_id)
    assert timeline == ["workflow_started", "step_retried", "step_discarded", "step_completed",
                        "step_completed", "workflow_completed"]
    retried = Event.objects.get(run_id=run_id, kind="step_retried")
    assert retried.data["error"]["type"] == "queuety.exceptions.WorkerLost"


@pytest.mark.parametrize("payload, problem", [
    ([1, 2], "must be a dict (got list)"),
    ({"_secret": 1}, "reserved or non-string keys ['_secret']"),
    ({"when": object()}, "is not JSON-serialisable"),
])
def test_dispatch__bad_payload_is_refused_and_nothing_is_written(payload, problem):
    before = StepRun.objects.count()
    with pytest.raises(queuety.WorkflowDefinitionError, match=problem.replace("[", r"\[")
                       .replace("(", r"\(").replace(")", r"\)")):
        queuety.workflow("refused").then(workflows.step_a).dispatch(payload)
    assert StepRun.objects.count() == before


def test_workflow_status__unknown_run_raises_run_not_found():
    with pytest.raises(queuety.RunNotFound, match="Workflow run 99999999 does not exist."):
        queuety.workflow_status(99999999)


def test_budget_breach_found_under_the_lock__fails_the_run_and_keeps_the_state(token):
    run_id, _ = run_inline(token, "bump_revision", (
        queuety.workflow("interfered_capped").max_transitions(1)
        .then(workflows.step_a).then(workflows.interfere).then(workflows.step_c)))

    status = queuety.workflow_status(run_id)
    assert status.status == "failed" and status.error["budget"] == "max_transitions"
    assert status.error["step"] == "interfere"
    assert "interfered" not in status.state and status.state["log"] == ["a"]
    assert StepRun.objects.get(run_id=run_id, step_name="interfere").status == "failed"
    assert kinds(run_id)[-2:] == ["step_failed", "workflow_failed"]


def test_run_changed_meanwhile__a_jump_survives_the_locked_path(token):
    run_id, _ = run_inline(token, "bump_revision", (
        queuety.workflow("interfered_jump").then(workflows.interfere_then_jump)
        .then(workflows.step_b).then(workflows.step_c)))

    status = queuety.workflow_status(run_id)
    assert status.status == "completed" and status.state["log"] == ["c"]
    assert workflows.marks(f"{token}-b") == []


def test_run_cancelled_during_an_inline_step__outcome_is_discarded(token):
    builder = (queuety.workflow("interfered_inline").retry(initial_delay=0, jitter=0)
               .then(workflows.step_a).then(workflows.interfere).then(workflows.step_c))
    run_id, sent = run_inline(token, "cancel", builder)

    assert queuety.workflow_status(run_id).status == "cancelled"
    assert kinds(run_id) == ["workflow_started", "step_completed", "step_discarded"]
    # The interfering step ran inline: the dispatch's message was the only one.
    assert len(sent) == 1 and workflows.marks(f"{token}-c") == []
    assert StepRun.objects.get(run_id=run_id, step_name="interfere").published_at is None


def test_inline_attempt_recovered_meanwhile__late_outcome_is_discarded_and_retry_owns_it(token):
    builder = (queuety.workflow("interfered_inline").retry(initial_delay=0, jitter=0)
               .then(workflows.step_a).then(workflows.interfere).then(workflows.step_c))
    run_id, sent = run_inline(token, "recover", builder)

    status = queuety.workflow_status(run_id)
    assert status.status == "completed" and status.state["interfered"] == "none"
    assert status.state["log"] == ["a", "c"]
    assert len(workflows.marks(f"{token}-interfere")) == 2
    assert len(workflows.marks(f"{token}-c")) == 1
    step = StepRun.objects.get(run_id=run_id, step_name="interfere")
    assert (step.status, step.attempt) == ("completed", 2)
    assert kinds(run_id) == ["workflow_started", "step_completed", "step_retried",
                             "step_discarded", "step_completed", "step_completed",
                             "workflow_completed"]
    assert len(sent) == 2  # the dispatch's message and the retry's
