"""Artifacts: written inside steps (visible once the attempt's outcome is recorded) and from
outside, read through the Python API, the CLI, the REST API and the admin, exported and
replayed; against PostgreSQL and a real worker."""

from __future__ import annotations

import base64
import json
import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

import queuety
from queuety.models import Artifact
from tests import streaming_steps as steps
from tests import workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker

API = "/queuety/api"


def make_user(*perms: str, **flags) -> User:
    user = User.objects.create_user(f"r{uuid.uuid4().hex[:10]}", password="pw", **flags)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def operator() -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user("view_workflowrun", "change_workflowrun"))
    return client


def cli(*args) -> str:
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


def written_run(worker, token) -> int:
    run_id = (queuety.workflow("artifacts_written").then(steps.write_artifacts)
              .then(workflows.step_a).dispatch({"token": token, "title": "Pricing brief"}))
    assert wait_for(run_id, worker=worker).status == "completed"
    return run_id


# -- inside a step ----------------------------------------------------------------------------

def test_put_artifact_in_a_step__kinds_round_trip_bound_to_the_step(worker, token):
    run_id = written_run(worker, token)

    listed = queuety.artifacts(run_id)
    assert [(a["key"], a["kind"], a["step_name"], a["step_index"]) for a in listed] == [
        ("blob", "bytes", "write_artifacts", 0), ("draft", "json", "write_artifacts", 0),
        ("notes", "markdown", "write_artifacts", 0)]
    assert "content" not in listed[0]
    assert queuety.artifact(run_id, "draft")["content"] == {"title": "Pricing brief",
                                                           "body": "..."}
    assert queuety.artifact(run_id, "draft")["metadata"] == {"source": "planner"}
    assert queuety.artifact(run_id, "notes")["content"] == "# Notes\n\nDone."
    assert queuety.artifact(run_id, "blob")["content"] == b"\x00\x01binary"
    assert Artifact.objects.filter(run_id=run_id).count() == 3  # written twice, stored once
    status = queuety.workflow_status(run_id)
    assert (status.artifact_count, status.artifact_keys) == (3, ["blob", "draft", "notes"])
    assert status.to_dict()["artifact_keys"] == ["blob", "draft", "notes"]


def test_retried_attempt__its_rewrite_replaces_the_failed_attempts_and_leaves_one_row(
        worker, token):
    run_id = (queuety.workflow("artifacts_retried")
              .then(steps.artifact_then_fail_once,
                    retry=queuety.RetryPolicy(max_attempts=3, initial_delay=0.05,
                                              retry_on=[ConnectionError]))
              .dispatch({"token": token}))
    assert wait_for(run_id, worker=worker).status == "completed"

    assert queuety.artifact(run_id, "draft")["content"] == "attempt 2"
    # The failed attempt's outcome was recorded, so what only it wrote stays visible.
    assert queuety.artifact(run_id, "only_first")["content"] == "from the failed attempt"
    assert sorted(Artifact.objects.filter(run_id=run_id).values_list("key", "visible")) == [
        ("draft", True), ("only_first", True)]


def test_step_failing_for_good__its_artifacts_show_with_the_recorded_failure(worker, token):
    run_id = queuety.workflow("artifacts_failed").then(steps.artifact_then_fail) \
        .dispatch({"token": token})
    assert wait_for(run_id, worker=worker).status == "failed"
    assert queuety.artifact(run_id, "debug")["content"] == {"raw": "unparseable"}


def test_plain_steps__write_no_artifact_rows_and_keep_their_statements(worker, token):
    run_id = queuety.workflow("artifacts_none").then(workflows.step_a) \
        .dispatch({"token": token})
    status = wait_for(run_id, worker=worker)
    assert (status.artifact_count, status.artifact_keys) == (0, [])
    assert not Artifact.objects.filter(run_id=run_id).exists()


# -- outside a step ---------------------------------------------------------------------------

