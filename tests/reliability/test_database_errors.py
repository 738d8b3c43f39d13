"""Database errors at the step boundary: a serialization failure, a deadlock and a lost
connection in the middle of the transition statement.

A trigger on the run table raises the real PostgreSQL error (SQLSTATE 40001 or 40P01) or
terminates its own session, inside the statement that applies the transition, a set number
of times. Each failed try must roll back whole (nothing half-applied: one completion, one next
step, the right transition count), and the worker must try the transition again in place, with
the handler's output in hand, so the handler runs once. An error that outlasts the retries
leaves the step recoverable: the sweeper takes it back and it runs again. A schedule's fire
that meets PostgreSQL down is tried again once it is back, for its own tick.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import OperationalError, connection

import queuety
from queuety import publish, schedules
from queuety.models import Event, StepRun, WorkflowRun
from queuety.runtime import attempt, outcome
from queuety.store import rows
from queuety.store import sql as statements
from tests import workflows
from tests.integration.conftest import wait_for
from tests.reliability.chaos import postgres_down

TRIGGER = """
CREATE OR REPLACE FUNCTION rel_inject_fault() RETURNS trigger AS $$
BEGIN
    IF NEW.transitions > OLD.transitions AND NEW.state ? 'fault'
       AND OLD.current_step = (NEW.state->>'fault_step')::int
       AND nextval(format('rel_fault_%s', NEW.state->>'token'))
           <= COALESCE((NEW.state->>'fires')::int, 1) THEN
        IF NEW.state->>'fault' = 'lost' THEN
            PERFORM pg_terminate_backend(pg_backend_pid());
            PERFORM pg_sleep(5);  -- the termination arrives during the sleep
        END IF;
        RAISE EXCEPTION 'injected fault %', NEW.state->>'fault'
            USING ERRCODE = NEW.state->>'fault';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS rel_inject_fault ON queuety_workflowrun;
CREATE TRIGGER rel_inject_fault BEFORE UPDATE ON queuety_workflowrun
    FOR EACH ROW EXECUTE FUNCTION rel_inject_fault();
"""


@pytest.fixture(scope="module")
def fault_trigger(db_session):
    with connection.cursor() as cursor:
        cursor.execute(TRIGGER)
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS rel_inject_fault ON queuety_workflowrun")


def fired(token: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT is_called FROM rel_fault_{token}")
        return cursor.fetchone()[0]


def run_with_fault(token: str, fault: str, fires: int) -> tuple[int, float]:
    """Dispatch a three-step run whose second transition fails ``fires`` times; return the
    run id and when the first fault fired."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SEQUENCE rel_fault_{token}")
    run_id = (queuety.workflow("rel_db_fault").then(workflows.step_a)
              .then(workflows.step_b).then(workflows.step_c)
              .dispatch({"token": token, "fault": fault, "fault_step": 1, "fires": fires}))
    deadline = time.monotonic() + 30
    while not fired(token):
        assert time.monotonic() < deadline, "the fault never fired"
        time.sleep(0.01)
    return run_id, time.monotonic()


def assert_applied_once(run_id: int) -> None:
    """One completion per step, one row per step, three transitions: no try left a half."""
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.transitions, run.state["log"]) == ("completed", 3, ["a", "b", "c"])
    completions = list(Event.objects.filter(run_id=run_id, kind="step_completed")
                       .values_list("step_name", flat=True).order_by("id"))
    assert completions == ["step_a", "step_b", "step_c"]
    assert sorted(StepRun.objects.filter(run_id=run_id).values_list("step_index", "status")) \
        == [(0, "completed"), (1, "completed"), (2, "completed")]


@pytest.mark.parametrize("fault", ["40001", "40P01", "lost"],
                         ids=["serialization_failure", "deadlock", "lost_connection"])
def test_error_in_the_transition__rolls_back_and_is_tried_again_in_place(
        fault_trigger, worker, token, fault, figures):
    run_id, injected = run_with_fault(token, fault, fires=1)

    status = wait_for(run_id, timeout=30, worker=worker)
    recovered = time.monotonic() - injected

    assert status.status == "completed", status.error
    assert_applied_once(run_id)
    # Tried again in place: the handler ran once, its attempt was never taken for lost.
    assert len(workflows.marks(f"{token}-b")) == 1
    assert StepRun.objects.get(run_id=run_id, step_index=1).attempt == 1
    assert not Event.objects.filter(run_id=run_id, kind="step_retried").exists()
    assert f"The transition of step run id={StepRun.objects.get(run_id=run_id, step_index=1).pk}" \
        f" (run id={run_id}, attempt 1) failed with a transient database error" in worker.log()
    figures.record(f"db_error_{fault}", recovered_s=round(recovered, 2), handler_runs=1,
                   merged=1)


