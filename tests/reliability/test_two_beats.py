"""Two ``celery beat`` processes for schedules, one of them SIGKILLed: every tick fires once.

Beat is no longer needed for recovery (every worker sweeps), only for schedules, and a site may
run two so that losing one loses no tick. Both read the same schedule rows (django-celery-beat's
DatabaseScheduler), each with a schedule file of its own, and both send every fire; the fire's
idempotency key, made of the schedule's name and its tick, starts one run per tick. The module
counts the runs by their tick keys before and after one beat is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import datetime, timezone

import pytest
from django_celery_beat.models import PeriodicTask

import queuety
from queuety import schedules
from queuety.models import WorkflowRun
from tests.integration.conftest import ROOT, start_together, stop_together, wait_for
from tests.reliability.chaos import PoolWorker

EVERY = 2
#: Seconds each phase (both beats, then one) runs: several ticks each.
PHASE = 12.0


class Beat:
    """A ``celery -A project beat`` process with a schedule file of its own."""

    def __init__(self, log_dir, env: dict[str, str], name: str) -> None:
        self.log_path = log_dir / f"beat-{name}.log"
        self.command = [sys.executable, "-m", "celery", "-A", "project", "beat",
                        "--loglevel", "INFO", "--schedule", str(log_dir / f"schedule-{name}"),
                        "--pidfile", str(log_dir / f"beat-{name}.pid")]
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while "beat: Starting..." not in self.log():
            assert self.proc.poll() is None, f"beat exited:\n{self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"beat did not start:\n{self.log()[-3000:]}"
            time.sleep(0.1)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def sent(self, task_name: str) -> list[datetime]:
        """When this beat sent ``task_name``'s fires (its log's own time stamps, UTC)."""
        return [datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").replace(
                    tzinfo=timezone.utc)
                for line in self.log().splitlines()
                if f"Sending due task {task_name} " in line]


@pytest.fixture
def consumer(quiet_session_worker, tmp_path):
    """A worker without beat on a queue of its own (where the beats send the fires)."""
    queue = f"beats-{uuid.uuid4().hex[:8]}"
    worker = PoolWorker(tmp_path, os.environ["CELERY_BROKER_URL"], queue, beat=False,
                        concurrency=2, name="consumer")
    start_together(worker)
    yield worker
    stop_together([worker])


@pytest.fixture
def name():
    chosen = f"twobeats-{uuid.uuid4().hex[:8]}"
    yield chosen
    PeriodicTask.objects.filter(name=schedules.TASK_PREFIX + chosen).delete()


def slot(moment: datetime) -> datetime:
    return schedules.interval_slot(EVERY, moment)


def keyed_slots(name: str) -> Counter:
    """Runs of schedule ``name`` per tick (parsed back from their idempotency keys)."""
    prefix = schedules.key_prefix(name)
    return Counter(datetime.fromisoformat(key.removeprefix(prefix)) for key in
                   WorkflowRun.objects.filter(idempotency_key__startswith=prefix)
                   .values_list("idempotency_key", flat=True))


def test_two_beats__every_tick_fires_once_before_and_after_one_is_killed(consumer, name,
                                                                         token, tmp_path,
                                                                         figures):
    queuety.schedule(name, workflow="reg_letters", every=EVERY, payload={"token": token})
    beats = [Beat(tmp_path, consumer.env, label) for label in ("a", "b")]
    task_name = schedules.TASK_PREFIX + name
    try:
        for beat in beats:
            beat.start()
        time.sleep(PHASE)
        beats[0].kill()
        killed = datetime.now(timezone.utc)
        time.sleep(PHASE)
        beats[1].stop()
    finally:
        for beat in beats:
            beat.stop()
    # The last fires sent may still be on their way to the consumer: removing the schedule
    # first would drop them, so wait until each tick a beat sent has its run.
    fired = {slot(moment) for beat in beats for moment in beat.sent(task_name)}
    deadline = time.monotonic() + 30
    while not fired <= set(keyed_slots(name)) and time.monotonic() < deadline:
        time.sleep(0.2)
    schedules.remove(name)

    runs = keyed_slots(name)
    for run in WorkflowRun.objects.filter(idempotency_key__startswith=schedules.key_prefix(name)):
        assert wait_for(run.pk, worker=consumer).state["log"] == ["a", "b", "c"]
    sent = {label: beat.sent(task_name) for label, beat in zip("ab", beats, strict=True)}
    both = sorted({slot(moment) for moment in sent["a"]} & {slot(moment) for moment in sent["b"]})
    after = [slot(moment) for moment in sent["b"] if moment > killed]
    figures.record("Two beats, one SIGKILLed: fires of an every-2-s schedule",
                   sent_by_a=len(sent["a"]), sent_by_b=len(sent["b"]), runs=sum(runs.values()),
                   ticks_fired_by_both=len(both), ticks_after_kill=len(after))

    # Both beats fired the same ticks; each of those started one run.
    assert len(both) >= PHASE / EVERY - 2, sent
    assert all(runs[tick] == 1 for tick in both), runs
    # Every tick has one run, no more, and none is missing, before the kill and after it.
    assert set(runs.values()) == {1}, runs
    first, last = min(runs), max(runs)
    expected = {datetime.fromtimestamp(first.timestamp() + EVERY * i, tz=timezone.utc)
                for i in range(int((last - first).total_seconds()) // EVERY + 1)}
    assert set(runs) == expected, sorted(expected - set(runs))
    assert len(after) >= PHASE / EVERY - 2, sent["b"]
    assert max(runs) >= slot(killed) and all(runs[tick] == 1 for tick in after)
