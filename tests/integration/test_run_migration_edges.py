"""Moving live runs, the edges (found by a review): approval links across an in-place move, a
state function that is not isolated, two migrations of one run at once, a pending move and
the run's failure, waits for other runs, moves at a delay's and a fan-out's end, and what the
admin lets a form import."""

from __future__ import annotations

import pytest
from django.test import override_settings

import queuety
from queuety import approvals, run_migration
from queuety.models import Event, StepRun, WorkflowRun
from queuety.store.definitions import definition_id
from tests import migration_steps as steps
from tests import workflows
from tests.integration.conftest import wait_for
from tests.integration.test_run_migration import kinds, snapshot, v1, v2, wait_until
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker


def test_an_approval_link_mailed_before_an_in_place_move_still_answers_the_wait(
        worker, token):
    name = f"edge-link-{token}"
    run_id = v1(name).dispatch({"token": token, "customer_name": "Di"})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    link = approvals.make_token(run_id)  # mailed to the approver days before the deploy
    (move,) = queuety.migrate_runs(name, v2(name).build()).runs  # the wait: step 1 -> 2
    assert move.outcome == "moved_in_place"
    assert WorkflowRun.objects.get(pk=run_id).current_step == 2
    approvals.redeem(link, "approve", None)
    assert wait_for(run_id, worker=worker).status == "completed"
    assert WorkflowRun.objects.get(pk=run_id).state["greeting"] == "Hello Di"


def test_a_failed_state_function_at_the_boundary_leaves_the_state_unchanged(worker, token):
    name = f"edge-nested-{token}"
    old = queuety.workflow(name).then(workflows.slow).then(workflows.step_c)
    run_id = old.dispatch({"token": token, "sleep": 1.5, "profile": {"name": "Bo"}})
    wait_until(lambda: StepRun.objects.filter(run_id=run_id, status="processing").exists(),
               message="the slow step to start")
    new = queuety.workflow(name).then(workflows.slow).then(workflows.step_c).version("2")
    (move,) = queuety.migrate_runs(
        name, new.build(), state="tests.migration_steps.mutate_nested_then_raise").runs
    assert move.outcome == "at_boundary" and move.to_step == "step_c"
    assert wait_for(run_id, worker=worker).status == "completed"
    failed = Event.objects.get(run_id=run_id, kind="run_migration_failed")
    assert "raised ValueError" in failed.data["reason"]
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.definition_id == definition_id(old.build()) and run.migration is None
    assert run.state["profile"] == {"name": "Bo"} and run.state["slept"] == 1.5


def test_the_state_diff_shows_a_nested_change_and_a_written_then_failed_move_writes_nothing(
        worker, token):
    name = f"edge-diff-{token}"
    run_id = v1(name).dispatch({"token": token, "profile": {"name": "Ada"}})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    (move,) = queuety.migrate_runs(name, v2(name).build(), state=steps.rename_nested,
                                   dry_run=True).runs
    assert move.state_diff["changed"] == {"profile": [{"name": "Ada"}, {"full_name": "Ada"}]}
    before = snapshot(run_id)
    (move,) = queuety.migrate_runs(name, v2(name).build(), state=steps.write_then_raise).runs
    assert move.outcome == "failed" and "refused after writing" in move.reason
    assert snapshot(run_id) == before


def test_a_database_error_in_one_runs_state_function_fails_that_run_only(worker, token):
    name = f"edge-dberr-{token}"
    ids = [v1(name).dispatch({"token": token, "n": n}) for n in (1, 2, 3)]
    for run_id in ids:
        wait_for(run_id, ("waiting_for_signal",), worker=worker)
    for dry_run in (True, False):
        report = queuety.migrate_runs(name, v2(name).build(), state=steps.db_error_for_two,
                                      dry_run=dry_run)
        assert [move.outcome for move in report.runs] == \
            ["moved_in_place", "failed", "moved_in_place"]
    assert WorkflowRun.objects.get(pk=ids[1]).definition_id == definition_id(v1(name).build())


def test_a_run_moved_meanwhile_is_not_moved_a_second_time(worker, token):
    """Two migrations at once (a double click): both list the run before either locks it."""
    name = f"edge-twice-{token}"
    old = queuety.workflow(name).then(workflows.step_a, queue=f"nobody-{token}") \
        .then(workflows.step_b)
    run_id = old.dispatch({"token": token})
    new = (queuety.workflow(name).then(workflows.step_a, queue=f"nobody-{token}")
           .then(workflows.step_c)).build()
    plan = run_migration.plan_migration(name, new, actor="ops")
    assert run_migration.move_run(run_id, plan).outcome == "moved"
    second = run_migration.move_run(run_id, plan)  # what the second, concurrent call does
    assert second.outcome == "skipped" and "already on that definition" in second.reason
    assert kinds(run_id).count("run_migrated") == 1
    assert StepRun.objects.filter(run_id=run_id, status="cancelled").count() == 1
    queuety.cancel(run_id)


