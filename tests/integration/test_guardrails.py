"""Guardrails with a real worker: versions, hashes, idempotent dispatch and budgets.

The scenarios of reference §8.1 that need no fan-out construct, plus the 32-process race.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import call_command

import queuety
from queuety.models import DispatchKey, Event, StepRun, WorkflowRun
from tests import workflows
from tests.integration.conftest import ROOT, wait_for

pytestmark = pytest.mark.worker


def test_idempotency__second_dispatch_returns_the_first_run_and_reports_the_conflict(
        worker, token):
    key = f"agent-run:{token}"
    builder = (queuety.workflow("guarded").version("research.v2").idempotency_key(key)
               .then(workflows.step_a).then(workflows.step_b))

    first = builder.dispatch({"token": token, "user_id": 42})
    again = builder.dispatch({"token": token, "user_id": 42})
    other = builder.dispatch({"token": token, "user_id": 999})

    assert first == again == other
    status = wait_for(first, worker=worker)
    assert status.definition_version == "research.v2"
    assert len(status.definition_hash) == 64 and status.idempotency_key == key
    assert status.state["user_id"] == 42
    assert WorkflowRun.objects.filter(idempotency_key=key).count() == 1
    assert StepRun.objects.filter(run_id=first, step_name="step_a").count() == 1
    assert DispatchKey.objects.filter(key=key).count() == 1
    conflicts = Event.objects.filter(run_id=first, kind="idempotency_conflict")
    assert conflicts.count() == 1 and conflicts.get().data["differences"] == ["payload"]
    assert len(workflows.marks(f"{token}-a")) == 1

    strict = builder.idempotency_key(key, on_conflict="error")
    assert strict.dispatch({"token": token, "user_id": 42}) == first  # same payload: fine
    with pytest.raises(queuety.IdempotencyConflict,
                       match=f"Idempotency key '{key}' already started run {first} with a "
                             "different payload; nothing new was dispatched"):
        strict.dispatch({"token": token, "user_id": 7})
    changed = (queuety.workflow("guarded").version("research.v3")
               .idempotency_key(key, on_conflict="error").then(workflows.step_a))
    with pytest.raises(queuety.IdempotencyConflict, match="different payload and definition"):
        changed.dispatch({"token": token, "user_id": 7})
    assert WorkflowRun.objects.filter(idempotency_key=key).count() == 1


def test_idempotency__32_processes_racing_on_one_key_start_one_run(worker, token, semantics):
    from project.celery import app

    key, queue = f"race:{token}", f"race-{token}"
    contenders = [subprocess.Popen(
        [sys.executable, "-m", "tests.race_dispatch", key, queue],
        cwd=ROOT, env=worker.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
        for _ in range(32)]
    ids, published = [], 0
    try:
        for process in contenders:  # every contender is connected and waiting at the line
            assert process.stdout.readline().strip() == "ready", process.stderr.read()
        for process in contenders:
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in contenders:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
            run_id, sent = map(int, out.split())
            ids.append(run_id)
            published += sent
    finally:  # a contender left waiting at the line would wait on after a failure
        for process in contenders:
            if process.poll() is None:
                process.kill()
                process.communicate()

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        messages = channel.queue_declare(queue, passive=True).message_count
        channel.queue_purge(queue)
    runs = WorkflowRun.objects.filter(idempotency_key=key)
    semantics.record("Idempotency: 32 processes dispatch one key at once",
                     "1 run, 1 first step, 1 Celery message, 1 id for every caller",
                     f"{runs.count()} run, {StepRun.objects.filter(run__in=runs).count()} step "
                     f"row, {published} message published by the contenders, "
                     f"{len(set(ids))} distinct id")
    assert len(set(ids)) == 1 and runs.count() == 1 and runs.get().pk == ids[0]
    assert StepRun.objects.filter(run_id=ids[0]).count() == 1
    assert DispatchKey.objects.filter(key=key).count() == 1
    # Exactly one contender published, one message; the queue holds it (plus any copy the
    # session worker's sweeper re-published because nobody consumes this queue).
    assert published == 1 and messages >= 1


def test_idempotency__a_key_whose_run_was_deleted_answers_run_purged(worker, token):
    key = f"purged:{token}"
    builder = queuety.workflow("purgeable").idempotency_key(key).then(workflows.step_a)
    run_id = builder.dispatch({"token": token})
    wait_for(run_id, worker=worker)

    WorkflowRun.objects.filter(pk=run_id).delete()  # a purge from before tombstones

    # The key is kept and never hands out a dangling id: reusing it, with the same payload
    # or another, is a RunPurged naming the key and the run (docs/reference/errors.md).
    for payload in ({"token": token}, {"token": "different"}):
        with pytest.raises(queuety.RunPurged, match=f"{key}.*run {run_id}"):
            builder.dispatch(payload)
    assert not WorkflowRun.objects.filter(pk=run_id).exists()
    with pytest.raises(queuety.RunNotFound):
        queuety.workflow_status(run_id)


def test_max_transitions__n_transitions_pass_and_the_next_fails(worker, token):
    run_id = (queuety.workflow("capped").max_transitions(1)
              .then(workflows.step_a).then(workflows.step_b).then(workflows.step_c)
              .dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.BudgetExceeded"
    assert (status.error["budget"], status.error["limit"], status.error["used"]) == \
        ("max_transitions", 1, 2)
    assert f"Run {run_id} of workflow 'capped' exceeded its max_transitions budget: 2 > 1." \
        == status.error["message"]
    assert status.error["step"] == "step_b"
    # The breaching step's output is not in the state, and nothing was scheduled after it.
    assert status.state == {"token": token, "log": ["a"], "done_a": True}
    assert status.budget["transitions"] == 1 and status.budget["max_transitions"] == 1
    assert len(workflows.marks(f"{token}-b")) == 1  # ran once: breaches are not retried
    assert not StepRun.objects.filter(run_id=run_id, step_name="step_c").exists()


def test_max_transitions__stops_a_jump_loop(worker, token):
    run_id = (queuety.workflow("looping").max_transitions(3)
              .then(workflows.counter_loop).then(workflows.fetch_user)
              .dispatch({"token": token, "user_id": 1}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed" and status.error["budget"] == "max_transitions"
    assert len(workflows.marks(f"{token}-loop")) == 4
    assert status.state["counter"] == 3 and status.budget["transitions"] == 3


def test_max_state_bytes__fails_after_the_step_that_grows_the_state(worker, token):
    run_id = (queuety.workflow("bytes").max_state_bytes(64)
              .then(workflows.fetch_user).then(workflows.step_b)
              .dispatch({"token": token, "user_id": 55}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed" and status.error["budget"] == "max_state_bytes"
    assert status.error["step"] == "fetch_user" and status.error["limit"] == 64
    assert status.error["used"] > 64
    assert status.state == {"token": token, "user_id": 55}
    assert status.budget["public_state_bytes"] == len(
        json.dumps(status.state, separators=(",", ":")).encode())


def test_max_state_bytes__counts_utf8_bytes_not_characters(worker, token):
    # 'é' is one character, two UTF-8 bytes and six bytes when JSON-escaped (\u00e9).
    run_id = (queuety.workflow("bytes_utf8").max_state_bytes(80).then(workflows.step_a)
              .dispatch({"token": token, "name": "é" * 20}))
    status = wait_for(run_id, worker=worker)
    after = {**status.state, "log": ["a"], "done_a": True}
    compact = json.dumps(after, separators=(",", ":"), ensure_ascii=False)
    assert status.status == "failed"
    assert status.error["used"] == len(compact.encode("utf-8")) == len(compact) + 20


def test_max_state_bytes__an_oversized_payload_is_refused_at_dispatch(token):
    before = (WorkflowRun.objects.count(), StepRun.objects.count())
    with pytest.raises(queuety.BudgetExceeded,
                       match="The initial payload of workflow 'small' is 4[0-9] bytes, over its "
                             "max_state_bytes budget of 16; nothing was dispatched."):
        (queuety.workflow("small").max_state_bytes(16).then(workflows.step_a)
         .dispatch({"token": token, "padding": "x" * 10}))
    assert (WorkflowRun.objects.count(), StepRun.objects.count()) == before


def test_max_cost_units__class_costs_add_up_and_the_breach_fails(worker, token):
    run_id = (queuety.workflow("costly").max_cost_units(3)
              .then(workflows.Costly).then(workflows.Costly, name="again")
              .dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed"
    assert (status.error["budget"], status.error["limit"], status.error["used"]) == \
        ("max_cost_units", 3, 4)
    assert status.error["step"] == "again"
    assert status.budget["cost_units"] == 2 and status.state["counter"] == 1


def test_cost_units__zero_on_then_makes_a_step_free(worker, token):
    run_id = (queuety.workflow("free").max_cost_units(2)
              .then(workflows.Costly).then(workflows.Costly, name="free", cost_units=0)
              .then(workflows.step_a, cost_units=0).dispatch({"token": token}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed" and status.budget["cost_units"] == 2


def test_budget__visible_to_step_code(worker, token):
    run_id = (queuety.workflow("probed").max_cost_units(10).max_transitions(5)
              .max_state_bytes(4096)
              .then(workflows.Costly).then(workflows.budget_probe)
              .then(workflows.BudgetProbe).dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    probe = status.state["probe_budget_probe"]
    assert probe["run_id"] == run_id and probe["attempt"] == 1
    assert probe["cost_left"] == 8 and probe["transitions_left"] == 4
    assert 0 < probe["bytes_left"] < 4096
    assert status.state["probe_class"] == {"cost_left": 7, "workflow": "probed"}
    assert status.budget == {"max_transitions": 5, "max_state_bytes": 4096,
                             "max_cost_units": 10, "transitions": 3, "cost_units": 4,
                             "started_workflows": 0,
                             "public_state_bytes": status.budget["public_state_bytes"]}


def test_status__version_key_and_budget_lines(worker, token):
    key = f"cli:{token}"
    run_id = (queuety.workflow("shown").version("research.v2").idempotency_key(key)
              .max_transitions(20).then(workflows.step_a).dispatch({"token": token}))
    wait_for(run_id, worker=worker)
    out = StringIO()
    call_command("queuety", "workflow", "status", str(run_id), stdout=out)
    lines = out.getvalue().splitlines()

    assert lines[3] == "Version:  research.v2"
    assert lines[4].startswith("Hash:     ") and len(lines[4].split()[1]) == 64
    assert lines[5] == f"Key:      {key}"
    budget = json.loads(lines[6].removeprefix("Budget:   "))
    assert budget["max_transitions"] == 20 and budget["transitions"] == 1
    assert list(budget)[:2] == ["max_transitions", "transitions"]
    data = json.loads(StringIO() and _json_status(run_id))
    assert data["definition_version"] == "research.v2" and data["idempotency_key"] == key


def _json_status(run_id):
    out = StringIO()
    call_command("queuety", "workflow", "status", str(run_id), "--format", "json", stdout=out)
    return out.getvalue()


def test_runs_point_at_their_definition_row(worker, token):
    v1 = queuety.workflow("shaped").version("v1").then(workflows.step_a)
    v2 = queuety.workflow("shaped").version("v2").then(workflows.step_a)
    ids = [v1.dispatch({"token": token}), v1.dispatch({"token": token}),
           v2.dispatch({"token": token})]
    runs = WorkflowRun.objects.in_bulk(ids)
    assert runs[ids[0]].definition_id == runs[ids[1]].definition_id != runs[ids[2]].definition_id
    assert runs[ids[2]].definition.definition["version"] == "v2"
    assert runs[ids[0]].definition.runs.filter(pk__in=ids).count() == 2
    for run_id in ids:
        wait_for(run_id, worker=worker)


@pytest.mark.parametrize("unused", [uuid.uuid4().hex])
def test_budget__no_limits_means_no_budget_field(worker, token, unused):
    run_id = queuety.workflow("free_run").then(workflows.step_a).dispatch({"token": token})
    status = wait_for(run_id, worker=worker)
    assert status.budget is None
