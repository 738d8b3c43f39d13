"""A deploy that renames a handler while runs wait on approvals (issue 28, parts 1 and 2).

The handlers live in a module written to a folder of this module's own, on the ``sys.path`` of
this process and of its worker. Runs reach the approval, the module is edited on disk (the
handler renamed), and the deploy check (``manage.py queuety deploy-check``, the system check
``queuety.E005``) must catch it before the worker restarts; an alias (the setting, then
``queuety.alias()``) makes the check pass, and the restarted worker completes every run
through it after the approval, their definition and its hash unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

import queuety
from queuety import checks, deploy_check
from queuety.core import imports
from queuety.models import WorkflowDefinition, WorkflowRun
from tests.integration.conftest import ROOT, forget, wait_for, write
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker

BEFORE = '''
def prepare(state):
    return {"prepared": True}


def charge(state):
    return {"charged_by": "charge"}
'''
#: The deploy: ``charge`` renamed.
AFTER = BEFORE.replace("def charge(", "def charge_card(").replace('"charge"', '"charge_card"')


@pytest.fixture
def module(code_dir, token):
    """A handler module of this test's own (written with :func:`write`), forgotten after."""
    name = f"deploy_handlers_{token}"
    yield name
    for run_id in WorkflowRun.objects.filter(name=f"deploy_{token}").exclude(
            status__in=["completed", "failed", "cancelled"]).values_list("pk", flat=True):
        queuety.cancel(run_id)  # a failed test leaves no live run for the later checks
    forget(name)


def waiting_runs(deployed, token, module, count=3) -> tuple[str, list[int], str]:
    """``count`` runs of ``prepare -> approval -> charge``, each parked at the approval."""
    name = f"deploy_{token}"
    builder = (queuety.workflow(name).on_queue(deployed.queue).then(f"{module}.prepare")
               .wait_for_approval().then(f"{module}.charge"))
    ids = [builder.dispatch({"n": n}) for n in range(count)]
    for run_id in ids:
        assert wait_for(run_id, ("waiting_for_signal", "failed"), worker=deployed).status == \
            "waiting_for_signal"
    return name, ids, builder.build().definition_hash


def mine(report: deploy_check.DeployReport, name: str) -> deploy_check.DefinitionReport:
    [found] = [d for d in report.definitions if d.name == name]
    return found


def cli(*args: str) -> tuple[dict, int]:
    out = StringIO()
    try:
        call_command("queuety", "deploy-check", "--json", *args, stdout=out)
    except CommandError as error:
        return json.loads(out.getvalue()), error.returncode
    return json.loads(out.getvalue()), 0


def completes_through_the_alias(ids, name, digest, deployed):
    for run_id in ids:
        queuety.approve(run_id)
    for run_id in ids:
        status = wait_for(run_id, worker=deployed)
        assert status.status == "completed", status.error
        assert status.state["charged_by"] == "charge_card"
        assert status.definition_hash == digest
    # The stored definition kept its old path, so its hash: no second definition was made.
    assert list(WorkflowDefinition.objects.filter(name=name)
                .values_list("definition_hash", flat=True)) == [digest]


def test_a_renamed_handler_fails_the_check_until_the_setting_aliases_it(
        deployed, code_dir, module, token):
    write(code_dir, module, BEFORE)
    name, ids, digest = waiting_runs(deployed, token, module)
    before = mine(deploy_check.deploy_check(), name)
    assert (before.ok, before.live, before.oldest_run_id, before.hash) == (
        True, {"waiting_for_signal": 3}, ids[0], digest)

    write(code_dir, module, AFTER)  # the deploy renames charge to charge_card
    problem = (f"Step 'charge' names '{module}.charge', which does not import in this code "
               f"(ImportError: '{module}.charge' is not an importable dotted path).")
    document, code = cli()
    [found] = [d for d in document["definitions"] if d["name"] == name]
    assert (code, document["ok"], found["ok"], found["failures"]) == (1, False, False, [problem])
    assert found["live_runs"] == {"waiting_for_signal": 3} and found["oldest_run"]["id"] == ids[0]
    assert found["failing"] == [{"where": "Step 'charge'", "path": f"{module}.charge",
                                 "need": "step", "alias": None, "problem": problem}]
    # The system check: an Error, so 'check --database default' exits non-zero.
    errors = [m for m in checks.check_live_runs(databases=["default"]) if name in m.msg]
    assert [(type(m), m.id) for m in errors] == [(Error, "queuety.E005")]
    assert errors[0].msg == (f"Workflow '{name}' (definition {digest[:12]}) has 3 live runs, "
                             f"the oldest #{ids[0]}, that would fail: {problem}")
    with pytest.raises(SystemCheckError, match=f"queuety.E005.*{name}"):
        call_command("check", databases=["default"])
    # Without --database the check neither runs nor reads the database.
    with CaptureQueriesContext(connection) as queried:
        call_command("check", stdout=StringIO())
    assert not [q for q in queried.captured_queries if "queuety_" in q["sql"]]

    alias = {f"{module}.charge": f"{module}.charge_card"}
    with override_settings(QUEUETY={**TEST_QUEUETY, "HANDLER_ALIASES": alias}):
        after = mine(deploy_check.deploy_check(), name)
        assert after.ok and [(f.ref.path, f.target) for f in after.check.aliased] == [
            (f"{module}.charge", f"{module}.charge_card")]
        assert not [m for m in checks.check_live_runs(databases=["default"]) if name in m.msg]
        document, _ = cli()
        assert [d["aliased"] for d in document["definitions"] if d["name"] == name] == [[{
            "where": "Step 'charge'", "path": f"{module}.charge", "need": "step",
            "alias": f"{module}.charge_card", "problem": None}]]
        assert {"from": f"{module}.charge", "to": f"{module}.charge_card",
                "source": "settings", "resolves_to": f"{module}.charge_card", "ok": True,
                "problem": None} in document["aliases"]

    # The deploy's restart, with the alias in the worker's settings.
    deployed.env["QUEUETY_TEST_HANDLER_ALIASES"] = json.dumps(alias)
    try:
        deployed.restart()
        completes_through_the_alias(ids, name, digest, deployed)
    finally:
        del deployed.env["QUEUETY_TEST_HANDLER_ALIASES"]


