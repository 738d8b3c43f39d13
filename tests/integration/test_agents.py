"""Durable Pydantic AI agents (queuety.contrib.pydantic_ai) on PostgreSQL and real workers,
offline (FunctionModel): every model request and tool call appends to a ledger file, so a
test counts what really ran.

- A worker SIGKILLed inside the second tool call: the retried attempt replays the first two
  model requests and the first tool call from their checkpoints (the ledger has each once),
  re-runs only the tool call in progress, and the run completes; deps are built per attempt
  and never stored.
- 20 agent runs against a provider limit of 3 (``AGENT_LIMITS["function:limited"]``), on a
  lane worker of 20 threads and on a prefork worker of 6 processes: never more than 3
  requests in flight.
- Tokens are cost units: a run with ``max_cost_units`` below one answer's tokens fails with
  ``BudgetExceeded`` after that one request, never retried.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

import queuety
from queuety.models import AgentCheckpoint, Event, GroupLease, WorkflowRun
from tests import agent_steps, workflows
from tests.integration.conftest import Worker, wait_for
from tests.integration.test_lane import LaneWorker, max_overlap, wait_gone
from tests.workflows import marks

pytestmark = pytest.mark.worker

RETRY = queuety.RetryPolicy(max_attempts=3, initial_delay=0.1, max_delay=0.5)


def _ledger(token: str) -> list[str]:
    """The ledger's lines without their pid."""
    return [line.split(" ", 1)[1] for line in marks(f"{token}-ledger")]


def _until(check, timeout: float, worker: Worker):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)


def test_a_worker_killed_between_two_tool_calls_replays_what_completed(worker, token):
    run_id = (queuety.workflow(f"agent_kill_{token[:8]}")
              .then(agent_steps.ledger_research, retry=RETRY)
              .dispatch({"token": token}))
    # The second tool call lingers on its first execution: kill its process there.
    _until(lambda: any(line.startswith("tool second start") for line in _ledger(token)),
           30, worker)
    pid = int(next(line for line in marks(f"{token}-ledger")
                   if "tool second start" in line).split()[0])
    os.kill(pid, signal.SIGKILL)

    status = wait_for(run_id, timeout=60, worker=worker)
    assert status.status == "completed", status
    assert _ledger(token) == [
        "model 1", "tool first attempt=1", "model 2", "tool second start attempt=1",
        # the retry: requests 1-2 and tool "first" replayed, the unfinished call run again
        "tool second start attempt=2", "tool second end", "model 3"]
    assert Event.objects.filter(run_id=run_id, kind="step_retried",
                                data__error__type="queuety.exceptions.WorkerLost").exists()
    # Deps were built once per attempt, and are in no checkpoint.
    assert [line.split(" ", 1)[1] for line in marks(f"deps-{run_id}")] == [
        "attempt 1", "attempt 2"]
    rows = list(AgentCheckpoint.objects.filter(run_id=run_id).order_by("kind", "seq", "key")
                .values_list("kind", "seq", "key", "name", "attempt"))
    assert rows == [("model", 1, "", "function:ledger", 1), ("model", 2, "", "function:ledger", 1),
                    ("model", 3, "", "function:ledger", 2), ("tool", 1, "c1", "first", 1),
                    ("tool", 2, "c2", "second", 2)]
    assert "secret" not in str(list(AgentCheckpoint.objects.filter(run_id=run_id)
                                    .values_list("payload", flat=True)))

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.state["answer"] == f"done {token}"
    [turn] = run.state["agent_history"]
    kinds = [message["kind"] for message in turn["messages"]]
    assert kinds == ["request", "response", "request", "response", "request", "response"]
    usage = run.state["agent_usage"]
    assert usage["requests"] == 3 and usage["tool_calls"] == 2
    tokens = sum(AgentCheckpoint.objects.filter(run_id=run_id).values_list("tokens", flat=True))
    assert tokens == usage["total_tokens"] > 0
    assert run.cost_units == tokens + 1  # the requests' tokens, and the step's own unit
    assert not GroupLease.objects.filter(step_run__run_id=run_id).exists()


