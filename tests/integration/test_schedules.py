"""Schedules on django-celery-beat: rows, fires keyed by their tick, overlap policies, the CLI,
and beat itself firing them, against PostgreSQL and a real worker (with its embedded beat)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from io import StringIO
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

import queuety
from queuety import schedules
from queuety.models import WorkflowRun
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

UTC = timezone.utc


def runs_of(name: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(
        idempotency_key__startswith=schedules.key_prefix(name)).order_by("pk"))


def row_count() -> tuple[int, int, int]:
    return (PeriodicTask.objects.count(), CrontabSchedule.objects.count(),
            IntervalSchedule.objects.count())


def test_schedule__is_a_periodic_task_row_updated_in_place(name, token):
    saved = queuety.schedule(name, workflow="reg_letters", cron="0 3 * * *",
                             payload={"token": token}, overlap="skip",
                             timezone="Europe/Paris")
    task = PeriodicTask.objects.get(name=f"queuety: {name}")
    assert task.task == "queuety.fire_schedule" and task.enabled
    assert (task.crontab.minute, task.crontab.hour, str(task.crontab.timezone)) == \
        ("0", "3", "Europe/Paris")
    assert json.loads(task.kwargs) == {"schedule": name, "workflow": "reg_letters",
                                       "payload": {"token": token}, "overlap": "skip"}
    assert saved.cron == "0 3 * * *" and saved.overlap == "skip"

    again = queuety.schedule(name, workflow="reg_letters", every=timedelta(minutes=5))
    task = PeriodicTask.objects.get(name=f"queuety: {name}")  # the same row, changed
    assert task.crontab is None and (task.interval.every, task.interval.period) == \
        (300, "seconds")
    assert again.every == 300 and again.overlap == "allow" and again.payload == {}
    assert [each.name for each in schedules.schedules()].count(name) == 1


def test_schedule__is_listed_in_the_beat_admin(name):
    queuety.schedule(name, workflow="reg_letters", every=60)
    admin = Client()
    admin.force_login(User.objects.create_superuser(f"su{uuid.uuid4().hex[:8]}", "", "pw"))
    page = admin.get("/admin/django_celery_beat/periodictask/")
    assert page.status_code == 200 and f"queuety: {name}".encode() in page.content


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"workflow": "reg_letters", "cron": "61 * * * *"}, queuety.InvalidSchedule,
     "not valid"),
    ({"workflow": "reg_letters", "cron": "0 3 * *"}, queuety.InvalidSchedule, "five fields"),
    ({"workflow": "reg_letters", "cron": "0 3 * * *", "timezone": "Mars/Olympus"},
     queuety.InvalidSchedule, "time zone"),
    ({"workflow": "reg_letters", "every": 60, "overlap": "queue"}, queuety.InvalidSchedule,
     "unknown overlap policy 'queue'"),
    ({"workflow": "reg_letters"}, queuety.InvalidSchedule, "exactly one of"),
    ({"workflow": "reg_letters", "cron": "* * * * *", "every": 5}, queuety.InvalidSchedule,
     "exactly one of"),
    ({"workflow": "reg_letters", "every": timedelta(milliseconds=500)},
     queuety.InvalidSchedule, "whole number of seconds"),
    ({"workflow": "reg_nope", "every": 60}, queuety.UnknownWorkflow, "reg_letters"),
    ({"workflow": "reg_letters", "every": 60, "payload": [1]}, queuety.InvalidPayload,
     "must be a dict"),
    ({"workflow": "reg_small", "every": 60, "payload": {"blob": "x" * 500}},
     queuety.BudgetExceeded, "max_state_bytes"),
])
def test_schedule__bad_input_is_a_clear_error_and_writes_nothing(name, kwargs, error, message):
    before = row_count()
    with pytest.raises(error, match=message):
        queuety.schedule(name, **kwargs)
    assert row_count() == before
    assert not PeriodicTask.objects.filter(name__endswith=name).exists()


def test_fire__a_double_fire_of_one_tick_starts_one_run(name, worker, token):
    queuety.schedule(name, workflow="reg_letters", cron="*/10 * * * *",
                     payload={"token": token})
    tick = datetime(2026, 12, 1, 10, 10, tzinfo=UTC)
    first = schedules.fire(name, now=tick + timedelta(seconds=1))
    again = schedules.fire(name, now=tick + timedelta(minutes=3))  # a beat restart, late
    assert first.outcome == "started" and again.outcome == "already_started"
    assert again.run_id == first.run_id
    assert first.key == f"queuety-schedule:{name}:2026-12-01T10:10:00+00:00"
    following = schedules.fire(name, now=tick + timedelta(minutes=10, seconds=2))
    assert following.outcome == "started" and following.run_id != first.run_id
    assert [run.pk for run in runs_of(name)] == [first.run_id, following.run_id]
    assert wait_for(first.run_id, worker=worker).state["log"] == ["a", "b", "c"]


def test_fire__skip_starts_nothing_while_the_previous_run_is_live(name, worker, token):
    queuety.schedule(name, workflow="reg_approval", every=60, payload={"token": token},
                     overlap="skip")
    start = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    first = schedules.fire(name, now=start)
    wait_for(first.run_id, ("waiting_for_signal",), worker=worker)
    skipped = schedules.fire(name, now=start + timedelta(minutes=1))
    assert skipped.outcome == "skipped" and skipped.waiting_for == first.run_id
    assert len(runs_of(name)) == 1
    queuety.approve(first.run_id)
    wait_for(first.run_id, worker=worker)
    third = schedules.fire(name, now=start + timedelta(minutes=2))
    assert third.outcome == "started" and len(runs_of(name)) == 2


def test_fire__buffer_starts_one_run_once_the_previous_finishes(name, worker, token):
    queuety.schedule(name, workflow="reg_approval", every=60, payload={"token": token},
                     overlap="buffer")
    first = schedules.fire_and_follow(name)
    wait_for(first.run_id, ("waiting_for_signal",), worker=worker)
    # Two more ticks while it waits: both are buffered behind it, and the worker looks again
    # every SWEEP_INTERVAL.
    for _ in range(3):
        buffered = schedules.fire_and_follow(name, manual=True)
        assert buffered.outcome == "buffered" and buffered.waiting_for == first.run_id
    seen = len(worker.log())
    time.sleep(4)
    assert len(runs_of(name)) == 1  # nothing starts while it is live
    # One follow-up looks again each SWEEP_INTERVAL (1 s here), not one per buffered tick:
    # a per-minute schedule behind a run waiting a day would otherwise send 1,440 of them.
    looks = worker.log()[seen:].count("queuety.fire_schedule[")
    assert 2 <= looks <= 14, worker.log()[seen:][-3000:]  # "received" and "succeeded" each
    queuety.approve(first.run_id)
    wait_for(first.run_id, worker=worker)
    deadline = time.monotonic() + 30
    while len(runs_of(name)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.5)  # both buffered fires have looked again by now
    runs = runs_of(name)
    assert len(runs) == 2, worker.log()[-3000:]
    assert runs[1].idempotency_key == f"queuety-schedule:{name}:after:{first.run_id}"


def test_beat__fires_an_interval_schedule_one_run_per_tick(name, worker, token):
    queuety.schedule(name, workflow="reg_letters", every=1, payload={"token": token})
    deadline = time.monotonic() + 45
    while len(runs_of(name)) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    schedules.remove(name)
    runs = runs_of(name)
    assert len(runs) >= 3, worker.log()[-3000:]
    keys = [run.idempotency_key for run in runs]
    assert len(set(keys)) == len(keys)
    for run in runs:
        assert wait_for(run.pk, worker=worker).state["log"] == ["a", "b", "c"]


# -- manage.py queuety schedule ... ------------------------------------------------------------

def cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", "schedule", *args, stdout=out)
    return out.getvalue()


def test_cli__add_list_run_remove(name, worker, token):
    said = cli("add", name, "--workflow", "reg_letters", "--every", "1 hour",
               "--payload", json.dumps({"token": token}), "--overlap", "skip")
    assert said.strip() == (f"Success: schedule '{name}' saved: workflow 'reg_letters', "
                            "every 3600s, overlap skip.")
    row = next(line for line in cli("list").splitlines() if line.startswith(name))
    assert row.split()[:5] == [name, "reg_letters", "every", "3600s", "skip"]
    listed = {s["name"]: s for s in json.loads(cli("list", "--format", "json"))}
    assert listed[name]["payload"] == {"token": token}

    fired = cli("run", name)
    assert fired.startswith(f"Success: schedule '{name}' dispatched workflow #")
    run_id = int(fired.split("#")[1].rstrip(".\n"))
    assert cli("run", name).strip() == \
        f"Schedule '{name}': this tick already started workflow #{run_id}."
    wait_for(run_id, worker=worker)

    assert cli("remove", name).strip() == f"Success: schedule '{name}' removed."
    assert not PeriodicTask.objects.filter(name=f"queuety: {name}").exists()
    with pytest.raises(CommandError, match=f"There is no schedule '{name}'"):
        cli("remove", name)


@pytest.mark.parametrize(("args", "message"), [
    (["--cron", "0 25 * * *"], "not valid"),
    (["--every", "soon"], "not one Queuety reads"),
    (["--every", "60", "--overlap", "later"], "unknown overlap policy"),
    (["--every", "60", "--payload", "[1]"], "must be a JSON object"),
    (["--every", "60", "--workflow", "reg_nope"], "No workflow is registered"),
])
def test_cli__add_refuses_bad_input_and_writes_nothing(name, args, message):
    before = row_count()
    with pytest.raises(CommandError, match=message):
        cli("add", name, *(["--workflow", "reg_letters"] if "--workflow" not in args else []),
            *args)
    assert row_count() == before


def test_fire__a_fire_that_waited_in_the_broker_starts_the_run_of_the_tick_it_was_sent_for(
        name, worker, token):
    # Beat sent this fire 90 s ago (its header says so); the worker took it only now, a
    # minute slot or two later. It is the run of its own tick, not of the present one, which
    # beat's next fire will start.
    from project.celery import app

    queuety.schedule(name, workflow="reg_letters", every=60, payload={"token": token},
                     enabled=False)
    sent = datetime.now(timezone.utc) - timedelta(seconds=90)
    app.send_task(schedules.FIRE_TASK, kwargs={"schedule": name}, queue=worker.queue,
                  headers={schedules.SENT_AT_HEADER: sent.timestamp()})
    deadline = time.monotonic() + 30
    while not runs_of(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    (run,) = runs_of(name)
    slot = schedules.interval_slot(60, sent)
    assert run.idempotency_key == schedules.key_prefix(name) + slot.isoformat()
    now_key = schedules.fire(name).key
    assert now_key != run.idempotency_key
    assert len(runs_of(name)) == 2


def test_fire__a_message_sent_to_fire_a_schedule_carries_when_it_was_sent():
    before = datetime.now(timezone.utc).timestamp()
    headers = {"task": schedules.FIRE_TASK}
    schedules.stamp_sent_at(sender=schedules.FIRE_TASK, headers=headers)
    assert before <= headers[schedules.SENT_AT_HEADER] <= datetime.now(timezone.utc).timestamp()
    other = {"task": "queuety.execute_step"}
    schedules.stamp_sent_at(sender="queuety.execute_step", headers=other)
    assert schedules.SENT_AT_HEADER not in other
    # From a clock that runs ahead, or a header that is not a time: not believed.
    ahead = SimpleNamespace(**{schedules.SENT_AT_HEADER: before + 3600})
    assert schedules.sent_at(ahead) <= datetime.now(timezone.utc)
    assert schedules.sent_at(SimpleNamespace(**{schedules.SENT_AT_HEADER: "soon"})) is None
    assert schedules.sent_at(SimpleNamespace()) is None