def test_an_alias_declared_beside_the_new_handler_passes_and_the_worker_follows_it(
        deployed, code_dir, module, token):
    write(code_dir, module, BEFORE)
    name, ids, digest = waiting_runs(deployed, token, module, count=2)
    write(code_dir, module, AFTER)
    assert not mine(deploy_check.deploy_check(), name).ok
    # The next deploy adds queuety.alias() to the module: importing it declares the alias.
    write(code_dir, module, AFTER + f"\n\nimport queuety\n\nqueuety.alias("
                                    f"'{module}.charge', '{module}.charge_card')\n")
    try:
        found = mine(deploy_check.deploy_check(), name)
        assert found.ok and [f.target for f in found.check.aliased] == [f"{module}.charge_card"]
        deployed.restart()
        completes_through_the_alias(ids, name, digest, deployed)
    finally:
        imports.remove_alias(f"{module}.charge")


def test_an_alias_to_nothing_is_itself_a_failure(db_session):
    with override_settings(QUEUETY={**TEST_QUEUETY, "HANDLER_ALIASES": {
            "tests.deploy_steps.old": "tests.deploy_steps.vanished"}}):
        document, code = cli()
        found = [m for m in checks.check_live_runs(databases=["default"])
                 if m.id == "queuety.E006"]
    problem = ("The handler alias 'tests.deploy_steps.old' -> 'tests.deploy_steps.vanished' "
               "(QUEUETY['HANDLER_ALIASES']) points to 'tests.deploy_steps.vanished', which "
               "does not import in this code (ImportError: 'tests.deploy_steps.vanished' is "
               "not an importable dotted path).")
    assert code == 1 and [a["problem"] for a in document["aliases"]] == [problem]
    assert [m.msg for m in found] == [problem]


def test_the_command_exits_1_in_a_fresh_process(deployed, code_dir, module, token):
    write(code_dir, module, BEFORE)
    name, ids, _ = waiting_runs(deployed, token, module, count=1)
    write(code_dir, module, AFTER)
    done = subprocess.run([sys.executable, "manage.py", "queuety", "deploy-check"], cwd=ROOT,
                          env=deployed.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"{name}  definition" in done.stdout and "FAILS" in done.stdout
    assert f"  FAIL  Step 'charge' names '{module}.charge', which does not import" in done.stdout
    assert "Error: The deploy check found 1 problem" in done.stderr


def test_the_run_page_shows_the_stored_path_and_its_alias(deployed, code_dir, module, token):
    from django.contrib.auth.models import User

    write(code_dir, module, BEFORE)
    name, [run_id], _ = waiting_runs(deployed, token, module, count=1)
    user = User.objects.create_superuser(f"d{uuid.uuid4().hex[:10]}", password="pw")
    client = Client()
    client.force_login(user)
    assert f"{module}.charge →" not in client.get(
        f"/admin/queuety/workflowrun/{run_id}/change/").content.decode()
    queuety.alias(f"{module}.charge", f"{module}.charge_card")
    try:
        page = client.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode()
    finally:
        imports.remove_alias(f"{module}.charge")
    assert f"<code>{module}.charge → {module}.charge_card</code>" in page