@pytest.fixture(scope="module")
def lane(db_session, worker, tmp_path_factory):
    """A lane worker of 20 threads on a queue of its own."""
    handle = LaneWorker(tmp_path_factory.mktemp("agents-lane"),
                        queue=f"agents-{uuid.uuid4().hex[:6]}", concurrency=20,
                        app_name=f"agents-{uuid.uuid4().hex[:8]}")
    handle.start()
    yield handle
    handle.stop()
    wait_gone(handle.app_name)


@pytest.fixture(scope="module")
def wide(db_session, worker, tmp_path_factory):
    """A prefork worker of 6 processes on a queue of its own (no sweeper)."""
    handle = Worker(tmp_path_factory.mktemp("agents-wide"),
                    queue=f"agents-wide-{uuid.uuid4().hex[:6]}", concurrency=6, beat=False)
    handle.start()
    yield handle
    handle.stop()


@pytest.mark.parametrize("pool", ["lane", "wide"])
def test_20_agent_runs_never_exceed_the_providers_limit_of_3(pool, request, token):
    lane = request.getfixturevalue(pool)
    flow = queuety.workflow(f"agent_limited_{token[:8]}").then(
        agent_steps.limited_agent_step, queue=lane.queue)
    tokens = [f"{token}{i}" for i in range(20)]
    run_ids = [flow.dispatch({"token": each}) for each in tokens]
    # The groups overview (the admin's groups page) shows the model's group while it is busy.
    seen = []
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        seen = [group for group in queuety.resource_groups()
                if group["group"] == "agent:function:limited" and group["in_flight"]]
        time.sleep(0.02)
    assert seen and seen[0]["limit"] == 3 and 1 <= seen[0]["in_flight"] <= 3, seen
    for run_id in run_ids:
        assert wait_for(run_id, timeout=90, worker=lane).status == "completed", [
            (data["error"]["type"], data["error"]["message"][:300]) for data in Event.objects.filter(
                run_id=run_id, kind="step_retried").values_list("data", flat=True)]
    intervals = []
    for each in tokens:
        lines = [line.split() for line in marks(f"{each}-limited")]
        starts = [float(fields[2]) for fields in lines if fields[1] == "start"]
        ends = [float(fields[2]) for fields in lines if fields[1] == "end"]
        assert len(starts) == len(ends) == 1, lines
        intervals.append((starts[0], ends[0]))
    # No attempt was taken for lost (WorkerLost) or retried: each run made its one request.
    retried = Event.objects.filter(run_id__in=run_ids, kind="step_retried")
    assert not retried.exists(), list(retried.values_list("data", flat=True))
    # 20 threads (6 processes) would run 20 (6) requests at once; the group holds them to 3
    # (and fills it).
    assert max_overlap(intervals) == 3
    assert not GroupLease.objects.filter(group="agent:function:limited",
                                         step_run__run_id__in=run_ids).exists()


def test_tokens_over_max_cost_units_fail_the_run_after_one_request(worker, token):
    run_id = (queuety.workflow(f"agent_budget_{token[:8]}")
              .then(agent_steps.chatty_agent_step, retry=RETRY)
              .max_cost_units(100)
              .dispatch({"token": token}))
    status = wait_for(run_id, timeout=30, worker=worker)
    assert status.status == "failed"
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.error["type"] == "queuety.exceptions.BudgetExceeded", run.error
    assert "max_cost_units" in run.error["message"]
    assert run.cost_units > 100
    assert len(marks(f"{token}-chatty")) == 1  # never retried: one request only