def test_error_outlasting_the_retries__the_step_is_recovered_and_runs_again(
        fault_trigger, worker, token, figures):
    # As many failures as the worker makes tries (the first and one per pause): the error
    # propagates, the heartbeat stops, and the sweeper takes the attempt back as lost.
    run_id, injected = run_with_fault(token, "40001",
                                      fires=len(outcome.TRANSITION_RETRY_DELAYS) + 1)

    status = wait_for(run_id, timeout=60, worker=worker)
    recovered = time.monotonic() - injected

    assert status.status == "completed", status.error
    assert_applied_once(run_id)
    row = StepRun.objects.get(run_id=run_id, step_index=1)
    assert row.attempt == 2
    lost = Event.objects.get(run_id=run_id, kind="step_retried")
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    # The handler ran again (at least once per attempt); its output merged once.
    assert len(workflows.marks(f"{token}-b")) == 2
    figures.record("db_error_outlasting_retries", recovered_s=round(recovered, 2),
                   handler_runs=2, merged=1)


def test_error_in_the_transition_that_trying_again_cannot_fix__fails_the_run_at_once(
        fault_trigger, worker, token, figures):
    # 42703 (undefined column), as a schema that does not match the code would raise: before,
    # the error escaped the attempt, its row stayed processing, and STALE_AFTER later the
    # sweeper took it for a lost worker and ran the handler again; the cause was only in the
    # worker's log.
    run_id, injected = run_with_fault(token, "42703", fires=1)

    status = wait_for(run_id, timeout=30, worker=worker)
    recorded = time.monotonic() - injected

    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.TransitionFailed"
    assert status.error["step"] == "step_b" and status.error["attempt"] == 1
    assert "could not be recorded: the database refused it with UndefinedColumn: injected " \
           "fault 42703" in status.error["message"]
    assert "retry the run" in status.error["message"]
    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    assert failed.data["error"]["type"] == "queuety.exceptions.TransitionFailed"
    assert len(workflows.marks(f"{token}-b")) == 1  # the handler ran once
    assert not Event.objects.filter(run_id=run_id, kind="step_retried").exists()
    assert recorded < 2, recorded  # at once, not after STALE_AFTER
    figures.record("db_error_not_transient", recorded_s=round(recorded, 2), handler_runs=1)


@pytest.mark.parametrize("inline", [False, True], ids=["next_step_published",
                                                   "next_step_claimed_inline"])
def test_a_try_whose_commit_landed_but_whose_answer_was_lost__is_not_applied_twice(
        db_session, token, monkeypatch, inline):
    """The one case a worker cannot tell from the error alone: the connection dropped after
    the server committed the transition. The next try finds the step row completed by this
    very attempt and records nothing more (no discard, no second completion); it does what
    should have followed the commit: the next step is published, and a next step that try had
    claimed for this process to run inline is handed back to the broker first.

    No server-side fault can commit and then lose the answer, so the step is run in this
    process with the transition statement wrapped to do exactly that once.
    """
    run_id = (queuety.workflow("rel_db_ambiguous").on_queue(f"nobody-{token}")
              .then(workflows.step_a).then(workflows.step_b).dispatch({"token": token}))
    first = StepRun.objects.get(run_id=run_id, step_index=0)
    real_cursor = rows.hot_cursor
    lost = []

    class AnswerLosingCursor:
        """Runs the transition statement (it commits by itself), then fails as a dropped
        connection would before the answer arrives, once."""

        def __init__(self, cursor) -> None:
            self.cursor = cursor

        def execute(self, sql, params=None):
            result = self.cursor.execute(sql, params)
            if sql is statements.COMPLETE_POSTGRES and not lost:
                owned, advanced, next_id, *_ = self.cursor.fetchone()  # then awaited, its status
                lost.append((owned, advanced, StepRun.objects.values_list(
                    "status", "claimed_by").get(pk=next_id)))
                raise OperationalError("server closed the connection unexpectedly")
            return result

        def __getattr__(self, name):
            return getattr(self.cursor, name)

    @contextmanager
    def losing_cursor():
        with real_cursor() as cursor:
            yield AnswerLosingCursor(cursor)

    monkeypatch.setattr(rows, "hot_cursor", losing_cursor)
    with publish.captured() as sent:
        attempt.execute_step(first.pk, inline=inline)

    owned, advanced, (next_status, next_claimer) = lost[0]
    assert owned and advanced, "the first try did not apply the transition"
    # The lost try had created the next row pending, or already claimed for this process.
    assert (next_status, next_claimer == first_claimer(run_id)) == (
        ("processing", True) if inline else ("pending", False))
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.current_step, run.transitions, run.state["log"]) == (1, 1, ["a"])
    assert list(Event.objects.filter(run_id=run_id).exclude(kind__in=(
        "workflow_started", "step_started")).values_list("kind", "step_name")) == [
        ("step_completed", "step_a")]
    second = StepRun.objects.get(run_id=run_id, step_index=1)
    assert list(StepRun.objects.filter(run_id=run_id).order_by("step_index").values_list(
        "step_index", "status", "attempt")) == [(0, "completed", 1), (1, "pending", 0)]
    assert (second.claimed_by, second.claimed_at) == ("", None)
    assert [message.step_run_id for message in sent] == [second.pk]
    assert workflows.marks(f"{token}-b") == []


