"""Operating runs with a real worker: cancel, pause, resume, retry, rewind, fork,
compensation, deadlines, timeline, export/replay, retention and the CLI."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

import queuety
from queuety import publish, signals
from queuety.models import DispatchKey, Event, StepRun, WorkflowRun
from queuety.runtime import sweeper
from tests import workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "export_v2.json"
#: The format before artifacts and chunks: still replayed.
GOLDEN_V1 = Path(__file__).resolve().parents[1] / "golden" / "export_v1.json"


def kinds(run_id):
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind", flat=True))


def wait_until(predicate, timeout=20, message="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.05)


def cli(*args):
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


def compensated(token, **extra):
    return (queuety.workflow("compensated").then(workflows.step_a).compensate_with(workflows.undo)
            .then(workflows.step_b).compensate_with("tests.workflows.undo")
            .wait_for_approval().then(workflows.step_c).on_cancel(workflows.hook))


# -- cancel and compensation ------------------------------------------------------------------

def test_cancel__compensations_in_reverse_then_the_hook_each_once(worker, token):
    run_id = compensated(token).dispatch({"token": token})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)

    queuety.cancel(run_id)

    wait_until(lambda: "cleanup_finished" in kinds(run_id), message="the cleanup")
    assert queuety.workflow_status(run_id).status == "cancelled"
    undone = [line.split(" ", 1)[1] for line in workflows.marks(f"{token}-undo")]
    assert undone == ['["a", "b"]', '["a"]']  # newest first, each with its own snapshot
    assert workflows.marks(f"{token}-hook")[0].split()[1] == "done_a,done_b,log,token"
    assert kinds(run_id)[-5:] == ["workflow_cancelled", "compensation_completed",
                                  "compensation_completed", "hook_completed",
                                  "cleanup_finished"]
    with pytest.raises(queuety.InvalidTransition, match="it is already cancelled"):
        queuety.cancel(run_id)
    with pytest.raises(queuety.RunNotWaiting):
        queuety.approve(run_id)


def test_cancel__refused_for_completed_and_allowed_for_paused_and_failed(worker, token):
    done = queuety.workflow("c1").then(workflows.step_a).dispatch({"token": token})
    wait_for(done, worker=worker)
    with pytest.raises(queuety.InvalidTransition,
                       match=f"Cannot cancel workflow run {done}: it is already completed."):
        queuety.cancel(done)
    failed = queuety.workflow("c2").then(workflows.boom).dispatch({"token": token})
    wait_for(failed, worker=worker)
    queuety.cancel(failed)
    parked = queuety.workflow("c3").wait_for_approval().dispatch({"token": token})
    queuety.pause(parked)
    queuety.cancel(parked)
    assert {queuety.workflow_status(r).status for r in (failed, parked)} == {"cancelled"}


def test_cancel__a_step_in_flight_is_discarded_and_nothing_follows(worker, token):
    run_id = (queuety.workflow("cancel_mid").then(workflows.slow).then(workflows.step_a)
              .dispatch({"token": token, "sleep": 1.0}))
    wait_until(lambda: workflows.marks(f"{token}-slow"), message="the slow step")
    queuety.cancel(run_id)
    wait_until(lambda: "step_discarded" in kinds(run_id), message="the late outcome")
    time.sleep(0.5)
    assert queuety.workflow_status(run_id).status == "cancelled"
    assert "slept" not in queuety.workflow_status(run_id).state
    assert workflows.marks(f"{token}-a") == []
    assert StepRun.objects.filter(run_id=run_id).count() == 1


def test_compensate_on_failure__runs_them_and_then_retry_is_refused(worker, token):
    run_id = (queuety.workflow("comp_fail").compensate_on_failure()
              .then(workflows.step_a).compensate_with(workflows.undo)
              .then(workflows.boom).dispatch({"token": token}))
    wait_until(lambda: "cleanup_finished" in kinds(run_id), message="the cleanup")
    assert queuety.workflow_status(run_id).status == "failed"
    assert len(workflows.marks(f"{token}-undo")) == 1
    with pytest.raises(queuety.InvalidTransition, match="its compensations already ran"):
        queuety.retry(run_id)


def test_compensations__retried_by_their_own_policy_and_a_broken_one_is_skipped(worker, token):
    run_id = (queuety.workflow("comp_retry").then(workflows.step_a).compensate_with(
        workflows.FlakyUndo).then(workflows.step_b).compensate_with(workflows.broken_undo)
        .wait_for_approval().dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.cancel(run_id)
    wait_until(lambda: "cleanup_finished" in kinds(run_id), message="the cleanup")
    timeline = kinds(run_id)
    assert timeline.count("compensation_failed") == 1       # broken_undo: 1 attempt, skipped
    assert timeline.count("compensation_retried") == 1      # FlakyUndo: failed once
    assert timeline.count("compensation_completed") == 1
    assert len(workflows.marks(f"{token}-broken")) == 1
    assert len(workflows.marks(f"{token}-flakyundo")) == 2


# -- pause and resume -------------------------------------------------------------------------

def test_pause__the_step_in_flight_finishes_nothing_new_starts_resume_runs_it_once(worker,
                                                                                  token):
    run_id = (queuety.workflow("paused").then(workflows.slow).then(workflows.step_a)
              .dispatch({"token": token, "sleep": 0.8}))
    wait_until(lambda: workflows.marks(f"{token}-slow"), message="the slow step")
    queuety.pause(run_id)
    wait_until(lambda: "step_completed" in kinds(run_id), message="the step in flight")
    time.sleep(1.5)  # well past the sweeper's period: nothing may start while paused
    status = queuety.workflow_status(run_id)
    assert status.status == "paused" and status.current_step_name == "step_a"
    assert workflows.marks(f"{token}-a") == []

    assert queuety.resume(run_id) == "running"
    assert wait_for(run_id, worker=worker).status == "completed"
    assert len(workflows.marks(f"{token}-a")) == 1
    assert StepRun.objects.filter(run_id=run_id, step_name="step_a").count() == 1
    with pytest.raises(queuety.InvalidTransition, match="it is completed, not paused"):
        queuety.resume(run_id)
    with pytest.raises(queuety.InvalidTransition, match="not running or waiting"):
        queuety.pause(run_id)


def test_pause__a_signal_does_not_unpause_a_waiting_run(worker, token):
    run_id = (queuety.workflow("paused_wait").wait_for_signal("go").then(workflows.step_a)
              .dispatch({"token": token}))
    queuety.pause(run_id)
    receipt = queuety.signal(run_id, "go", {"x": 1})
    assert not receipt.settled and queuety.workflow_status(run_id).status == "paused"
    time.sleep(1.2)
    assert workflows.marks(f"{token}-a") == []
    queuety.resume(run_id)
    final = wait_for(run_id, worker=worker)
    assert final.status == "completed" and final.state["x"] == 1


# -- retry, rewind, fork ----------------------------------------------------------------------

def test_retry__from_the_failed_step_keeping_outputs_on_the_same_row(worker, token):
    run_id = (queuety.workflow("retried").then(workflows.step_a).then(workflows.flaky)
              .then(workflows.step_c)
              .dispatch({"token": token, "fail_times": 1, "raise": "builtins.ValueError"}))
    assert wait_for(run_id, worker=worker).status == "failed"
    with pytest.raises(queuety.InvalidTransition, match="it is failed, not paused"):
        queuety.resume(run_id)

    queuety.retry(run_id)

    final = wait_for(run_id, worker=worker)
    assert final.status == "completed" and final.error is None
    assert final.state["log"] == ["a", "c"] and final.state["succeeded_on"] == 2
    assert len(workflows.marks(f"{token}-a")) == 1
    rows = StepRun.objects.filter(run_id=run_id, step_name="flaky")
    assert rows.count() == 1 and rows.get().attempt == 2  # numbers go on: no reuse
    assert rows.get().max_attempts == 1 + 3
    assert "workflow_retried" in kinds(run_id)
    with pytest.raises(queuety.InvalidTransition, match="it is completed, not failed"):
        queuety.retry(run_id)


def test_rewind__back_to_a_recorded_state_then_forward_again(worker, token):
    run_id = (queuety.workflow("rewound").then(workflows.step_a).then(workflows.step_b)
              .then(workflows.step_c).dispatch({"token": token}))
    wait_for(run_id, worker=worker)
    assert queuety.workflow_state_at(run_id, "step_a") == {"token": token, "log": ["a"],
                                                            "done_a": True}
    assert queuety.workflow_state_at(run_id, 1)["log"] == ["a", "b"]

    queuety.rewind(run_id, "step_a")

    final = wait_for(run_id, worker=worker)
    assert final.status == "completed" and final.state["log"] == ["a", "b", "c"]
    assert len(workflows.marks(f"{token}-b")) == 2 and len(workflows.marks(f"{token}-a")) == 1
    with pytest.raises(queuety.UnknownStep):
        queuety.rewind(run_id, "nope")
    fresh = queuety.workflow("never").wait_for_signal("x").then(workflows.step_a) \
        .dispatch({"token": token})
    with pytest.raises(LookupError, match=f"No recorded state found for workflow run {fresh}"):
        queuety.rewind(fresh, "step_a")


def test_fork__a_waiting_run_gives_an_independent_waiting_run(worker, token):
    source = (queuety.workflow("forked").then(workflows.step_a).wait_for_approval()
              .then(workflows.step_c).dispatch({"token": token}))
    wait_for(source, ("waiting_for_signal",), worker=worker)

    copy = queuety.fork(source)

    assert copy != source
    assert queuety.workflow_status(copy).status == "waiting_for_signal"
    assert queuety.workflow_status(copy).state == queuety.workflow_status(source).state
    queuety.approve(copy, {"by": "fork"})
    assert wait_for(copy, worker=worker).status == "completed"
    assert queuety.workflow_status(source).status == "waiting_for_signal"


@contextmanager
def completions():
    """Collect the ``run_completed`` signals sent in this process, and the runs woken, in the
    block."""
    seen = SimpleNamespace(completed=[], woken=[])
    completed = signals.EVENTS["run_completed"].signal
    completed.connect(lambda sender, signal, run_id, **_: seen.completed.append(run_id),
                      weak=False, dispatch_uid="test-operations-completions")
    try:
        with publish.wake_ups_redirected(seen.woken.extend):
            yield seen
    finally:
        completed.disconnect(dispatch_uid="test-operations-completions")


def test_rewind__to_the_last_step_completes_the_run_waking_its_waiters(worker, token):
    run_id = (queuety.workflow("rewound_to_end").then(workflows.step_a).wait_for_signal("go")
              .then(workflows.step_b).dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.signal(run_id, "go", {})
    assert wait_for(run_id, worker=worker).status == "completed"
    queuety.rewind(run_id, "step_a")  # back at the wait, whose signal was consumed
    assert queuety.workflow_status(run_id).status == "waiting_for_signal"
    waiter = queuety.workflow("waits_for_rewound").wait_for_workflow(run_id).dispatch(
        {"token": token})
    assert queuety.workflow_status(waiter).status == "waiting_for_workflows"

    with completions() as seen:
        queuety.rewind(run_id, "step_b")  # just after the last step: nothing left to run

    # Completed as a step's outcome completes a run, not by a bare status write.
    assert queuety.workflow_status(run_id).status == "completed"
    assert kinds(run_id)[-2:] == ["workflow_rewound", "workflow_completed"]
    assert seen.completed == [run_id] and seen.woken == [waiter]
    assert wait_for(waiter, worker=worker).status == "completed"


def test_fork__a_completed_run_gives_a_completed_copy_with_its_completion(worker, token):
    source = (queuety.workflow("forked_done").then(workflows.step_a)
              .dispatch({"token": token}))
    assert wait_for(source, worker=worker).status == "completed"

    with completions() as seen:
        copy = queuety.fork(source)

    assert queuety.workflow_status(copy).status == "completed"
    assert queuety.workflow_status(copy).state == queuety.workflow_status(source).state
    assert kinds(copy) == ["workflow_forked", "workflow_completed"]
    assert seen.completed == [copy]


# -- deadlines --------------------------------------------------------------------------------

def test_deadline__the_sweeper_fails_waiting_and_paused_runs_and_calls_the_hook(worker, token):
    waiting = (queuety.workflow("due").must_complete_within(seconds=1)
               .on_deadline(workflows.hook).wait_for_approval().dispatch({"token": token}))
    paused = (queuety.workflow("due_paused").must_complete_within(seconds=1)
              .wait_for_approval().dispatch({"token": token}))
    queuety.pause(paused)

    for run_id in (waiting, paused):
        status = wait_for(run_id, ("failed",), timeout=15, worker=worker)
        assert status.error["type"] == "queuety.exceptions.DeadlineExceeded"
        assert "missed its deadline" in status.error["message"]
    wait_until(lambda: workflows.marks(f"{token}-hook"), message="the deadline hook")
    quick = (queuety.workflow("in_time").must_complete_within(minutes=5)
             .then(workflows.step_a).dispatch({"token": token}))
    assert wait_for(quick, worker=worker).status == "completed"


def test_deadline__retry_after_a_deadline_gets_a_fresh_window(worker, token):
    run_id = (queuety.workflow("late_retry").must_complete_within(seconds=2)
              .then(workflows.slow).then(workflows.step_a)
              .dispatch({"token": token, "sleep": 4}))
    status = wait_for(run_id, ("failed",), timeout=15, worker=worker)
    assert status.error["type"] == "queuety.exceptions.DeadlineExceeded"
    # The deadline struck mid-step; make the step quick, then retry: same row, no duplicate.
    WorkflowRun.objects.filter(pk=run_id).update(state={"token": token, "sleep": 0})
    queuety.retry(run_id)
    final = wait_for(run_id, timeout=15, worker=worker)
    assert final.status == "completed", final.error
    rows = StepRun.objects.filter(run_id=run_id, step_name="slow")
    assert rows.count() == 1 and rows.get().status == "completed"


def test_rewind__refused_after_compensations_and_a_paused_run_stays_paused(worker, token):
    comp = (queuety.workflow("rewind_comp").then(workflows.step_a)
            .compensate_with(workflows.undo).wait_for_approval().dispatch({"token": token}))
    wait_for(comp, ("waiting_for_signal",), worker=worker)
    queuety.cancel(comp)
    with pytest.raises(queuety.InvalidTransition, match="it is cancelled"):
        queuety.rewind(comp, "step_a")
    paused = (queuety.workflow("rewind_paused").then(workflows.step_a).wait_for_approval()
              .then(workflows.step_b).dispatch({"token": token}))
    wait_for(paused, ("waiting_for_signal",), worker=worker)
    queuety.pause(paused)
    queuety.rewind(paused, "step_a")
    assert queuety.workflow_status(paused).status == "paused"
    queuety.resume(paused)
    assert queuety.workflow_status(paused).status == "waiting_for_signal"


def test_sweeper__a_step_whose_definition_cannot_load_fails_alone(worker, token):
    from queuety.models import WorkflowDefinition

    broken = queuety.workflow("unloadable").then(workflows.slow).dispatch(
        {"token": token, "sleep": 0})
    wait_for(broken, worker=worker)
    definition = WorkflowRun.objects.get(pk=broken).definition
    bad = dict(definition.definition, retry={"max_attempts": 1, "initial_delay": 1.0,
                                             "backoff_factor": 2.0, "max_delay": 60.0,
                                             "jitter": 0.0, "retry_on": ["gone.Module"]})
    ghost = WorkflowDefinition.objects.create(name="unloadable", definition=bad,
                                              definition_hash="0" * 64)
    run = WorkflowRun.objects.create(definition=ghost, name="unloadable", total_steps=1,
                                     state={"token": token})
    stale = timezone.now() - timedelta(hours=1)
    StepRun.objects.create(run=run, seq=0, step_index=0, step_name="slow", status="processing",
                           attempt=1, available_at=stale, claimed_at=stale, heartbeat_at=stale)
    healthy = queuety.workflow("healthy").then(workflows.step_a).dispatch({"token": token})

    report = sweeper.sweep()

    assert report["recovered"] >= 1 and report["republished"] >= 0
    assert WorkflowRun.objects.get(pk=run.pk).status == "failed"
    assert "gone.Module" in WorkflowRun.objects.get(pk=run.pk).error["message"]
    assert wait_for(healthy, worker=worker).status == "completed"
    # Its status still reads (the admin, the API and the CLI show it), from the rows alone.
    status = queuety.workflow_status(run.pk)
    assert (status.status, status.current_step_name, status.definition_hash) == \
        ("failed", "slow", "0" * 64)
    # The API answers for it too: its status, and a clear 409 for a reply (nothing written).
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser(f"ops-{token}", f"{token}@x.test", "pw"))
    assert client.get(f"/queuety/api/runs/{run.pk}/").status_code == 200
    answer = client.post(f"/queuety/api/runs/{run.pk}/approve/", {},
                         content_type="application/json")
    assert answer.status_code == 409 and answer.json()["code"] == "definition_unloadable"


def test_deadline__a_zero_duration_is_refused():
    with pytest.raises(queuety.WorkflowDefinitionError, match="positive duration"):
        queuety.workflow("w").must_complete_within()


# -- timeline, export, replay -----------------------------------------------------------------

def test_timeline__every_transition_with_attempts_and_errors(worker, token):
    run_id = (queuety.workflow("timed").then(workflows.step_a).then(workflows.boom)
              .dispatch({"token": token, "order": 5}))
    wait_for(run_id, worker=worker)
    events = queuety.workflow_timeline(run_id)
    assert [e["kind"] for e in events] == ["workflow_started", "step_completed", "step_failed",
                                           "workflow_failed"]
    assert events[1]["data"]["output"] == {"log": ["a"], "done_a": True}
    assert events[1]["duration_ms"] > 0 and events[1]["attempt"] == 1
    assert events[2]["data"]["error"]["message"] == "boom for order 5"
    assert [e["kind"] for e in queuety.workflow_timeline(run_id, limit=2, offset=1)] == [
        "step_completed", "step_failed"]


def normalise(document):
    """Replace what differs between runs (ids, times, token) so the shape can be compared."""
    def walk(value, key=""):
        if key == "signal_ids":
            return ["<id>" for _ in value]
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key in ("id", "signal_id", "source_run_id") and isinstance(value, int):
            return "<id>"
        if key.endswith("_at") and isinstance(value, str):
            return "<time>"
        if key in ("duration_ms", "traceback") and value is not None:
            return f"<{key}>"
        if key in ("token", "idempotency_key") and isinstance(value, str):
            return "<token>"
        return value
    return walk(document)


def test_export__the_golden_document_pins_the_format(worker, token):
    run_id = (queuety.workflow("exported").version("export.v1").idempotency_key(
        f"export:{token}").max_transitions(5).then(workflows.step_a).wait_for_approval()
        .then("tests.workflows.step_b").dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.approve(run_id, {"by": "editor"})
    wait_for(run_id, worker=worker)

    document = json.loads(json.dumps(queuety.export_workflow(run_id)))
    import os
    if os.environ.get("QUEUETY_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(normalise(document), indent=2, sort_keys=True) + "\n")

    assert normalise(document) == json.loads(GOLDEN.read_text())
    assert document["run"]["definition_hash"] == queuety.workflow_status(run_id).definition_hash

    # Format 2 is format 1 (pinned before it) plus the artifacts and the chunks; a format 1
    # document still replays (tests/integration/test_artifacts.py).
    old = json.loads(GOLDEN_V1.read_text())
    assert old == {**{k: v for k, v in normalise(document).items()
                      if k not in ("artifacts", "chunks")}, "format_version": 1}


def test_replay__a_completed_export_is_a_completed_run_with_its_timeline(worker, token):
    run_id = queuety.workflow("replayed").then(workflows.step_a).then(workflows.step_b) \
        .dispatch({"token": token})
    wait_for(run_id, worker=worker)
    new = queuety.replay_workflow(queuety.export_workflow(run_id))
    assert new > run_id and queuety.workflow_status(new).status == "completed"
    assert kinds(new).count("step_completed") == 2 and kinds(new)[-1] == "workflow_replayed"
    assert len(workflows.marks(f"{token}-a")) == 1


def test_replay__a_waiting_export_waits_again_and_a_running_one_continues(worker, token):
    waiting = queuety.workflow("replay_wait").then(workflows.step_a).wait_for_approval() \
        .then(workflows.step_c).dispatch({"token": token})
    wait_for(waiting, ("waiting_for_signal",), worker=worker)
    again = queuety.replay_workflow(queuety.export_workflow(waiting))
    status = queuety.workflow_status(again)
    assert status.status == "waiting_for_signal" and status.waiting_for == ["approval"]
    assert not StepRun.objects.filter(run_id=again)
    queuety.approve(again)
    assert wait_for(again, worker=worker).status == "completed"

    paused = queuety.workflow("replay_run").then(workflows.slow).then(workflows.step_b) \
        .dispatch({"token": token, "sleep": 0.5})
    wait_until(lambda: workflows.marks(f"{token}-slow"), message="the slow step")
    queuety.pause(paused)
    wait_until(lambda: "step_completed" in kinds(paused), message="the step in flight")
    document = queuety.export_workflow(paused)
    document["run"]["status"] = "running"  # as if exported while running
    resumed = queuety.replay_workflow(document)
    assert wait_for(resumed, worker=worker).status == "completed"
    assert StepRun.objects.filter(run_id=resumed, step_name="step_b").count() == 1


@pytest.mark.parametrize("damage, problem", [
    (lambda d: d.pop("run"), "'run' is a required property"),
    (lambda d: d.update(format_version=99), "at format_version"),
    (lambda d: d["run"].update(status="sleeping"), "at run/status"),
    (lambda d: d["definition"].update(version="other"), "the document was altered"),
    (lambda d: d["definition"]["steps"][0].update(handler="os.system"), "the document was "
                                                                         "altered"),
    (lambda d: d["run"].update(current_step=9), "past the definition's 1 steps"),
])
def test_replay__malformed_documents_are_refused_and_nothing_is_written(worker, token, damage,
                                                                        problem):
    run_id = queuety.workflow("damaged").then(workflows.step_a).dispatch({"token": token})
    wait_for(run_id, worker=worker)
    document = queuety.export_workflow(run_id)
    damage(document)
    before = WorkflowRun.objects.count()
    with pytest.raises(queuety.WorkflowDefinitionError, match="Invalid export document: .*"
                       + problem.replace("(", r"\(").replace("'", "'")):
        queuety.replay_workflow(document)
    assert WorkflowRun.objects.count() == before


def test_replay__a_consistent_document_naming_an_unknown_handler_is_refused(worker, token):
    from queuety.core.definition import WorkflowSpec

    run_id = queuety.workflow("foreign").then(workflows.step_a).dispatch({"token": token})
    wait_for(run_id, worker=worker)
    document = queuety.export_workflow(run_id)
    document["definition"]["steps"][0]["handler"] = "no_such_package.evil.Step"
    document["run"]["definition_hash"] = WorkflowSpec.from_dict(
        document["definition"]).definition_hash
    with pytest.raises(queuety.WorkflowDefinitionError, match="has never stored definition .* "
                       "outside QUEUETY\\['REPLAY_MODULES'\\]: no_such_package.evil.Step"):
        queuety.replay_workflow(document)


def test_replay__never_imports_code_of_an_unknown_definition(worker, token):
    from queuety.core.definition import canonical_json

    run_id = queuety.workflow("hostile").then(workflows.step_a).dispatch({"token": token})
    wait_for(run_id, worker=worker)
    document = queuety.export_workflow(run_id)
    document["definition"]["steps"][0]["handler"] = "subprocess.getoutput"
    document["definition"]["retry"] = {"max_attempts": 1, "initial_delay": 1.0,
                                       "backoff_factor": 2.0, "max_delay": 60.0,
                                       "jitter": 0.0, "retry_on": ["antigravity.fly"]}
    import hashlib

    document["run"]["definition_hash"] = hashlib.sha256(
        canonical_json(document["definition"]).encode()).hexdigest()
    with pytest.raises(queuety.WorkflowDefinitionError, match="has never stored"):
        queuety.replay_workflow(document)
    import sys

    assert "antigravity" not in sys.modules

    # A site may trust whole modules explicitly.
    allowed = queuety.export_workflow(run_id)
    allowed["definition"]["steps"][0]["handler"] = "tests.workflows.step_b"
    allowed["run"]["definition_hash"] = hashlib.sha256(
        canonical_json(allowed["definition"]).encode()).hexdigest()
    with override_settings(QUEUETY={**TEST_QUEUETY, "REPLAY_MODULES": ["tests"]}):
        assert queuety.workflow_status(queuety.replay_workflow(allowed)).status == "completed"


# -- retention and overview -------------------------------------------------------------------

def test_retention__purges_old_finished_runs_but_keeps_dispatch_keys(worker, token):
    key = f"retained:{token}"
    old = queuety.workflow("old").idempotency_key(key).then(workflows.step_a) \
        .dispatch({"token": token})
    wait_for(old, worker=worker)
    recent = queuety.workflow("recent").then(workflows.step_a).dispatch({"token": token})
    wait_for(recent, worker=worker)
    WorkflowRun.objects.filter(pk=old).update(finished_at=timezone.now() - timedelta(days=10))

    with override_settings(QUEUETY={**TEST_QUEUETY, "RETENTION_DAYS": 7}):
        while sweeper.purge_finished():
            pass

    assert not WorkflowRun.objects.filter(pk=old).exists()
    assert not Event.objects.filter(run_id=old).exists()
    assert WorkflowRun.objects.filter(pk=recent).exists()
    assert DispatchKey.objects.get(key=key).run_id == old
    assert sweeper.purge_finished() == 0  # RETENTION_DAYS unset: nothing is purged


def test_overview__counts_per_status(worker, token):
    queuety.workflow("counted").wait_for_signal("x").dispatch({"token": token})
    data = json.loads(cli("status", "--format", "json"))
    assert data["runs"]["waiting_for_signal"] >= 1 and set(data["runs"]) >= {
        "running", "completed", "failed", "paused", "cancelled"}
    text = cli("status")
    assert "waiting_for_signal:" in text and "Oldest pending step:" in text


# -- CLI parity -------------------------------------------------------------------------------

def test_cli__lifecycle_subcommands(worker, token, tmp_path):
    run_id = (queuety.workflow("cli_ops").then(workflows.step_a).wait_for_approval()
              .then(workflows.step_b).dispatch({"token": token}))
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    assert cli("workflow", "pause", str(run_id)) == f"Success: Workflow #{run_id} paused.\n"
    assert cli("workflow", "resume", str(run_id)) == f"Success: Workflow #{run_id} resumed.\n"
    with pytest.raises(CommandError, match=f"Cannot resume workflow run {run_id}: it is "
                                           "waiting_for_signal, not paused."):
        cli("workflow", "resume", str(run_id))
    fork_line = cli("workflow", "fork", str(run_id))
    assert fork_line.startswith(f"Success: Workflow #{run_id} forked. New workflow ID: ")
    assert "State at step 0 for workflow" in cli("workflow", "state-at", str(run_id), "0")
    assert json.loads(cli("workflow", "state-at", str(run_id), "step_a", "--format",
                          "json"))["log"] == ["a"]
    with pytest.raises(CommandError, match=f"No recorded state found for workflow #{run_id} "
                                           "at step 2."):
        cli("workflow", "state-at", str(run_id), "2")
    table = cli("workflow", "timeline", str(run_id)).splitlines()
    assert table[0].split() == ["ID", "Step", "Event", "Attempt", "Duration_ms", "Error",
                                "Created_at"]
    assert json.loads(cli("workflow", "timeline", str(run_id), "--format", "json"))[0][
        "kind"] == "workflow_started"

    out = tmp_path / "export.json"
    assert cli("workflow", "export", str(run_id), "--output", str(out)) == \
        f"Success: Workflow #{run_id} exported to {out}.\n"
    assert json.loads(cli("workflow", "export", str(run_id)))["run"]["id"] == run_id
    replayed = cli("workflow", "replay", str(out))
    assert replayed.startswith("Success: Workflow replayed. New workflow ID: ")
    with pytest.raises(CommandError, match="File not found: /nope.json"):
        cli("workflow", "replay", "/nope.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CommandError, match="Invalid JSON: "):
        cli("workflow", "replay", str(tmp_path / "bad.json"))

    assert cli("workflow", "cancel", str(run_id)) == f"Success: Workflow #{run_id} cancelled.\n"
    with pytest.raises(CommandError, match="it is already cancelled"):
        cli("workflow", "cancel", str(run_id))
    with pytest.raises(CommandError, match="Workflow #98765431 not found."):
        cli("workflow", "pause", "98765431")

    failing = queuety.workflow("cli_retry").then(workflows.flaky).dispatch(
        {"token": token, "fail_times": 1, "raise": "builtins.ValueError"})
    wait_for(failing, worker=worker)
    assert cli("workflow", "retry", str(failing)) == \
        f"Success: Workflow #{failing} scheduled for retry.\n"
    assert wait_for(failing, worker=worker).status == "completed"
    rewound = cli("workflow", "rewind", str(failing), "flaky")
    assert rewound == f"Success: Workflow #{failing} rewound to step flaky.\n"
    empty = queuety.workflow("cli_empty").wait_for_signal("x").dispatch({"token": token})
    Event.objects.filter(run_id=empty).delete()
    assert cli("workflow", "timeline", str(empty)) == f"No events found for workflow #{empty}.\n"