def test_a_lease_lives_by_its_holders_beat_and_a_lost_attempt_gets_none(worker, token):
    """A lost attempt still running in a live process keeps its slot (its holder beats) until
    its request ends, and may not take another: its row moved on (here: finished)."""
    from datetime import timedelta

    from django.utils import timezone

    from queuety import exceptions
    from queuety.models import StepRun
    from queuety.store import leases

    flow = queuety.workflow(f"agent_lease_{token[:8]}").then(workflows.step_a)
    run_id = flow.dispatch({"token": token})
    assert wait_for(run_id, worker=worker).status == "completed"
    row = StepRun.objects.get(run_id=run_id, step_index=0)
    group, now = f"lease-test-{token[:8]}", timezone.now()
    # The zombie's lease: its row finished, but its holder beats, so it counts.
    zombie = GroupLease.objects.create(group=group, step_run=row, attempt=row.attempt,
                                       acquired_at=now, holder="zombie/1", beat_at=now)
    with pytest.raises(exceptions.WorkerLost, match=f"step row {row.pk}"):
        leases.try_acquire(group, 1, None, row.pk, row.attempt, now, "zombie/1")
    assert list(GroupLease.objects.filter(group=group)) == [zombie]  # nothing taken
    # A second row's acquirer (a fresh attempt of a later run) finds the group full...
    second = queuety.workflow(f"agent_lease2_{token[:8]}").then(workflows.step_a)
    second_id = second.dispatch({"token": token})
    assert wait_for(second_id, worker=worker).status == "completed"
    later = StepRun.objects.get(run_id=second_id, step_index=0)
    StepRun.objects.filter(pk=later.pk).update(status="processing")
    assert leases.try_acquire(group, 1, None, later.pk, later.attempt, now, "live/2")[0] is None
    # ... until the holder stops beating for WORKER_LOST_AFTER: then the slot is freed.
    leases.beat("zombie/1", now - timedelta(seconds=60))
    lease, _ = leases.try_acquire(group, 1, None, later.pk, later.attempt, now, "live/2")
    assert lease is not None and not GroupLease.objects.filter(pk=zombie.pk).exists()


def test_a_lost_attempt_writes_no_checkpoint_and_a_live_one_adopts_the_stored_one(worker,
                                                                                  token):
    from queuety import exceptions
    from queuety.contrib.pydantic_ai.checkpoints import TOOL, Journal
    from queuety.models import StepRun

    run_id = queuety.workflow(f"agent_journal_{token[:8]}").then(workflows.step_a).dispatch(
        {"token": token})
    assert wait_for(run_id, worker=worker).status == "completed"
    row = StepRun.objects.get(run_id=run_id, step_index=0)
    journal = Journal(run_id, row.pk, 0, row.step_name, row.attempt)
    # The row finished (as it would under a later attempt): this attempt records nothing.
    with pytest.raises(exceptions.WorkerLost, match=f"step row {row.pk}"):
        journal.record(TOOL, 1, "c1", "lookup", "f", "late", tokens=5)
    assert not AgentCheckpoint.objects.filter(step_run_id=row.pk).exists()
    assert WorkflowRun.objects.get(pk=run_id).cost_units == 1  # no tokens charged
    # The attempt owns its row again; a stalled earlier one wrote checkpoint 1 first.
    StepRun.objects.filter(pk=row.pk).update(status="processing")
    assert journal.record(TOOL, 1, "c1", "lookup", "f", "first") is None
    assert journal.record(TOOL, 1, "c1", "lookup", "f", "second", tokens=5) == "first"
    assert list(AgentCheckpoint.objects.filter(step_run_id=row.pk).values_list(
        "payload", flat=True)) == ["first"]
    assert WorkflowRun.objects.get(pk=run_id).cost_units == 1  # the adopted one costs nothing


def test_a_tool_that_asked_for_a_retry_is_replayed_as_a_retry_not_run_again(worker, token):
    flow = queuety.workflow(f"agent_picky_{token[:8]}").then(agent_steps.picky_agent_step,
                                                             retry=RETRY)
    run_id = flow.dispatch({"token": token})
    run = wait_for(run_id, worker=worker)
    assert run.status == "completed", list(Event.objects.filter(run_id=run_id).values_list(
        "kind", "data"))
    assert run.state["answer"] == f"careful {token}"
    ledger = [line.split(" ", 1)[1] for line in marks(f"{token}-retry-ledger")]
    # Attempt 1: request, picky (retry), request, fragile (fails). Attempt 2 replays the
    # requests and picky's retry (the same retry prompt: request 2 matches its checkpoint),
    # runs fragile again and the last request.
    assert [entry.split()[0] for entry in ledger] == [
        "request", "picky", "request", "fragile", "fragile", "request"], ledger
    kinds = list(AgentCheckpoint.objects.filter(run_id=run_id).order_by("seq", "kind")
                 .values_list("seq", "kind", "payload"))
    assert (1, "retry", f"ask again with care, {token}") in kinds
