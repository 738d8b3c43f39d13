"""Moving live runs onto a new definition with a real worker: dry run and real, a state
function, waits kept in place, a run moved at its step boundary, and bad input."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

import queuety
from queuety import export, timeline
from queuety.models import Event, StepRun, WorkflowRun
from queuety.store.definitions import definition_id
from tests import migration_steps, workflows
from tests.integration.conftest import wait_for
from tests.integration.test_operations import kinds, wait_until
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker


def v1(name):
    return (queuety.workflow(name).version("1").then(workflows.step_a)
            .wait_for_approval(name="review").then(workflows.step_c))


def v2(name):
    """Version 2: a step added before the wait (so the wait moves), step_c replaced by greet,
    which needs the state key version 1 calls ``customer``."""
    return (queuety.workflow(name).version("2").then(workflows.step_a)
            .then(migration_steps.audit).wait_for_approval(name="review")
            .then(migration_steps.greet))


def snapshot(run_id):
    run = WorkflowRun.objects.get(pk=run_id)
    return (run.definition_id, run.current_step, run.status, run.state, run.revision,
            len(kinds(run_id)))


def test_dry_run_then_real__a_waiting_run_keeps_its_wait_and_completes_on_v2(worker, token):
    name = f"mig-wait-{token}"
    run_id = v1(name).dispatch({"token": token, "customer": "Ada"})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    new = v2(name).build()
    definition_id(new)  # stored, as a deploy's first dispatch of it would
    before = snapshot(run_id)

    dry = queuety.migrate_runs(name, new.definition_hash, state=migration_steps.rename_customer,
                               dry_run=True)
    assert snapshot(run_id) == before  # the dry run changed nothing
    (move,) = dry.runs
    assert (move.run_id, move.outcome, move.step, move.to_step) == \
        (run_id, "moved_in_place", "review", "review")
    assert move.state_diff["added"] == {"customer_name": "Ada", "migrated_run": run_id}
    assert move.state_diff["removed"] == ["customer"]
    assert dry.counts["moved_in_place"] == 1 and dry.dry_run

    report = queuety.migrate_runs(name, new.definition_hash[:12],
                                  state="tests.migration_steps.rename_customer", actor="ops")
    assert report.counts["moved_in_place"] == 1
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.definition_id == definition_id(new) and run.current_step == 2
    assert run.status == "waiting_for_signal" and run.total_steps == 4
    assert run.state["customer_name"] == "Ada" and "customer" not in run.state
    event = Event.objects.get(run_id=run_id, kind="run_migrated")
    assert event.data["from_hash"] == v1(name).build().definition_hash
    assert event.data["to_hash"] == new.definition_hash and event.data["by"] == "ops"
    assert event.data["state_diff"]["removed"] == ["customer"]

    queuety.approve(run_id)
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed", status
    state = WorkflowRun.objects.get(pk=run_id).state
    assert state["greeting"] == "Hello Ada" and "audited" not in state  # audit is before
    # Moving again finds nothing live, and says so: safe to re-run.
    assert queuety.migrate_runs(name, new.definition_hash).runs == ()

    # The timeline rebuilds the state across the move; export and replay carry it.
    assert timeline.state_at(run_id, "step_a")["log"] == ["a"]  # step_a is still step 0
    document = export.export(run_id)
    assert document["definition"]["steps"][1]["name"] == "audit"
    assert "run_migrated" in [e["kind"] for e in document["events"]]
    copy = export.replay(document)
    assert WorkflowRun.objects.get(pk=copy).state == state


def test_a_wait_mapped_onto_another_kind_cannot_move_and_is_left_alone(worker, token):
    name = f"mig-kind-{token}"
    run_id = v1(name).dispatch({"token": token})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    new = (queuety.workflow(name).then(workflows.step_a).then(workflows.step_b, name="review")
           .then(workflows.step_c)).build()
    before = snapshot(run_id)
    for dry_run in (True, False):
        (move,) = queuety.migrate_runs(name, new, dry_run=dry_run).runs
        assert move.outcome == "skipped"
        assert "'review'" in move.reason and "not a wait" in move.reason
    assert snapshot(run_id) == before
    queuety.approve(run_id)
    assert wait_for(run_id, worker=worker).status == "completed"


def test_a_run_whose_step_is_processing_moves_at_the_boundary_its_output_merged_once(
        worker, token):
    name = f"mig-busy-{token}"
    old = queuety.workflow(name).then(workflows.slow).then(workflows.step_c)
    run_id = old.dispatch({"token": token, "sleep": 2.0, "customer": "Bo"})
    wait_until(lambda: StepRun.objects.filter(run_id=run_id, status="processing").exists(),
               message="the slow step to start")
    new = (queuety.workflow(name).then(workflows.slow).then(migration_steps.audit)
           .then(migration_steps.greet, name="step_c")).build()

    report = queuety.migrate_runs(name, new, state=migration_steps.rename_customer)
    (move,) = report.runs
    assert move.outcome == "at_boundary", move
    assert "attempt of 'slow'" in move.reason
    assert WorkflowRun.objects.get(pk=run_id).migration["to"] == definition_id(new)

    status = wait_for(run_id, worker=worker)
    assert status.status == "completed", status
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.definition_id == definition_id(new) and run.migration is None
    # It landed on step_c, mapped by name (so audit, new before it, is not run).
    assert run.state["greeting"] == "Hello Bo" and "audited" not in run.state
    assert run.state["slept"] == 2.0
    assert len(workflows.marks(f"{token}-slow")) == 1  # the slow step ran once
    assert kinds(run_id).count("step_completed") == 2  # slow and greet: merged once each
    moved = Event.objects.get(run_id=run_id, kind="run_migrated")
    assert moved.data["from_step"] == "step_c" and moved.data["to_step"] == "step_c"
    assert moved.data["at_boundary"] is True
    assert kinds(run_id).index("run_migration_pending") < kinds(run_id).index("run_migrated")


def test_a_paused_run_at_rest_moves_now_and_resumes_on_the_new_definition(worker, token):
    name = f"mig-paused-{token}"
    old = queuety.workflow(name).delay(seconds=1, name="nap").then(workflows.step_a)
    run_id = old.dispatch({"token": token})
    queuety.pause(run_id)
    new = queuety.workflow(name).then(workflows.step_b, name="nap").then(workflows.step_a)
    (move,) = queuety.migrate_runs(name, new.build()).runs
    # A delay sleeping is the middle of a step: it moves when the delay ends...
    assert move.outcome == "at_boundary" and "delay at 'nap'" in move.reason
    queuety.resume(run_id)
    assert wait_for(run_id, worker=worker).status == "completed"
    run = WorkflowRun.objects.get(pk=run_id)
    # ... onto the step after it: step_a, mapped by name.
    assert run.definition_id == definition_id(new.build())
    assert run.state["log"] == ["a"]

    # A paused run whose next task has not started (its queue has no worker) moves now,
    # and stays paused.
    old = queuety.workflow(f"{name}-2").then(workflows.step_a, queue=f"nobody-{token}") \
        .then(workflows.step_b)
    run_id = old.dispatch({"token": token})
    queuety.pause(run_id)
    target = (queuety.workflow(f"{name}-2").then(workflows.step_c, name="step_a")
              .then(workflows.step_b)).build()
    (move,) = queuety.migrate_runs(f"{name}-2", target, runs=[run_id]).runs
    assert move.outcome == "moved", move
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "paused" and run.definition_id == definition_id(target)
    assert StepRun.objects.get(run_id=run_id, status="cancelled").step_name == "step_a"
    queuety.resume(run_id)
    assert wait_for(run_id, worker=worker).status == "completed"
    assert WorkflowRun.objects.get(pk=run_id).state["log"] == ["c", "b"]


def test_bad_input_is_refused_by_name_and_changes_nothing(worker, token):
    name = f"mig-bad-{token}"
    ids = [v1(name).dispatch({"token": token, "n": n}) for n in (1, 2, 3)]
    for run_id in ids:
        wait_for(run_id, ("waiting_for_signal",), worker=worker)
    new = v2(name).build()
    before = [snapshot(run_id) for run_id in ids]

    with pytest.raises(queuety.UnknownDefinition, match="0123456789ab"):
        queuety.migrate_runs(name, "0123456789ab")
    with pytest.raises(queuety.InvalidMigration, match="'nope'.*its steps are"):
        queuety.migrate_runs(name, new, step_map={"review": "nope"})
    with pytest.raises(queuety.InvalidMigration, match="'ghost'"):
        queuety.migrate_runs(name, new, step_map={"ghost": "review"})
    with pytest.raises(queuety.InvalidMigration, match="does not import"):
        queuety.migrate_runs(name, new, state="tests.migration_steps.no_such_function")
    with pytest.raises(queuety.UnknownDefinition, match="not 'other'"):
        queuety.migrate_runs("other", definition_id(new))
    assert [snapshot(run_id) for run_id in ids] == before

    report = queuety.migrate_runs(name, new, state=migration_steps.returns_junk, dry_run=True)
    assert {move.outcome for move in report.runs} == {"failed"}
    assert "returned a list, not a dict" in report.runs[0].reason

    # One run's state function raises: that run is reported and left alone; the others move.
    report = queuety.migrate_runs(name, new, state=migration_steps.refuse_two)
    outcomes = {move.run_id: move.outcome for move in report.runs}
    assert outcomes == {ids[0]: "moved_in_place", ids[1]: "failed", ids[2]: "moved_in_place"}
    failed = next(move for move in report.runs if move.outcome == "failed")
    assert f"run {ids[1]}" in failed.reason and "ValueError" in failed.reason
    assert snapshot(ids[1]) == before[1]
    assert WorkflowRun.objects.get(pk=ids[0]).state["n_checked"] is True


def test_the_cli_migrates_with_a_dry_run_a_map_and_json(worker, token):
    name = f"mig-cli-{token}"
    run_id = v1(name).dispatch({"token": token, "customer": "Cy"})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    new = (queuety.workflow(name).then(workflows.step_a)
           .wait_for_approval(name="sign_off").then(migration_steps.greet))
    queuety.register(name, new)
    try:
        out = StringIO()
        call_command("queuety", "workflow", "migrate", name, "--map", "review=sign_off",
                     "--state", "tests.migration_steps.rename_customer", "--dry-run", "--json",
                     stdout=out)
        report = json.loads(out.getvalue())
        assert report["dry_run"] and report["counts"]["moved_in_place"] == 1
        assert report["to_hash"] == new.build().definition_hash  # --to latest: registered
        assert WorkflowRun.objects.get(pk=run_id).current_step == 1
        assert "run_migrated" not in kinds(run_id)

        out = StringIO()
        call_command("queuety", "workflow", "migrate", name, "--map", "review=sign_off",
                     "--state", "tests.migration_steps.rename_customer", stdout=out)
        assert "1 moved now" in out.getvalue() and "moved_in_place" in out.getvalue()
        assert WorkflowRun.objects.get(pk=run_id).definition_id == definition_id(new.build())
        with pytest.raises(CommandError, match="OLD=NEW"):
            call_command("queuety", "workflow", "migrate", name, "--map", "oops")
        with pytest.raises(CommandError, match="maps onto 'missing'"):
            call_command("queuety", "workflow", "migrate", name, "--map", "review=missing",
                         "--to", new.build().definition_hash)
    finally:
        queuety.registry.unregister(name)
    queuety.approve(run_id)
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert WorkflowRun.objects.get(pk=run_id).state["greeting"] == "Hello Cy"


def test_the_admin_shows_the_dry_run_first_then_moves_the_selected_runs(worker, token):
    from tests.integration.test_admin import client_for, make_user

    name = f"mig-admin-{token}"
    ids = [v1(name).dispatch({"token": token, "customer": f"C{n}"}) for n in range(2)]
    for run_id in ids:
        wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.register(name, v2(name))
    try:
        viewer = client_for(make_user("view_workflowrun"))
        page = f"/admin/queuety/workflowrun/migrate/?workflow={name}"
        assert viewer.get(page).status_code == 403
        operator = client_for(make_user("view_workflowrun", "change_workflowrun"))
        chosen = operator.post("/admin/queuety/workflowrun/", {
            "action": "migrate_selected", "_selected_action": [str(pk) for pk in ids]})
        assert chosen.status_code == 302
        assert chosen["Location"].endswith(f"migrate/?workflow={name}&runs={ids[0]}%2C{ids[1]}")

        # The definition page links operators (only) to the move of its live runs.
        old_pk = WorkflowRun.objects.get(pk=ids[0]).definition_id
        definition_page = f"/admin/queuety/workflowdefinition/{old_pk}/change/"
        assert 'id="move-live-runs"' not in viewer.get(definition_page).content.decode()
        link = operator.get(definition_page).content.decode()
        assert f"migrate/?workflow={name}&amp;from={old_pk}" in link
        whole = operator.get(f"/admin/queuety/workflowrun/migrate/?workflow={name}"
                             f"&from={old_pk}")
        assert whole.status_code == 200 and "the live runs of definition" in \
            whole.content.decode()
        assert whole.content.decode().count('id="migrate-run-') == 2

        before = [snapshot(run_id) for run_id in ids]
        dry = operator.get(chosen["Location"])
        assert dry.status_code == 200
        text = dry.content.decode()
        assert "Dry run: nothing was changed." in text and "moved_in_place" in text
        assert f'id="migrate-run-{ids[1]}"' in text
        assert [snapshot(run_id) for run_id in ids] == before

        bad = operator.post(chosen["Location"], {"to": "latest", "step_map": "review",
                                                 "state": "", "move": "1"})
        assert bad.status_code == 400 and "is not OLD=NEW" in bad.content.decode()
        assert [snapshot(run_id) for run_id in ids] == before

        with override_settings(QUEUETY={**TEST_QUEUETY, "REPLAY_MODULES": ["tests"]}):
            moved = operator.post(chosen["Location"], {
                "to": "latest", "step_map": "", "move": "1",
                "state": "tests.migration_steps.rename_customer"})
        assert moved.status_code == 200 and "Done." in moved.content.decode()
        for run_id in ids:
            run = WorkflowRun.objects.get(pk=run_id)
            assert run.definition_id == definition_id(v2(name).build())
            assert "customer_name" in run.state
            by = Event.objects.get(run_id=run_id, kind="run_migrated").data["by"]
            assert by.startswith("admin:")
    finally:
        queuety.registry.unregister(name)
    for run_id in ids:
        queuety.approve(run_id)
        assert wait_for(run_id, worker=worker).status == "completed"