def first_claimer(run_id: int) -> str:
    """``host:pid`` of the process that ran the first step (this one)."""
    return StepRun.objects.get(run_id=run_id, step_index=0).claimed_by


def test_which_database_errors_the_transition_tries_again():
    import psycopg
    from psycopg import errors

    def wrapped(cause: Exception) -> OperationalError:
        error = OperationalError(str(cause))
        error.__cause__ = cause
        return error

    tried_again = {name: rows.is_transient(wrapped(cause)) for name, cause in {
        "serialization failure": errors.SerializationFailure(),
        "deadlock": errors.DeadlockDetected(),
        "session terminated": errors.AdminShutdown(),
        "server starting up": errors.CannotConnectNow(),
        "connection dropped": psycopg.OperationalError("server closed the connection"),
        "statement timeout": errors.QueryCanceled(),
        "lock timeout": errors.LockNotAvailable(),
        "disk full": errors.DiskFull(),
    }.items()}
    assert tried_again == {
        "serialization failure": True, "deadlock": True, "session terminated": True,
        "server starting up": True, "connection dropped": True,
        "statement timeout": False, "lock timeout": False, "disk full": False}
    assert not rows.is_transient(ValueError("not a database error"))


def test_which_database_errors_fail_the_step_at_once():
    from django.db import DataError, IntegrityError, ProgrammingError
    from psycopg import errors

    def wrapped(kind, cause: Exception) -> Exception:
        error = kind(str(cause))
        error.__cause__ = cause
        return error

    refused = {name: rows.is_refusal(error) for name, error in {
        "undefined column": wrapped(ProgrammingError, errors.UndefinedColumn()),
        "unique violation": wrapped(IntegrityError, errors.UniqueViolation()),
        "bad data": wrapped(DataError, errors.InvalidTextRepresentation()),
        "statement timeout": wrapped(OperationalError, errors.QueryCanceled()),
        "lock timeout": wrapped(OperationalError, errors.LockNotAvailable()),
        "read-only standby": wrapped(OperationalError, errors.ReadOnlySqlTransaction()),
        "connection dropped": wrapped(OperationalError, errors.AdminShutdown()),
    }.items()}
    assert refused == {
        "undefined column": True, "unique violation": True, "bad data": True,
        "statement timeout": False, "lock timeout": False, "read-only standby": False,
        "connection dropped": False}


def test_a_schedule_fire_that_meets_a_database_outage__starts_its_ticks_run_once_back(
        worker, token):
    # The fire reaches the worker while PostgreSQL refuses every connection: it is tried
    # again when the database is back, for the tick beat sent it for (it used to be lost).
    from project.celery import app

    name = f"outage-{token}"
    prefix = schedules.key_prefix(name)
    queuety.schedule(name, workflow="reg_letters", every=60, payload={"token": token},
                     enabled=False)
    try:
        sent = datetime.now(dt_timezone.utc) - timedelta(seconds=5)
        with postgres_down():
            fire = app.send_task(schedules.FIRE_TASK, kwargs={"schedule": name},
                                 queue=worker.queue,
                                 headers={schedules.SENT_AT_HEADER: sent.timestamp()})
            deadline = time.monotonic() + 20
            while f"queuety.fire_schedule[{fire.id}] received" not in worker.log():
                assert time.monotonic() < deadline, worker.log()[-3000:]
                time.sleep(0.1)
            time.sleep(1.5)  # it meets the outage, and so does its first try again
        deadline = time.monotonic() + 30
        while not WorkflowRun.objects.filter(idempotency_key__startswith=prefix).exists():
            assert time.monotonic() < deadline, worker.log()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # a second start, had there been one, would show by now
        keys = list(WorkflowRun.objects.filter(idempotency_key__startswith=prefix)
                    .values_list("idempotency_key", flat=True))
        assert keys == [prefix + schedules.interval_slot(60, sent).isoformat()]
        assert f"Schedule {name!r} could not fire for " in worker.log()
    finally:
        schedules.remove(name)
