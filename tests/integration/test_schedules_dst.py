"""Schedules across daylight saving time, against PostgreSQL and the session's real worker: the
fire path keyed by the tick (both 02:30s of a fall-back day are one run, the skipped 02:30 of a
spring-forward day is one run), and django-celery-beat's own scheduler driven through each
transition on a simulated clock, its messages sent to the worker for real."""

from __future__ import annotations

import time
import types
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone as django_timezone
from django_celery_beat import schedulers as beat_schedulers
from django_celery_beat import tzcrontab
from django_celery_beat.models import PeriodicTask

import queuety
from queuety import schedules
from queuety.models import WorkflowRun
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

UTC = timezone.utc


def runs_by_key(name: str, since: datetime, until: datetime) -> Counter[str]:
    """The runs schedule ``name`` started for ticks in [since, until), counted by key (a beat
    of real time in the session's worker may start one for today's tick: not counted)."""
    prefix = schedules.key_prefix(name)
    keys = WorkflowRun.objects.filter(idempotency_key__startswith=prefix).values_list(
        "idempotency_key", flat=True)
    return Counter(key.removeprefix(prefix) for key in keys
                   if since <= datetime.fromisoformat(key.removeprefix(prefix)) < until)


def settle(name: str, worker: Any, seen: int, fires: int, since: datetime, until: datetime,
           runs: int) -> Counter[str]:
    """The runs once the worker has taken the ``fires`` messages sent since its log was
    ``seen`` long and started ``runs`` runs (then a moment more, so one too many would show)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
            sum(runs_by_key(name, since, until).values()) < runs
            or worker.log()[seen:].count("queuety.fire_schedule[") < 2 * fires):
        time.sleep(0.3)
    time.sleep(1.5)
    return runs_by_key(name, since, until)


def send_fire(name: str, queue: str, sent: datetime) -> None:
    """A ``queuety.fire_schedule`` message as beat sends it at ``sent``."""
    from project.celery import app

    app.send_task(schedules.FIRE_TASK, kwargs={"schedule": name}, queue=queue,
                  headers={schedules.SENT_AT_HEADER: sent.timestamp()})


BERLIN = ZoneInfo("Europe/Berlin")


def test_fire__one_run_a_day_through_both_transitions_whatever_the_fires(name, worker, token):
    queuety.schedule(name, workflow="reg_letters", cron="30 2 * * *", timezone="Europe/Berlin",
                     payload={"token": token})
    sent = [
        # 28 March, an ordinary day: 02:30 CET.
        datetime(2026, 3, 28, 1, 30, 2, tzinfo=UTC),
        # 29 March: 02:30 does not exist. A beat catching up at 03:10 CEST, beat's own send at
        # 03:30 CEST (it reads 02:30 with the offset before the jump) and a second beat.
        datetime(2026, 3, 29, 1, 10, 2, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30, 2, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30, 9, tzinfo=UTC),
        # 25 October: 02:30 CEST, a fire in the repeated hour (02:10 CET) and 02:30 CET.
        datetime(2026, 10, 25, 0, 30, 2, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 10, 2, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 30, 2, tzinfo=UTC),
        # 26 October, an ordinary day: 02:30 CET.
        datetime(2026, 10, 26, 1, 30, 2, tzinfo=UTC),
    ]
    seen = len(worker.log())
    for moment in sent:
        send_fire(name, worker.queue, moment)
    runs = settle(name, worker, seen, len(sent), datetime(2026, 3, 1, tzinfo=UTC),
                  datetime(2026, 11, 1, tzinfo=UTC), runs=4)
    assert runs == {"2026-03-28T01:30:00+00:00": 1,  # 02:30 CET
                    "2026-03-29T01:00:00+00:00": 1,  # the jump, 03:00 CEST
                    "2026-10-25T00:30:00+00:00": 1,  # the first 02:30, CEST
                    "2026-10-26T01:30:00+00:00": 1}, worker.log()[seen:][-3000:]
    for run in WorkflowRun.objects.filter(idempotency_key__startswith=schedules.key_prefix(name)):
        assert wait_for(run.pk, worker=worker).state["log"] == ["a", "b", "c"]


# -- django-celery-beat's DatabaseScheduler on a simulated clock --------------------------------

class SimulatedClock(datetime):
    """``datetime`` whose ``now()`` is the simulated moment ``at``."""

    at = datetime(2026, 1, 1, tzinfo=UTC)

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return cls.at.astimezone(tz) if tz else cls.at.replace(tzinfo=None)

    @classmethod
    def utcnow(cls) -> Any:
        return cls.at.replace(tzinfo=None)


@pytest.fixture
def simulated_clock(monkeypatch):
    """Beat's clock, and Django's (which stamps a fire's send time), read ``SimulatedClock.at``:
    the modules that read the time (django_celery_beat.schedulers and .tzcrontab, Django's
    timezone.now, Celery's crontab through them) see the simulated moment. Nothing else."""
    monkeypatch.setattr(beat_schedulers, "datetime",
                        types.SimpleNamespace(datetime=SimulatedClock, timedelta=timedelta))
    monkeypatch.setattr(tzcrontab, "datetime", SimulatedClock)
    monkeypatch.setattr(django_timezone, "datetime", SimulatedClock)
    return SimulatedClock


def simulated_beat(task_name: str, start: datetime, hours: int) -> list[datetime]:
    """Run django-celery-beat's DatabaseScheduler from ``start`` for ``hours`` simulated hours,
    waking when its ``tick()`` asks (at most every minute, as beat's loop sleeps), and return
    when it sent ``task_name``'s message (really sent, to the broker and the worker).

    Two things differ from ``celery beat``: the scheduler sees only ``task_name``'s row, and
    it keeps its rows' last-run times in memory instead of in the table, so the session's
    worker, whose embedded beat runs in real time on the same table, cannot move them."""
    from project.celery import app

    last_runs: dict[str, datetime] = {}
    sent: list[datetime] = []

    class Scheduler(beat_schedulers.DatabaseScheduler):
        def enabled_models_qs(self) -> Any:
            return super().enabled_models_qs().filter(name=task_name)

        def install_default_entries(self, data: Any) -> None:
            pass  # celery.backend_cleanup: not ours

        def all_as_schedule(self) -> Any:
            entries = super().all_as_schedule()
            for entry_name, entry in entries.items():
                if entry_name in last_runs:
                    entry.model.last_run_at = entry.last_run_at = last_runs[entry_name]
            return entries

        def sync(self) -> None:
            while self._dirty:
                entry_name = self._dirty.pop()
                last_runs[entry_name] = self._schedule[entry_name].model.last_run_at

        def apply_async(self, entry: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(SimulatedClock.at)
            return super().apply_async(entry, *args, **kwargs)

    SimulatedClock.at = start
    PeriodicTask.objects.filter(name=task_name).update(last_run_at=start)
    scheduler = Scheduler(app=app, max_interval=60)
    try:
        while SimulatedClock.at < start + timedelta(hours=hours):
            wait = scheduler.tick()
            # A tick that sent (0) or is a hair early: beat loops at once; time moves on.
            SimulatedClock.at += timedelta(seconds=max(wait, 0.1))
    finally:
        scheduler.close()
    return sent


@pytest.mark.parametrize(("zone", "cron", "day", "expected"), [
    # From 00:00 local the day before the transition to 04:00 the day after it (New York's
    # transitions are stepped through in tests/unit/test_schedule_dst.py).
    ("Europe/Berlin", "30 2 * * *", datetime(2026, 3, 28), {
        "2026-03-28T01:30:00+00:00": ("2026-03-28T01:30", 1),
        "2026-03-29T01:00:00+00:00": ("2026-03-29T01:30", 1),  # sent 03:30 CEST, tick 03:00
        "2026-03-30T00:30:00+00:00": ("2026-03-30T00:30", 1)}),
    ("Europe/Berlin", "30 2 * * *", datetime(2026, 10, 24), {
        "2026-10-24T00:30:00+00:00": ("2026-10-24T00:30", 1),
        "2026-10-25T00:30:00+00:00": ("2026-10-25T00:30", 1),  # the first 02:30 only
        "2026-10-26T01:30:00+00:00": ("2026-10-26T01:30", 1)}),
])
def test_beat__sends_a_cron_schedule_once_a_day_through_a_transition(
        name, worker, token, simulated_clock, zone, cron, day, expected):
    queuety.schedule(name, workflow="reg_letters", cron=cron, timezone=zone,
                     payload={"token": token})
    start = day.replace(tzinfo=ZoneInfo(zone)).astimezone(UTC)
    seen = len(worker.log())
    sent = simulated_beat(schedules.TASK_PREFIX + name, start, hours=52)
    assert sorted(moment.strftime("%Y-%m-%dT%H:%M") for moment in sent) == \
        sorted(when for when, _ in expected.values())
    runs = settle(name, worker, seen, len(sent), start, start + timedelta(hours=52),
                  runs=len(expected))
    assert runs == {key: count for key, (_, count) in expected.items()}


def test_beat__an_interval_schedule_keeps_its_utc_cadence_through_both_transitions(
        name, worker, token, simulated_clock):
    queuety.schedule(name, workflow="reg_letters", every=timedelta(hours=1),
                     payload={"token": token})
    runs: list[str] = []
    for start in (datetime(2026, 3, 28, 22, 0, 30, tzinfo=UTC),
                  datetime(2026, 10, 24, 22, 0, 30, tzinfo=UTC)):
        seen = len(worker.log())
        sent = simulated_beat(schedules.TASK_PREFIX + name, start, hours=6)
        gaps = {round((later - earlier).total_seconds()) for earlier, later in zip(sent, sent[1:])}
        # Every hour on the hour in UTC, from an hour after the last run: none shifted by
        # the transition, doubled or lost.
        assert len(sent) == 5 and gaps == {3600}, sent
        runs += settle(name, worker, seen, len(sent), start, start + timedelta(hours=6),
                       runs=5)
    assert len(runs) == 10 and all(key.endswith(":00:00+00:00") for key in runs)