def test_put_artifact_outside__upserts_by_key_and_delete_removes_it(worker, token):
    run_id = written_run(worker, token)

    summary = queuety.put_artifact(run_id, "research_brief", "# Brief\n\nDone.", "markdown",
                                   metadata={"reviewed_by": "editor@example.com"})
    assert summary["key"] == "research_brief" and summary["size"] == 14
    queuety.put_artifact(run_id, "draft", {"title": "edited"})
    assert queuety.artifact(run_id, "draft")["content"] == {"title": "edited"}
    assert queuety.artifact(run_id, "draft")["step_name"] == ""  # no longer the step's
    assert Artifact.objects.filter(run_id=run_id, key="draft").count() == 1

    queuety.delete_artifact(run_id, "research_brief")
    with pytest.raises(queuety.ArtifactNotFound, match=f"run {run_id} has no artifact "
                                                       "'research_brief'"):
        queuety.artifact(run_id, "research_brief")
    with pytest.raises(queuety.ArtifactNotFound):
        queuety.delete_artifact(run_id, "research_brief")


@pytest.mark.parametrize("args, problem", [
    (("", "x"), "needs a non-empty key"),
    (("a/b", "x"), "contains '/'"),
    (("k", "x", "yaml"), "has kind 'yaml'; use one of json, text, markdown, bytes"),
    (("k", {1, 2}), "not JSON"),
    (("k", b"x", "text"), "needs a string"),
    (("k", "x", "bytes"), "needs bytes"),
    (("k", "x", "json", ["not", "a", "dict"]), "metadata must be a dict"),
])
def test_put_artifact__bad_input_is_refused_naming_the_fix_and_writes_nothing(
        worker, token, args, problem):
    run_id = written_run(worker, token)
    with pytest.raises(queuety.InvalidArtifact, match=problem):
        queuety.put_artifact(run_id, *args)
    assert Artifact.objects.filter(run_id=run_id).count() == 3
    with pytest.raises(queuety.RunNotFound):
        queuety.put_artifact(10**12, "k", "x")


def test_put_artifact__over_the_size_setting_is_refused(worker, token):
    run_id = written_run(worker, token)
    with override_settings(QUEUETY={**TEST_QUEUETY, "MAX_ARTIFACT_BYTES": 100}):
        with pytest.raises(queuety.InvalidArtifact,
                           match=r"is 101 bytes; the limit is 100 \(QUEUETY\['MAX_ARTIFACT"):
            queuety.put_artifact(run_id, "big", "x" * 101, "text")
        queuety.put_artifact(run_id, "fits", "x" * 100, "text")
    assert not Artifact.objects.filter(run_id=run_id, key="big").exists()


# -- the CLI ----------------------------------------------------------------------------------

def test_cli__artifacts_artifact_and_delete(worker, token, tmp_path):
    run_id = written_run(worker, token)

    table = cli("workflow", "artifacts", str(run_id)).splitlines()
    assert table[0].split() == ["Key", "Kind", "Size", "Step", "UpdatedAt"]
    assert [line.split()[:4] for line in table[1:]] == [
        ["blob", "bytes", "8", "write_artifacts"], ["draft", "json", "38", "write_artifacts"],
        ["notes", "markdown", "14", "write_artifacts"]]
    listed = json.loads(cli("workflow", "artifacts", str(run_id), "--format", "json",
                            "--with-content"))
    assert listed[0]["content"] == base64.b64encode(b"\x00\x01binary").decode()
    shown = json.loads(cli("workflow", "artifact", str(run_id), "draft"))
    assert shown["content"] == {"title": "Pricing brief", "body": "..."}
    target = tmp_path / "blob.bin"
    assert "(8 bytes) written to" in cli("workflow", "artifact", str(run_id), "blob",
                                         "--output", str(target))
    assert target.read_bytes() == b"\x00\x01binary"
    status_text = cli("workflow", "status", str(run_id))
    assert "Artifacts: 3" in status_text and "ArtifactKeys: blob, draft, notes" in status_text

    assert "deleted" in cli("workflow", "delete-artifact", str(run_id), "notes")
    with pytest.raises(CommandError, match=f"Artifact 'notes' not found for workflow "
                                           f"#{run_id}."):
        cli("workflow", "artifact", str(run_id), "notes")
    with pytest.raises(CommandError, match="Workflow #999999999 not found."):
        cli("workflow", "artifacts", "999999999")


