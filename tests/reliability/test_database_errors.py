"""Database errors at the step boundary: a serialization failure, a deadlock and a lost
connection in the middle of the transition transaction.

A trigger on the run table raises the real PostgreSQL error (SQLSTATE 40001 or 40P01) or
terminates its own session, inside the statement that applies the transition, a set number
of times. The worker's transaction must roll back whole (nothing half-applied: the run, the
step row and the timeline are as before the step), and the step must be recovered and
completed, its output merged once.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

import queuety
from queuety.models import Event, StepRun, WorkflowRun
from tests import workflows
from tests.integration.conftest import wait_for

TRIGGER = """
CREATE OR REPLACE FUNCTION rel_inject_fault() RETURNS trigger AS $$
BEGIN
    IF NEW.transitions > OLD.transitions AND NEW.state ? 'fault'
       AND OLD.current_step = (NEW.state->>'fault_step')::int
       AND nextval(format('rel_fault_%s', NEW.state->>'token')) <= 1 THEN
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


@pytest.mark.parametrize("fault", ["40001", "40P01", "lost"],
                         ids=["serialization_failure", "deadlock", "lost_connection"])
def test_error_in_the_transition__rolls_back_whole_and_the_step_is_recovered(
        fault_trigger, worker, token, fault, figures):
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SEQUENCE rel_fault_{token}")
    run_id = (queuety.workflow("rel_db_fault").then(workflows.step_a)
              .then(workflows.step_b).then(workflows.step_c)
              .dispatch({"token": token, "fault": fault, "fault_step": 1}))

    deadline = time.monotonic() + 30
    while not fired(token):
        assert time.monotonic() < deadline, "the fault never fired"
        time.sleep(0.02)
    injected = time.monotonic()
    # Nothing of step_b's transition is visible: same run row, no next step, no event.
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.current_step, run.transitions, run.state["log"]) == (1, 1, ["a"])
    assert not StepRun.objects.filter(run_id=run_id, step_index=2).exists()
    assert not Event.objects.filter(run_id=run_id, kind="step_completed",
                                    step_name="step_b").exists()

    status = wait_for(run_id, timeout=30, worker=worker)
    recovered = time.monotonic() - injected

    assert status.status == "completed", status.error
    assert status.state["log"] == ["a", "b", "c"]
    assert Event.objects.filter(run_id=run_id, kind="step_completed",
                                step_name="step_b").count() == 1
    row = StepRun.objects.get(run_id=run_id, step_index=1)
    assert (row.status, row.attempt) == ("completed", 2)
    lost = Event.objects.get(run_id=run_id, kind="step_retried")
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    # The handler ran again (at least once per attempt); its output merged once.
    assert len(workflows.marks(f"{token}-b")) == 2
    figures.record(f"db_error_{fault}", recovered_s=round(recovered, 2),
                   handler_runs=2, merged=1)
