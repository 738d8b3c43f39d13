"""Retention with archives (queuety.retention, queuety.archive): per workflow and status,
archived as JSON Lines into a Django storage before the delete, brought back by
``archive import``; purged keys are tombstones that refuse a second dispatch."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import F
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety import archive, exceptions, retention
from queuety import export as exports
from queuety.conf import retention as retention_rules
from queuety.models import DispatchKey, Event, StepRun, WorkflowRun
from queuety.runtime import sweeper
from tests import workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker

#: An instant well in the past, the same UTC day for every run a test ages to it.
NOW = timezone.now()


def retained(tmp_path, rules, archive_to: str | None = "archive"):
    """The settings of a site with ``rules`` and (by default) a filesystem archive in
    ``tmp_path``."""
    storages = {**django_settings.STORAGES, "archive": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path)}}}
    return override_settings(STORAGES=storages, QUEUETY={
        **TEST_QUEUETY, "RETENTION": rules, "ARCHIVE_STORAGE": archive_to})


def finished(worker, name, token, fail=False, key=None) -> int:
    builder = queuety.workflow(name).then(workflows.boom if fail else workflows.step_a)
    if key:
        builder = builder.idempotency_key(key)
    run_id = builder.dispatch({"token": token})
    assert wait_for(run_id, worker=worker).status == ("failed" if fail else "completed")
    return run_id


def age(run_id, days, hour=12):
    """Say the run finished ``days`` ago (at ``hour`` UTC, so runs aged alike share a day)."""
    when = (NOW - timedelta(days=days)).astimezone(UTC).replace(hour=hour, minute=0)
    WorkflowRun.objects.filter(pk=run_id).update(finished_at=when)
    return when


def cli(*args) -> str:
    out = StringIO()
    call_command("queuety", *args, stdout=out)
    return out.getvalue()


def archived(tmp_path) -> dict[str, list[dict]]:
    """Every archive object under ``tmp_path``: its name, and its documents."""
    return {str(path.relative_to(tmp_path)): [json.loads(line) for line in
                                              path.read_text().splitlines()]
            for path in sorted(tmp_path.rglob("*.jsonl"))}


def in_folder(objects, folder) -> list[str]:
    return [object_name for object_name in objects if object_name.startswith(folder + "/")]


def exists(*run_ids) -> list[bool]:
    present = set(WorkflowRun.objects.filter(pk__in=run_ids).values_list("pk", flat=True))
    return [run_id in present for run_id in run_ids]


def test_rules__per_workflow_and_status_and_the_dry_run_changes_nothing(worker, token,
                                                                         tmp_path):
    a, b = f"ret_a_{token}", f"ret_b_{token}"
    a_done_old, a_done_new = finished(worker, a, token), finished(worker, a, token)
    a_failed_mid, a_failed_old = (finished(worker, a, token, fail=True),
                                  finished(worker, a, token, fail=True))
    b_old, b_new = finished(worker, b, token), finished(worker, b, token)
    for run_id, days in ((a_done_old, 10), (a_done_new, 3), (a_failed_mid, 10),
                         (a_failed_old, 100), (b_old, 40), (b_new, 20)):
        age(run_id, days)
    rules = {"default": "30d", a: {"completed": "7d", "failed": "90d"}}

    with retained(tmp_path, rules):
        planned = retention.plan()
        text = cli("purge", "--dry-run")
        assert {k: n for k, n in planned.counts.items() if k[0] in (a, b)} == {
            (a, "completed"): 1, (a, "failed"): 1, (b, "completed"): 1}
        assert f"{a}  completed: 1" in text and f"{a}  failed: 1" in text
        assert f"{b}  completed: 1" in text and "Would archive and delete" in text
        assert all(exists(a_done_old, a_failed_old, b_old)) and archived(tmp_path) == {}

        out = json.loads(cli("purge", "--format", "json"))

    assert exists(a_done_old, a_done_new, a_failed_mid, a_failed_old, b_old, b_new) == [
        False, True, True, False, False, True]
    assert not Event.objects.filter(run_id__in=(a_done_old, a_failed_old, b_old)).exists()
    assert not StepRun.objects.filter(run_id__in=(a_done_old, a_failed_old, b_old)).exists()
    mine = {(r["workflow"], r["status"]): r["count"] for r in out["runs"]
            if r["workflow"] in (a, b)}
    assert mine == {(a, "completed"): 1, (a, "failed"): 1, (b, "completed"): 1}
    ids = {doc["run"]["id"] for docs in archived(tmp_path).values() for doc in docs}
    assert {a_done_old, a_failed_old, b_old} <= ids


def test_archive__one_jsonl_object_per_workflow_and_day_then_import_brings_the_run_back(
        worker, token, tmp_path):
    name = f"ret_day_{token}"
    first, second, other_day = (finished(worker, name, token) for _ in range(3))
    day = age(first, 10, hour=3).date()
    age(second, 10, hour=20)
    age(other_day, 11)
    before = exports.export(first)

    with retained(tmp_path, {name: "7d"}):
        report = retention.purge()

    objects = archived(tmp_path)
    [same_day] = in_folder(objects, archive.day_folder(name, day))
    [day_before] = in_folder(objects, archive.day_folder(name, day - timedelta(days=1)))
    assert same_day in report.objects and same_day.endswith(".jsonl")
    assert same_day.split("/")[-1].startswith(f"{first}-{second}-")
    assert [d["run"]["id"] for d in objects[same_day]] == [first, second]
    assert [d["run"]["id"] for d in objects[day_before]] == [other_day]
    document = objects[same_day][0]
    assert document["format_version"] == 2 and document["run"]["status"] == "completed"
    assert document["events"] == before["events"] and document["steps"] == before["steps"]
    assert not any(exists(first, second, other_day))

    with retained(tmp_path, {name: "7d"}):
        text = cli("archive", "import", same_day)  # an object name in the archive storage
        again = cli("archive", "import", str(tmp_path / same_day))  # a local file
        assert retention.purge().counts.get((name, "completed")) is None  # kept: restored
    assert f"Restored run #{first}" in text and "2 runs restored, 0 skipped" in text
    assert f"Skipped run #{first}: a run with that id exists." in again
    restored = exports.export(first)
    assert restored["run"]["status"] == "completed"
    assert restored["run"]["finished_at"] == before["run"]["finished_at"]
    assert restored["events"][:-1] == before["events"]  # the same ids, kinds, data and times
    assert restored["events"][-1]["kind"] == "run_restored"
    assert [s["id"] for s in restored["steps"]] == [s["id"] for s in before["steps"]]


def test_archive__a_restored_run_is_kept_a_full_retention_from_its_import(worker, token,
                                                                          tmp_path):
    name = f"ret_back_{token}"
    run_id = finished(worker, name, token)
    age(run_id, 10)
    with retained(tmp_path, {name: "7d"}):
        retention.purge()
        [object_name] = archived(tmp_path)
        cli("archive", "import", object_name)
        assert retention.plan().counts.get((name, "completed")) is None
        retention.purge()
        assert exists(run_id) == [True]
        later = timezone.now() + timedelta(days=8)
        assert retention.plan(later).counts[(name, "completed")] == 1


def test_archive__a_crash_between_the_write_and_the_delete_loses_nothing(worker, token,
                                                                         tmp_path):
    name = f"ret_crash_{token}"
    runs = [finished(worker, name, token) for _ in range(2)]
    age(runs[0], 10)
    age(runs[1], 10)
    with retained(tmp_path, {name: "7d"}):
        # A real pass, stopped where a crash would stop it: its object written, no delete.
        rules = retention_rules()
        chosen = retention.select_batch(rules, timezone.now(), retention.BATCH)
        assert chosen.ids == runs
        retention.fingerprints(chosen.ids)
        written = archive.write_batch(archive.archive_storage(), chosen.workflow, chosen.day,
                                      [exports.export(run_id) for run_id in chosen.ids])
        assert all(exists(*runs))
        report = retention.purge()
        [again] = report.objects
        assert again != written  # a new object beside the first: nothing is overwritten
        objects = archived(tmp_path)
        assert sorted(objects) == sorted([written, again])
        assert [d["run"]["id"] for d in objects[written]] == runs == [
            d["run"]["id"] for d in objects[again]]
        assert not any(exists(*runs))
        text = cli("archive", "import", written) + cli("archive", "import", again)
    assert "2 runs restored, 0 skipped" in text and "0 runs restored, 2 skipped" in text
    assert all(exists(*runs))


def test_archive__a_run_the_delete_skipped_is_archived_again_without_touching_the_first_object(
        worker, token, tmp_path, no_sweeps):
    name = f"ret_skip_{token}"
    runs = [finished(worker, name, token) for _ in range(3)]
    for run_id in runs:
        age(run_id, 10)
    locked, release = threading.Event(), threading.Event()

    def hold_first_run():
        try:
            with transaction.atomic():
                WorkflowRun.objects.select_for_update().get(pk=runs[0])
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_first_run)
    holder.start()
    try:
        assert locked.wait(30)
        with retained(tmp_path, {name: "7d"}):
            first = retention.purge()
    finally:
        release.set()
        holder.join()
    assert first.counts == {(name, "completed"): 2} and exists(*runs) == [True, False, False]
    with retained(tmp_path, {name: "7d"}):
        second = retention.purge()
    assert second.counts == {(name, "completed"): 1} and not any(exists(*runs))
    objects = archived(tmp_path)
    assert [d["run"]["id"] for d in objects[first.objects[0]]] == runs  # still whole
    assert [d["run"]["id"] for d in objects[second.objects[0]]] == [runs[0]]


def test_delete__a_run_changed_after_its_export_is_kept_for_the_next_pass(worker, token,
                                                                         tmp_path, no_sweeps):
    name = f"ret_changed_{token}"
    evented, revised, cancelled, same = (finished(worker, name, token) for _ in range(4))
    for run_id in (evented, revised, cancelled, same):
        age(run_id, 10)
    with retained(tmp_path, {name: "7d"}):
        rules = retention_rules()
        now = timezone.now()
        chosen = retention.select_batch(rules, now, retention.BATCH)
        before = retention.fingerprints(chosen.ids)
        # The window between the export and the delete: an event (a fork's forked_to, an
        # idempotency_conflict), a write to the run row, a live step row again (a cancel's
        # compensation) appear.
        Event.objects.create(run_id=evented, kind="forked_to", data={"run_id": 1})
        WorkflowRun.objects.filter(pk=revised).update(revision=F("revision") + 1)
        step = StepRun.objects.filter(run_id=cancelled).first()
        StepRun.objects.filter(pk=step.pk).update(status="held")
        assert retention.delete_batch(rules, before, now) == {"completed": 1}
        assert exists(evented, revised, cancelled, same) == [True, True, True, False]
        StepRun.objects.filter(pk=step.pk).update(status=step.status)
        assert retention.purge().counts == {(name, "completed"): 3}  # archived, then gone
    assert not any(exists(evented, revised, cancelled))
    kinds = [e["kind"] for docs in archived(tmp_path).values() for d in docs
             if d["run"]["id"] == evented for e in d["events"]]
    assert "forked_to" in kinds


def test_no_archive_storage__purges_without_archive(worker, token, tmp_path):
    name = f"ret_bare_{token}"
    run_id = finished(worker, name, token)
    age(run_id, 2)
    with retained(tmp_path, {name: {"completed": "12h"}}, archive_to=None):
        text = cli("purge")
    assert "Deleted (no ARCHIVE_STORAGE: no archive)" in text and exists(run_id) == [False]
    assert archived(tmp_path) == {}


def test_sweeper_phase__purges_one_batch_per_tick(worker, token, tmp_path):
    name = f"ret_sweep_{token}"
    run_id, other_day = finished(worker, name, token), finished(worker, name, token)
    age(run_id, 10)
    age(other_day, 9)
    with retained(tmp_path, {name: "7d"}):
        assert sweeper.sweep()["purged"] == 1  # one batch: one workflow's day
        assert exists(run_id, other_day) == [False, True]
    run_id = other_day
    with retained(tmp_path, {name: "7d"}):
        assert sweeper.purge_finished() == 1
        assert sweeper.purge_finished() == 0
    assert exists(run_id) == [False] and len(archived(tmp_path)) == 2  # one per day


def test_tombstone__a_purged_key_refuses_a_dispatch_until_its_own_retention(worker, token,
                                                                           tmp_path):
    name, key = f"ret_key_{token}", f"ret-key-{token}"
    run_id = finished(worker, name, token, key=key)
    age(run_id, 10)
    with retained(tmp_path, {name: "7d"}):
        retention.purge()
        tombstone = DispatchKey.objects.get(key=key)
        assert tombstone.run_id == run_id and tombstone.purged_workflow == name
        assert timedelta(days=6) < tombstone.forget_at - timezone.now() <= timedelta(days=7)
        with pytest.raises(exceptions.RunPurged) as refused:
            queuety.workflow(name).idempotency_key(key).then(workflows.step_a).dispatch(
                {"token": token})
        assert f"Idempotency key {key!r} started run {run_id}, of workflow {name!r}" in str(
            refused.value) and "retention purged on" in str(refused.value)
        assert not WorkflowRun.objects.filter(idempotency_key=key).exists()
        assert retention.forget_tombstones(timezone.now() + timedelta(days=8)) >= 1
    assert not DispatchKey.objects.filter(key=key).exists()
    fresh = finished(worker, name, token, key=key)  # forgotten: the key starts a new run
    assert fresh != run_id


def test_tombstone__rest_answers_409_run_purged(worker, token, tmp_path):
    from django.contrib.auth.models import User

    key = f"ret-rest-{uuid.uuid4().hex}"
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser(f"r{uuid.uuid4().hex[:10]}"))
    body = {"workflow": "reg_letters", "payload": {"token": token}, "idempotency_key": key}
    started = client.post("/queuety/api/runs/", body, format="json")
    assert started.status_code == 201, started.content
    run_id = started.json()["run"]["id"]
    wait_for(run_id, worker=worker)
    age(run_id, 400)
    with retained(tmp_path, {"reg_letters": "365d"}):
        retention.purge()
        again = client.post("/queuety/api/runs/", body, format="json")
    assert again.status_code == 409 and again.json()["code"] == "run_purged"
    assert again.json()["key"] == key and "reg_letters" in again.json()["detail"]
    # With tenants the purged run cannot be checked against the scope: the same code, and a
    # body naming no run, no workflow and no date.
    with override_settings(QUEUETY={**TEST_QUEUETY, "RUN_SCOPE": "tests.workflows.tenant_scope"}):
        hidden = client.post("/queuety/api/runs/", body, format="json")
    assert hidden.status_code == 409 and hidden.json()["code"] == "run_purged"
    assert hidden.json()["key"] == key and "purged_at" not in hidden.json()
    assert "reg_letters" not in hidden.json()["detail"] and str(run_id) not in str(
        {k: v for k, v in hidden.json().items() if k != "key"})


def test_import__a_missing_object_is_refused_by_name(tmp_path):
    with retained(tmp_path, {}), pytest.raises(Exception, match="is neither a local file nor "
                                               "an object of storage 'archive'"):
        cli("archive", "import", "queuety/archive/none/2026-01-01/1.jsonl")


def test_unique_job__retention_frees_its_key_with_it(worker, token, tmp_path):
    from tests import job_tasks

    first = job_tasks.charge_once.enqueue(token, 11)
    wait_for(int(first.id), worker=worker)
    age(int(first.id), 2)
    with retained(tmp_path, {"task:tests.job_tasks.charge_once": "1d"}):
        assert retention.purge().counts[("task:tests.job_tasks.charge_once", "completed")] >= 1
    assert exists(int(first.id)) == [False]
    assert not DispatchKey.objects.filter(run_id=int(first.id)).exists()  # no tombstone

    again = job_tasks.charge_once.enqueue(token, 11)  # a new job, not RunPurged

    assert again.id != first.id
    assert wait_for(int(again.id), worker=worker).status == "completed"


def test_a_run_whose_starter_is_live__is_kept_past_its_retention(worker, token, tmp_path):
    parent_name, child_name = f"ret_parent_{token}", f"ret_child_{token}"
    child = queuety.workflow(child_name).then(workflows.step_a)
    parent_id = (queuety.workflow(parent_name).start_workflows("items", child, name=child_name)
                 .wait_for_signal("go").dispatch({"token": token, "items": [{"n": 1}]}))
    wait_for(parent_id, statuses=("waiting_for_signal",), worker=worker)
    [child_id] = WorkflowRun.objects.filter(started_by_id=parent_id).values_list("pk", flat=True)
    wait_for(child_id, worker=worker)
    age(child_id, 10)
    with retained(tmp_path, {child_name: "7d", parent_name: "7d"}):
        assert retention.plan().counts.get((child_name, "completed")) is None
        retention.purge()
        assert exists(child_id) == [True]  # its starter is live: kept
        queuety.cancel(parent_id)
        age(parent_id, 10)
        retention.purge()
    assert exists(parent_id, child_id) == [False, False]


def test_reuse__a_key_whose_run_is_gone_without_a_tombstone_is_purged(worker, token):
    # A key whose run was purged before tombstones existed (or deleted by hand): no
    # migration marks it; the reuse check does.
    hashes = {"payload_hash": "0" * 64, "definition_hash": "0" * 64}
    DispatchKey.objects.create(key=f"legacy-{token}", run_id=2**62, **hashes)
    with pytest.raises(exceptions.RunPurged, match=rf"started run {2**62}, which no longer "
                                                   "exists; nothing was dispatched"):
        queuety.workflow(f"ret_legacy_{token}").idempotency_key(f"legacy-{token}").then(
            workflows.step_a).dispatch({"token": token})
    assert not WorkflowRun.objects.filter(idempotency_key=f"legacy-{token}").exists()


def test_tombstone__purging_an_old_run_leaves_a_newer_runs_key_alone(worker, token, tmp_path):
    # A unique job's key taken by a newer job after unique_for, and a plain key forgotten
    # and taken again before the old run came back from the archive: both name the new run.
    name = f"ret_reused_{token}"
    job_key, plain_key = f"job:tests.reuse:{token}", f"ret-reused-{token}"
    old_job = finished(worker, name, token, key=job_key)
    old_plain = finished(worker, name, token, key=plain_key)
    new_job, new_plain = finished(worker, name, token), finished(worker, name, token)
    DispatchKey.objects.filter(key=job_key).update(run_id=new_job)
    DispatchKey.objects.filter(key=plain_key).update(run_id=new_plain)
    age(old_job, 10)
    age(old_plain, 10)
    with retained(tmp_path, {name: {"completed": "7d"}}):
        assert retention.purge().counts == {(name, "completed"): 2}
    assert exists(old_job, old_plain, new_job, new_plain) == [False, False, True, True]
    job, plain = DispatchKey.objects.get(key=job_key), DispatchKey.objects.get(key=plain_key)
    assert (job.run_id, job.purged_at) == (new_job, None)
    assert (plain.run_id, plain.purged_at, plain.forget_at) == (new_plain, None, None)


def test_one_pass_at_a_time__a_second_purge_is_refused_while_one_holds_the_lock(
        worker, token, tmp_path):
    name = f"ret_lock_{token}"
    run_id = finished(worker, name, token)
    age(run_id, 10)
    held, release = threading.Event(), threading.Event()

    def other_pass():  # what a running pass holds, on a connection of its own
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s)", [retention.LOCK_ID])
                held.set()
                release.wait(30)
                cursor.execute("SELECT pg_advisory_unlock(%s)", [retention.LOCK_ID])
        finally:
            connection.close()

    holder = threading.Thread(target=other_pass)
    holder.start()
    try:
        assert held.wait(30)
        with retained(tmp_path, {name: "7d"}):
            with pytest.raises(exceptions.PurgeRunning):
                retention.purge()
            assert sweeper.purge_finished() == 0  # the sweeper skips its phase
            with pytest.raises(Exception, match="Another purge pass is running"):
                cli("purge")
            assert exists(run_id) == [True] and archived(tmp_path) == {}
    finally:
        release.set()
        holder.join()
    with retained(tmp_path, {name: "7d"}):
        assert retention.purge().counts == {(name, "completed"): 1}


def test_admin_start__a_purged_key_is_a_form_error(admin_client, token):
    key = f"ret-admin-{token}"
    DispatchKey.objects.create(key=key, run_id=2**61, payload_hash="0" * 64,
                               definition_hash="0" * 64, purged_at=timezone.now(),
                               purged_workflow="reg_letters")
    page = admin_client.post("/admin/queuety/workflowrun/start/reg_letters/", {
        "payload": json.dumps({"token": token}), "idempotency_key": key})
    assert page.status_code == 400
    assert "which retention purged on" in page.content.decode()
    with override_settings(QUEUETY={**TEST_QUEUETY, "RUN_SCOPE": "tests.workflows.tenant_scope"}):
        hidden = admin_client.post("/admin/queuety/workflowrun/start/reg_letters/", {
            "payload": json.dumps({"token": token}), "idempotency_key": key})
    assert hidden.status_code == 400 and "retention has purged" in hidden.content.decode()
    assert str(2**61) not in hidden.content.decode()
    assert not WorkflowRun.objects.filter(idempotency_key=key).exists()


def test_trigger__a_key_whose_run_was_purged_starts_nothing_and_the_save_goes_through(
        worker, token, tmp_path):
    from queuety.triggers import declare
    from tests.testapp.models import Article

    workflow = f"ret_trig_{token}"
    trigger = queuety.trigger(
        Article, on="saved", name=f"ret-{token}", key=lambda a: f"ret-trig-{a.pk}",
        when=lambda a: a.token == token,
        start=queuety.workflow(workflow).then(workflows.step_a))
    try:
        article = Article.objects.create(token=token)
        [run] = WorkflowRun.objects.filter(name=workflow)
        wait_for(run.pk, worker=worker)
        age(run.pk, 10)
        with retained(tmp_path, {workflow: "7d"}):
            assert retention.purge().total == 1
        article.title = "saved again"
        article.save()  # before: TriggerFailed (RunPurged) until the tombstone expired
    finally:
        declare.forget(trigger.name)
    assert Article.objects.get(pk=article.pk).title == "saved again"
    assert not WorkflowRun.objects.filter(name=workflow).exists()  # no second run
    assert DispatchKey.objects.get(run_id=run.pk).purged_at is not None  # the tombstone


def test_import__restores_cleanup_signals_and_sequences_and_reports_a_bad_run_by_line(
        worker, token, tmp_path):
    from queuety.models import Signal

    name = f"ret_imp_{token}"
    run_id, other = finished(worker, name, token, fail=True), finished(worker, name, token)
    plan = {"cause": "failed", "queue": [], "next": 0}
    WorkflowRun.objects.filter(pk=run_id).update(cleanup=plan)
    signal = Signal.objects.create(run_id=run_id, name="go", payload={"n": 1},
                                   dedupe_key=f"ret-dedupe-{token}")
    for each in (run_id, other):
        age(each, 10)
    with retained(tmp_path, {name: "7d"}):
        [written] = retention.purge().objects
    documents = archived(tmp_path)[written]
    assert [d["run"]["id"] for d in documents] == [run_id, other]
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(documents[0]) + "\n"
                      + json.dumps({**documents[1], "steps": "not a list"}) + "\n")
    with connection.cursor() as cursor:  # a younger database: the sequence behind the ids
        cursor.execute("SELECT setval(pg_get_serial_sequence('queuety_signal', 'id'), 1)")
    out = StringIO()
    with retained(tmp_path, {name: "7d"}), pytest.raises(Exception, match=r"1 run restored, "
                                                         "0 skipped, 1 failed"):
        call_command("queuety", "archive", "import", str(broken), stdout=out)
    assert f"Restored run #{run_id}" in out.getvalue()
    assert f"Failed line 2 (run #{other}): " in out.getvalue()
    assert exists(run_id, other) == [True, False]
    back = WorkflowRun.objects.get(pk=run_id)
    assert back.cleanup == plan  # its compensations are not queued a second time
    restored = Signal.objects.get(run_id=run_id)
    assert (restored.pk, restored.dedupe_key) == (signal.pk, f"ret-dedupe-{token}")
    fresh = Signal.objects.create(run_id=run_id, name="later")
    assert fresh.pk > signal.pk