# -- the REST API -----------------------------------------------------------------------------

def test_api__list_get_put_download_delete(operator, worker, token):
    run_id = written_run(worker, token)
    base = f"{API}/runs/{run_id}/artifacts/"

    listed = operator.get(base)
    assert listed.status_code == 200
    assert [a["key"] for a in listed.json()] == ["blob", "draft", "notes"]
    assert "content" not in listed.json()[0]
    one = operator.get(f"{base}blob/").json()
    assert one["kind"] == "bytes" and base64.b64decode(one["content"]) == b"\x00\x01binary"
    assert operator.get(f"{base}draft/").json()["content"]["title"] == "Pricing brief"

    put = operator.put(f"{base}plan/", {"content": {"steps": [1, 2]}, "metadata": {"v": 1}},
                       format="json")
    assert put.status_code == 200 and put.json()["size"] == len('{"steps":[1,2]}')
    raw = operator.put(f"{base}image/", {"content": base64.b64encode(b"\x89PNG").decode(),
                                         "kind": "bytes"}, format="json")
    assert raw.status_code == 200
    download = operator.get(f"{base}image/download/")
    assert download.status_code == 200 and download.content == b"\x89PNG"
    assert download["Content-Type"] == "application/octet-stream"
    assert f'filename="run-{run_id}-image"' in download["Content-Disposition"]
    assert operator.get(f"{base}notes/download/")["Content-Type"].startswith("text/markdown")

    assert operator.delete(f"{base}plan/").status_code == 204
    missing = operator.get(f"{base}plan/")
    assert (missing.status_code, missing.json()["code"]) == (404, "artifact_not_found")


def test_api__bad_writes_and_access(operator, worker, token):
    run_id = written_run(worker, token)
    base = f"{API}/runs/{run_id}/artifacts/"

    bad_kind = operator.put(f"{base}x/", {"content": "y", "kind": "yaml"}, format="json")
    assert bad_kind.status_code == 400
    wrong = operator.put(f"{base}x/", {"content": 5, "kind": "text"}, format="json")
    assert (wrong.status_code, wrong.json()["code"]) == (400, "invalid_artifact")
    assert "needs a string" in wrong.json()["detail"]
    with override_settings(QUEUETY={**TEST_QUEUETY, "MAX_ARTIFACT_BYTES": 10}):
        big = operator.put(f"{base}x/", {"content": "x" * 11, "kind": "text"}, format="json")
    assert (big.status_code, big.json()["code"]) == (413, "artifact_too_large")
    assert not Artifact.objects.filter(run_id=run_id, key="x").exists()
    assert operator.get(f"{API}/runs/999999999/artifacts/").status_code == 404

    reader = APIClient()
    reader.force_authenticate(make_user("view_workflowrun"))
    assert reader.get(base).status_code == 200
    assert reader.put(f"{base}x/", {"content": 1}, format="json").status_code == 403
    assert reader.delete(f"{base}draft/").status_code == 403
    # An approver answers the run; writing its artifacts is operating it.
    approver = APIClient()
    approver.force_authenticate(make_user("view_workflowrun", "signal_workflowrun"))
    assert approver.put(f"{base}x/", {"content": 1}, format="json").status_code == 403
    assert approver.delete(f"{base}draft/").status_code == 403
    stranger = APIClient()
    stranger.force_authenticate(make_user())
    assert stranger.get(base).status_code == 403
    assert stranger.get(f"{base}draft/download/").status_code == 403


# -- export and replay ------------------------------------------------------------------------

def test_export_format_2__carries_artifacts_and_replay_copies_them(worker, token):
    run_id = written_run(worker, token)
    document = json.loads(json.dumps(queuety.export_workflow(run_id)))

    assert document["format_version"] == 2
    assert [(a["key"], a["kind"]) for a in document["artifacts"]] == [
        ("blob", "bytes"), ("draft", "json"), ("notes", "markdown")]
    assert document["artifacts"][0]["content"] == base64.b64encode(b"\x00\x01binary").decode()
    assert document["chunks"] == []

    new = queuety.replay_workflow(document)
    assert queuety.artifact(new, "blob")["content"] == b"\x00\x01binary"
    assert queuety.artifact(new, "draft")["content"]["title"] == "Pricing brief"
    assert queuety.artifact(new, "draft")["step_name"] == "write_artifacts"
    assert queuety.workflow_status(new).artifact_keys == ["blob", "draft", "notes"]