def test_a_pending_move_goes_with_its_runs_failure_and_can_be_cancelled(worker, token):
    name = f"edge-fail-{token}"
    old = queuety.workflow(name).then(steps.slow_then_fail,
                                      retry=queuety.RetryPolicy(max_attempts=1)) \
        .then(workflows.step_c)
    run_id = old.dispatch({"token": token, "sleep": 1.0})
    wait_until(lambda: StepRun.objects.filter(run_id=run_id, status="processing").exists(),
               message="the step to start")
    new = queuety.workflow(name).version("2").then(steps.slow_then_fail) \
        .then(workflows.step_c).build()
    assert queuety.migrate_runs(name, new).runs[0].outcome == "at_boundary"
    assert wait_for(run_id, worker=worker).status == "failed"
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.migration is None and run.definition_id == definition_id(old.build())

    # A pending move is cancelled by moving the run to the definition it is on.
    run_id = old.dispatch({"token": token, "sleep": 3.0})
    wait_until(lambda: StepRun.objects.filter(run_id=run_id, status="processing").exists(),
               message="the step to start")
    assert queuety.migrate_runs(name, new).runs[0].outcome == "at_boundary"
    again = queuety.migrate_runs(name, new)  # safe to repeat
    assert again.runs[0].outcome == "at_boundary" and "already pending" in again.runs[0].reason
    assert kinds(run_id).count("run_migration_pending") == 1
    (cancelled,) = queuety.migrate_runs(name, old.build(), runs=[run_id]).runs
    assert cancelled.outcome == "skipped" and "was cancelled" in cancelled.reason
    assert WorkflowRun.objects.get(pk=run_id).migration is None
    assert "run_migration_cancelled" in kinds(run_id)
    queuety.cancel(run_id)


def test_a_wait_for_other_runs_moves_only_onto_the_same_kind_of_wait(worker, token):
    name = f"edge-join-{token}"
    awaited = [v1(f"{name}-other").dispatch({"token": token}) for _ in range(2)]
    for run_id in awaited:
        wait_for(run_id, ("waiting_for_signal",), worker=worker)
    builder = queuety.workflow(name).wait_for_workflows("ids", name="join")
    parent = builder.then(workflows.step_c).dispatch({"token": token, "ids": awaited})
    wait_for(parent, ("waiting_for_workflows",), worker=worker)
    onto_task = queuety.workflow(name).then(workflows.step_b, name="join") \
        .then(workflows.step_c).build()
    (move,) = queuety.migrate_runs(name, onto_task).runs
    assert move.outcome == "skipped" and "not a wait_workflows step" in move.reason
    same = queuety.workflow(name).wait_for_workflows("ids", name="join") \
        .then(workflows.step_a).build()
    (move,) = queuety.migrate_runs(name, same).runs
    assert move.outcome == "at_boundary"
    queuety.approve(awaited[0])
    assert wait_for(awaited[0], worker=worker).status == "completed"
    # The first awaited run's end lands the parent on its wait again: it moves, and waits on.
    wait_until(lambda: WorkflowRun.objects.get(pk=parent).definition_id == definition_id(same),
               message="the parent to move at its wake-up")
    assert WorkflowRun.objects.get(pk=parent).status == "waiting_for_workflows"
    queuety.approve(awaited[1])
    assert wait_for(parent, worker=worker).status == "completed"
    assert list(Event.objects.filter(run_id=parent, kind="step_completed")
                .values_list("step_name", flat=True)) == ["step_a"]  # ``same``'s last step


def test_runs_move_when_a_delay_ends_and_when_a_fan_out_joins(worker, token):
    """Both claimed after the move was recorded: the one-statement transition must not take
    them past it (it requires ``migration IS NULL``)."""
    name = f"edge-delay-{token}"
    napping = queuety.workflow(name).delay(seconds=1.5, name="nap").then(workflows.step_a)
    fanned = (queuety.workflow(f"{name}-fan").parallel([workflows.sleeper,
                                                        workflows.sleeper_two], name="fan")
              .then(workflows.step_a))
    nap_id = napping.dispatch({"token": token})
    fan_id = fanned.dispatch({"token": token, "nap": 1.0})
    wait_until(lambda: StepRun.objects.filter(run_id=fan_id, status="processing").count() == 2,
               message="the branches to start")
    nap_to = queuety.workflow(name).then(workflows.step_b, name="nap") \
        .then(workflows.step_c, name="step_a").build()
    fan_to = queuety.workflow(f"{name}-fan").then(workflows.step_b, name="fan") \
        .then(workflows.step_c, name="step_a").build()
    assert queuety.migrate_runs(name, nap_to).runs[0].outcome == "at_boundary"
    assert queuety.migrate_runs(f"{name}-fan", fan_to).runs[0].outcome == "at_boundary"
    for run_id, onto in ((nap_id, nap_to), (fan_id, fan_to)):
        assert wait_for(run_id, worker=worker).status == "completed"
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.definition_id == definition_id(onto) and run.migration is None
        assert run.state["log"] == ["c"]  # step_a mapped onto the new definition's step_c
    assert sorted(WorkflowRun.objects.get(pk=fan_id).state) == \
        ["done_c", "log", "nap", "shared", "slept_by", "slept_two", "token"]


def test_the_admin_imports_only_the_sites_own_state_functions(worker, token):
    from tests.integration.test_admin import client_for, make_user

    name = f"edge-admin-{token}"
    run_id = v1(name).dispatch({"token": token, "customer": "Ed"})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    queuety.register(name, v2(name))
    operator = client_for(make_user("view_workflowrun", "change_workflowrun"))
    page = f"/admin/queuety/workflowrun/migrate/?workflow={name}"
    try:
        before = snapshot(run_id)
        for path in ("os.path.join", "queuety.operations.cancel"):
            refused = operator.post(page, {"to": "latest", "state": path, "move": "1"})
            assert refused.status_code == 400
            assert "is not in one of this site" in refused.content.decode()
        assert snapshot(run_id) == before
        with override_settings(QUEUETY={**TEST_QUEUETY, "REPLAY_MODULES": ["tests"]}):
            moved = operator.post(page, {"to": "latest", "move": "1",
                                         "state": "tests.migration_steps.rename_customer"})
        assert moved.status_code == 200
        assert WorkflowRun.objects.get(pk=run_id).state["customer_name"] == "Ed"
    finally:
        queuety.registry.unregister(name)
        queuety.cancel(run_id)
