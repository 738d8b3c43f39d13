"""A deploy simulated end to end (issue 28): runs wait on approvals while the module their
handlers live in is edited on disk between worker restarts: a handler renamed, a step added
and one removed, a state key renamed. The deploy check catches each break before the restart;
quarantine stops the version; aliases keep one run on its definition, migration (dry run,
then real, with a state function) moves the others; every run then completes, each step's
output merged once.
"""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

import queuety
from queuety import deploy_check
from queuety.models import Event, WorkflowRun
from queuety.store.definitions import definition_id

# code_dir and deployed (conftest): a folder on sys.path for the site's module, and a worker
# that imports from it; write() edits the module on disk, as a deploy does.
from tests.integration.conftest import wait_for, write
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker

#: Version 1 of the site's code.
BEFORE = '''
def prepare(state):
    return {"prepared": True}


def charge(state):
    return {"charged": state["customer"]}


def notify(state):
    return {"notified": True}
'''
#: The deploy: ``charge`` renamed ``charge_card``, which reads the key ``customer_name`` now;
#: ``notify`` gone; ``audit`` new.
AFTER = '''
def prepare(state):
    return {"prepared": True}


def charge_card(state):
    return {"charged": state["customer_name"]}


def audit(state):
    return {"audited": True}
'''


def failures(name: str) -> list[str]:
    report = deploy_check.deploy_check()
    return [problem for found in report.definitions if found.name == name
            for problem in found.check.failures]


def test_a_deploy_that_breaks_waiting_runs_is_caught_then_every_run_completes(
        deployed, code_dir, token):
    module, name = f"site_{token}", f"orders_{token}"
    write(code_dir, module, BEFORE)
    v1 = (queuety.workflow(name).version("1").on_queue(deployed.queue)
          .then(f"{module}.prepare").wait_for_approval(name="review")
          .then(f"{module}.charge").then(f"{module}.notify"))
    ids = [v1.dispatch({"customer": f"c{n}", "customer_name": f"C{n}" if n == 2 else None})
           for n in range(3)]
    for run_id in ids:
        assert wait_for(run_id, ("waiting_for_signal",), worker=deployed).status == \
            "waiting_for_signal"
    assert failures(name) == []

    # git pull: the new code is on disk, the worker still runs the old.
    write(code_dir, module, AFTER)
    v2 = (queuety.workflow(name).version("2").on_queue(deployed.queue)
          .then(f"{module}.prepare").wait_for_approval(name="review")
          .then(f"{module}.charge_card").then(f"{module}.audit"))
    found = failures(name)
    assert len(found) == 2 and any(f"{module}.charge'" in f for f in found) and \
        any(f"{module}.notify'" in f for f in found), found
    assert not deploy_check.deploy_check().ok  # the release is stopped here

    # Quarantine the old version while it is being fixed: nothing of it moves meanwhile.
    paused = queuety.pause_definition(v1.build().definition_hash, actor="ops")
    assert paused.done == 3
    with pytest.raises(queuety.RunNotWaiting):
        queuety.approve(ids[0])
    assert queuety.pause_definition(v1.build().definition_hash).done == 0  # safe to repeat

    # Aliases make the check pass for the old definition; the worker restarts on the new code.
    aliases = {f"{module}.charge": f"{module}.charge_card", f"{module}.notify": f"{module}.audit"}
    with override_settings(QUEUETY={**TEST_QUEUETY, "HANDLER_ALIASES": aliases}):
        assert failures(name) == []
    deployed.env["QUEUETY_TEST_HANDLER_ALIASES"] = json.dumps(aliases)
    deployed.restart()

    # But charge_card reads customer_name, which runs 0 and 1 lack: move them to version 2,
    # with a state function, dry run first.
    definition_id(v2.build())
    state = "tests.migration_steps.rename_customer"
    dry = queuety.migrate_runs(name, v2.build().definition_hash, runs=ids[:2], state=state,
                               dry_run=True)
    assert [move.outcome for move in dry.runs] == ["moved_in_place", "moved_in_place"]
    assert all(move.state_diff["removed"] == ["customer"] for move in dry.runs)
    assert WorkflowRun.objects.get(pk=ids[0]).definition_id == definition_id(v1.build())
    real = queuety.migrate_runs(name, v2.build().definition_hash, runs=ids[:2], state=state)
    assert real.counts["moved_in_place"] == 2

    # Lift the quarantine: the moved runs on version 2, the aliased one on version 1.
    assert queuety.resume_definition(v2.build().definition_hash, actor="ops").done == 2
    assert queuety.resume_definition(v1.build().definition_hash, actor="ops").done == 1
    for run_id in ids:
        queuety.approve(run_id)
    for run_id in ids:
        status = wait_for(run_id, worker=deployed)
        assert status.status == "completed", (run_id, status, deployed.log()[-3000:])
    states = [WorkflowRun.objects.get(pk=run_id).state for run_id in ids]
    assert [s["charged"] for s in states] == ["c0", "c1", "C2"]
    assert all(s["audited"] is True and "notified" not in s for s in states)
    for run_id in ids:  # each step's output merged once
        kinds = list(Event.objects.filter(run_id=run_id, kind="step_completed")
                     .values_list("step_name", flat=True))
        assert len(kinds) == len(set(kinds)) == 3, kinds
    # Run 2 stayed on version 1 (through the aliases); the others moved.
    assert WorkflowRun.objects.get(pk=ids[2]).definition_id == definition_id(v1.build())
    # Version 1 is drained: without the aliases, the check passes; its code can go.
    assert failures(name) == []