def test_replay__still_reads_format_1_and_refuses_a_bad_artifact(worker, token):
    run_id = written_run(worker, token)
    document = json.loads(json.dumps(queuety.export_workflow(run_id)))
    version_1 = {k: v for k, v in document.items() if k not in ("artifacts", "chunks")}
    version_1["format_version"] = 1
    new = queuety.replay_workflow(version_1)
    assert queuety.workflow_status(new).status == "completed"
    assert queuety.artifacts(new) == []

    document["artifacts"][1]["kind"] = "bytes"  # JSON content is not base64 text
    before = queuety.list_workflows(limit=1)[0].id
    with pytest.raises(queuety.WorkflowDefinitionError, match="artifact 1 \\('draft'\\)"):
        queuety.replay_workflow(document)
    assert queuety.list_workflows(limit=1)[0].id == before


# -- the admin --------------------------------------------------------------------------------

def test_admin_run_page__lists_artifacts_with_downloads_without_loading_content(worker, token):
    run_id = written_run(worker, token)
    secret_body = "A" * 5000 + "never-on-the-page"
    queuety.put_artifact(run_id, "transcript", secret_body, "text")
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))

    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/admin/queuety/workflowrun/{run_id}/change/")
    assert page.status_code == 200
    artifact_reads = [q["sql"] for q in queries.captured_queries
                      if 'FROM "queuety_artifact"' in q["sql"]]
    assert artifact_reads and not any('"queuety_artifact"."content"' in sql
                                      for sql in artifact_reads)
    html = page.content.decode()
    assert 'id="artifacts"' in html and "Artifacts <span" in html
    for key in ("blob", "draft", "notes", "transcript"):
        assert f"/admin/queuety/workflowrun/{run_id}/artifacts/{key}/" in html
    assert "never-on-the-page" not in html and "4.9\xa0KB" in html

    download = client.get(f"/admin/queuety/workflowrun/{run_id}/artifacts/transcript/")
    assert download.status_code == 200 and download.content.decode() == secret_body
    assert client.get(f"/admin/queuety/workflowrun/{run_id}/artifacts/nope/").status_code \
        == 404
    viewer_less = Client()
    viewer_less.force_login(make_user(is_staff=True))
    assert viewer_less.get(
        f"/admin/queuety/workflowrun/{run_id}/artifacts/transcript/").status_code == 403


def test_an_outside_write_racing_an_attempts_publish_of_the_same_key_loses_neither(token):
    # An outside put_artifact of a new key holds its transaction open while the attempt that
    # wrote the same key records its outcome: the publish waits for it, then replaces it
    # (before, it met the outside row in the key's unique index and the outcome failed).
    import threading
    import time

    from django.db import transaction

    from queuety import publish
    from queuety.core.artifacts import encode
    from queuety.runtime import artifacts
    from queuety.runtime.claim import claim

    flow = queuety.workflow(f"art_race_{token}").then(workflows.step_a)
    with publish.captured() as sent:
        run_id = flow.dispatch({"token": token})
    held = claim(sent[0].step_run_id)
    artifacts.write_pending(held, "step_a", encode("report", {"by": "attempt"}, limit=10_000))
    outside_wrote = threading.Event()

    def outside():
        try:
            with transaction.atomic():
                artifacts.write_visible(run_id, encode("report", {"by": "outside"}, limit=10_000))
                outside_wrote.set()
                time.sleep(1.0)  # still uncommitted while the attempt publishes
        finally:
            connection.close()

    thread = threading.Thread(target=outside)
    thread.start()
    assert outside_wrote.wait(10)
    with transaction.atomic():
        assert artifacts.publish(held) == 1
    thread.join()
    assert queuety.artifact(run_id, "report")["content"] == {"by": "attempt"}
    assert Artifact.objects.filter(run_id=run_id, key="report").count() == 1
    queuety.cancel(run_id)
