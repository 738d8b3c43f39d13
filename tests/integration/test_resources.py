"""Resource control with real workers: concurrency groups hold across worker nodes, throttled
steps wait visibly without using an attempt, slots come back after a SIGKILL, priorities order
the wake-ups, keyed groups stay fair, rate limits hold, and a worker without memory headroom
defers what it claims (docs/guide/resources.md)."""

from __future__ import annotations

import io
import json
import os
import signal
import time

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.test import Client

import queuety
from queuety.models import GroupStart, StepRun
from tests import resource_steps
from tests.integration.conftest import Worker, wait_for

pytestmark = pytest.mark.worker


def _group(token: str) -> str:
    return f"g-{token}"


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {timeout}s waiting for {what}.")
        time.sleep(0.05)


@pytest.fixture
def second_node(worker, tmp_path):
    """A second worker node (its own `celery worker -c 2`) on the session worker's queue."""
    node = Worker(tmp_path, queue=worker.queue, beat=False, concurrency=2)
    node.start()
    yield node
    node.stop()


def test_group_limit_holds_across_two_worker_nodes_and_uses_no_attempt(worker, second_node,
                                                                       token):
    group = _group(token)
    runs = [queuety.workflow("res_limit")
            .then(resource_steps.ledgered, concurrency_group=group, concurrency_limit=2)
            .dispatch({"token": token, "nap": 0.3}) for _ in range(12)]
    throttled_seen = False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        statuses = [queuety.workflow_status(run_id) for run_id in runs]
        throttled_seen = throttled_seen or any(
            s.throttled_by and s.throttled_by["reason"] == "concurrency" for s in statuses)
        if all(s.status == "completed" for s in statuses):
            break
        time.sleep(0.05)
    spans = resource_steps.intervals(token)
    assert len(spans) == 12, worker.log()[-3000:]
    assert resource_steps.peak(spans) == 2   # the limit is reached, never passed
    assert throttled_seen                    # ... and the others waited, visibly
    # Waiting used no attempt: every step ran once, on its first attempt.
    assert list(StepRun.objects.filter(run_id__in=runs).values_list("attempt", flat=True)
                ) == [1] * 12
    # Both nodes ran some: the limit held across worker processes of two nodes.
    pids = {pid for _, pid, _ in resource_steps.starts(token)}
    assert len(pids) >= 2


def test_a_throttled_step_shows_its_group_and_reason_and_holds_no_attempt(worker, token):
    group = _group(token)
    flow = queuety.workflow("res_visible").then(resource_steps.ledgered,
                                                concurrency_group=group, concurrency_limit=1)
    first = flow.dispatch({"token": token, "nap": 5})
    _wait_until(lambda: len(resource_steps.starts(token)) == 1, 30, "the first step to start")
    second = flow.dispatch({"token": token, "nap": 0.1})
    _wait_until(lambda: queuety.workflow_status(second).throttled_by is not None, 30,
                "the second step to be throttled")
    status = queuety.workflow_status(second)
    assert status.status == "running"
    assert status.throttled_by["group"] == group
    assert status.throttled_by["reason"] == "concurrency"
    assert status.throttled_by["limit"] == 1 and status.throttled_by["in_flight"] == 1
    row = StepRun.objects.get(run_id=second)
    assert (row.status, row.attempt, row.claimed_by) == ("throttled", 0, "")
    assert any(g["group"] == group and g["waiting"] == 1 and g["limit"] == 1
               for g in queuety.resource_groups())
    # The CLI, the admin's groups page and the run page show it too.
    out = io.StringIO()
    call_command("queuety", "status", "--format", "json", stdout=out)
    listed = {g["group"]: g for g in json.loads(out.getvalue())["groups"]}
    assert (listed[group]["in_flight"], listed[group]["limit"], listed[group]["waiting"]) == \
        (1, 1, 1)
    out = io.StringIO()
    call_command("queuety", "workflow", "status", str(second), stdout=out)
    assert f"Throttled: group {group!r}: concurrency 1/1 in flight" in out.getvalue()
    admin_user = User.objects.create_superuser(f"r{token}", password="pw")
    client = Client()
    client.force_login(admin_user)
    page = client.get("/admin/queuety/resourcegroup/")
    assert page.status_code == 200
    row = page.content.decode().split(f"<code>{group}</code>")[1].split("</tr>")[0]
    assert "<td>1</td>" in row           # in flight 1, limit 1, waiting 1
    run_page = client.get(f"/admin/queuety/workflowrun/{second}/change/").content.decode()
    assert "waits for group" in run_page and group in run_page
    assert wait_for(first, timeout=30, worker=worker).status == "completed"
    done = wait_for(second, timeout=30, worker=worker)
    assert done.status == "completed" and done.throttled_by is None
    assert StepRun.objects.get(run_id=second).attempt == 1
    first_span, second_span = resource_steps.intervals(token)
    assert second_span[0] >= first_span[1]  # it started only once the slot was free


def test_high_priority_steps_start_before_a_backlog_of_low_ones(worker, token):
    group = _group(token)

    def flow(priority):
        return (queuety.workflow("res_priority").with_priority(priority)
                .then(resource_steps.ledgered, concurrency_group=group, concurrency_limit=1))

    blocker = flow("normal").dispatch({"token": token, "nap": 1.5, "label": "blocker"})
    _wait_until(lambda: len(resource_steps.starts(token)) == 1, 30, "the blocker to start")
    low = [flow("low").dispatch({"token": token, "nap": 0.05, "label": "low"})
           for _ in range(4)]
    high = [flow("high").dispatch({"token": token, "nap": 0.05, "label": "high"})
            for _ in range(2)]
    _wait_until(lambda: StepRun.objects.filter(run_id__in=low + high,
                                               status="throttled").count() == 6, 30,
                "the six steps to wait behind the blocker")
    for run_id in [blocker, *low, *high]:
        assert wait_for(run_id, timeout=60, worker=worker).status == "completed"
    order = [label for _, _, label in resource_steps.intervals(token)]
    assert order == ["blocker", "high", "high", "low", "low", "low", "low"]


def test_keyed_groups_limit_each_tenant_and_a_small_tenant_is_not_starved(worker, token):
    template = _group(token) + ":{tenant_id}"
    flow = queuety.workflow("res_tenants").then(resource_steps.ledgered,
                                                concurrency_group=template, concurrency_limit=1)
    big = [flow.dispatch({"token": token, "tenant_id": "big", "label": "big", "nap": 0.1})
           for _ in range(20)]
    small = [flow.dispatch({"token": token, "tenant_id": "small", "label": "small",
                            "nap": 0.1}) for _ in range(3)]
    for run_id in big + small:
        assert wait_for(run_id, timeout=90, worker=worker).status == "completed"
    spans = resource_steps.intervals(token)
    assert resource_steps.peak(spans, "big") == 1 and resource_steps.peak(spans, "small") == 1
    small_done = max(end for _, end, label in spans if label == "small")
    big_done = max(end for _, end, label in spans if label == "big")
    # The small tenant's three steps did not wait for the big tenant's twenty.
    assert small_done < big_done - 1.0


def test_a_missing_group_key_fails_the_run_with_a_clear_error(worker, token):
    run_id = (queuety.workflow("res_missing")
              .then(resource_steps.ledgered, concurrency_group="tenant:{tenant_id}",
                    concurrency_limit=2)
              .dispatch({"token": token}))
    status = wait_for(run_id, timeout=30, worker=worker)
    assert status.status == "failed"
    assert status.error["type"].endswith("WorkflowDefinitionError")
    assert "'tenant_id'" in status.error["message"] and str(run_id) in status.error["message"]
    assert resource_steps.starts(token) == []


def test_the_slot_of_a_killed_step_comes_back_and_the_next_step_starts(worker, token):
    group = _group(token)
    flow = queuety.workflow("res_kill").then(resource_steps.ledgered,
                                             concurrency_group=group, concurrency_limit=1,
                                             retry=queuety.RetryPolicy(max_attempts=1))
    victim = flow.dispatch({"token": token, "nap": 30, "label": "victim"})
    _wait_until(lambda: len(resource_steps.starts(token)) == 1, 30, "the victim to start")
    waiting = flow.dispatch({"token": token, "nap": 0.1, "label": "next"})
    _wait_until(lambda: StepRun.objects.filter(run_id=waiting, status="throttled").exists(),
                30, "the next step to be throttled")
    (_, pid, _), = resource_steps.starts(token)
    os.kill(pid, signal.SIGKILL)
    killed = wait_for(victim, timeout=30, worker=worker)
    assert killed.status == "failed" and killed.error["type"].endswith("WorkerLost")
    done = wait_for(waiting, timeout=30, worker=worker)
    assert done.status == "completed"
    starts = resource_steps.starts(token)
    assert [label for _, _, label in starts] == ["victim", "next"]
    # Nothing holds the group any more: a third step starts at once.
    third = flow.dispatch({"token": token, "nap": 0.05, "label": "third"})
    assert wait_for(third, timeout=30, worker=worker).status == "completed"
    assert not StepRun.objects.filter(concurrency_group=group,
                                      status__in=("processing", "throttled")).exists()


def test_a_rate_limit_is_never_exceeded_in_any_window(worker, token):
    group = _group(token)
    flow = queuety.workflow("res_rate").then(resource_steps.ledgered, concurrency_group=group,
                                             rate_limit=(4, 1.0))
    runs = [flow.dispatch({"token": token, "nap": 0.01}) for _ in range(12)]
    for run_id in runs:
        assert wait_for(run_id, timeout=60, worker=worker).status == "completed"
    admitted = [t.timestamp() for t in GroupStart.objects.filter(group=group)
                .values_list("started_at", flat=True)]
    assert len(admitted) == 12
    assert resource_steps.max_in_window(admitted, 1.0) <= 4
    # 12 starts at 4 a second need at least two windows after the first.
    assert max(admitted) - min(admitted) >= 2.0
    assert list(StepRun.objects.filter(run_id__in=runs).values_list("attempt", flat=True)
                ) == [1] * 12


def test_a_worker_without_memory_headroom_defers_steps_without_using_attempts(
        worker, tmp_path, token):
    queue = f"starved-{token}"
    starved = Worker(tmp_path / "starved", queue=queue, beat=False, concurrency=1)
    starved.env["QUEUETY_TEST_ADMISSION"] = "starved"
    (tmp_path / "starved").mkdir()
    starved.start()
    try:
        run_id = (queuety.workflow("res_memory").on_queue(queue)
                  .then(resource_steps.ledgered).dispatch({"token": token, "nap": 0.01}))
        _wait_until(lambda: (queuety.workflow_status(run_id).throttled_by or {}).get(
            "reason") == "memory", 30, "the step to be deferred")
        status = queuety.workflow_status(run_id)
        assert "MAX_RSS_MB" in status.throttled_by["detail"]
        row = StepRun.objects.get(run_id=run_id)
        assert row.status == "pending" and row.attempt == 0
        time.sleep(2.5)  # offered again after DEFER_SECONDS, deferred again
        assert StepRun.objects.get(run_id=run_id).attempt == 0
        assert resource_steps.starts(token) == []
    finally:
        starved.stop()
    healthy = Worker(tmp_path / "healthy", queue=queue, beat=False, concurrency=1)
    (tmp_path / "healthy").mkdir()
    healthy.start()
    try:
        assert wait_for(run_id, timeout=30, worker=healthy).status == "completed"
        assert StepRun.objects.get(run_id=run_id).attempt == 1
    finally:
        healthy.stop()


def test_a_small_tenant_is_not_queued_behind_the_big_tenants_backlog(worker, token):
    # Three tenants, limit 2 each, queued at once: the big tenant's backlog waits in the
    # database (parked at landing), not in the broker ahead of the others' first steps.
    template = _group(token) + ":{tenant_id}"
    flow = queuety.workflow("res_fair").then(resource_steps.ledgered,
                                             concurrency_group=template, concurrency_limit=2)
    runs = []
    with transaction.atomic():  # queued at once: every message is sent at the commit
        for tenant, count in (("big", 200), ("mid", 20), ("small", 5)):
            runs += [flow.dispatch({"token": token, "tenant_id": tenant, "label": tenant,
                                    "nap": 0.1}) for _ in range(count)]
    queued = time.time()
    for run_id in runs:
        assert wait_for(run_id, timeout=120, worker=worker).status == "completed"
    spans = resource_steps.intervals(token)
    assert all(resource_steps.peak(spans, tenant) <= 2 for tenant in ("big", "mid", "small"))
    big_ends = sorted(end for _, end, label in spans if label == "big")
    small_done = max(end for _, end, label in spans if label == "small")
    # Its five steps need 0.3 s at two at a time. When every run's message went to the broker,
    # they waited behind the big tenant's, which each worker claimed and throttled in turn
    # (about 40 of the big steps ended first); parked at landing, they do not.
    eighth = big_ends[len(big_ends) // 8 - 1]
    assert small_done < eighth, (small_done - queued, eighth - queued)


def test_a_step_parked_at_landing_has_no_message_and_starts_when_its_slot_frees(worker,
                                                                                 token):
    group = _group(token)
    flow = queuety.workflow("res_parked").then(resource_steps.ledgered, concurrency_group=group,
                                               concurrency_limit=1,
                                               retry=queuety.RetryPolicy(max_attempts=1))
    victim = flow.dispatch({"token": token, "nap": 30, "label": "victim"})
    _wait_until(lambda: len(resource_steps.starts(token)) == 1, 30, "the victim to start")
    waiting = [flow.dispatch({"token": token, "nap": 0.05, "label": "next"})
               for _ in range(3)]
    # Parked by the dispatch itself: throttled, never published, no attempt, no worker.
    parked = list(StepRun.objects.filter(run_id__in=waiting).values_list(
        "status", "published_at", "attempt", "claimed_by"))
    assert parked == [("throttled", None, 0, "")] * 3
    assert all(queuety.workflow_status(run_id).throttled_by["reason"] == "concurrency"
               for run_id in waiting)
    (_, pid, _), = resource_steps.starts(token)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(victim, timeout=30, worker=worker).status == "failed"
    for run_id in waiting:
        assert wait_for(run_id, timeout=30, worker=worker).status == "completed"
    spans = resource_steps.intervals(token)
    assert [label for _, _, label in spans] == ["next"] * 3
    assert resource_steps.peak(spans) == 1
    assert list(StepRun.objects.filter(run_id__in=waiting).values_list("attempt", flat=True)
                ) == [1] * 3


@pytest.fixture
def budget_node(worker, tmp_path):
    """A worker node (``-c 4``) for the test settings' queue with a cost budget of 2."""
    from tests.settings import BUDGET_QUEUE

    node = Worker(tmp_path, queue=BUDGET_QUEUE, beat=False, concurrency=4)
    node.start()
    yield node
    node.stop()


def test_tenants_sharing_a_queue_budget_take_turns_and_the_budget_holds(worker, budget_node,
                                                                       token):
    # Each tenant's own limit (10) leaves room: the queue's budget of 2 is what they share.
    # One slot frees at a time, and it goes round the tenants, not to the oldest waiting
    # step (which would be the big tenant's until its backlog ran out).
    template = _group(token) + ":{tenant_id}"
    flow = queuety.workflow("res_queue_fair").then(
        resource_steps.ledgered, concurrency_group=template, concurrency_limit=10,
        queue=budget_node.queue)
    runs = []
    with transaction.atomic():
        for tenant, count in (("big", 24), ("mid", 6), ("small", 3)):
            runs += [flow.dispatch({"token": token, "tenant_id": tenant, "label": tenant,
                                    "nap": 0.15}) for _ in range(count)]
    throttled = StepRun.objects.filter(run_id__in=runs, status="throttled")
    assert throttled.count() == 31
    assert {row["reason"] for row in throttled.values_list("throttled_by", flat=True)} == {
        "queue_cost"}
    # The queue's line is visible: from Python, the CLI (text and JSON) and the admin.
    queue = budget_node.queue
    listed = {q["queue"]: q for q in queuety.queue_budgets()}[queue]
    assert (listed["budget"], listed["running"], listed["running_cost"]) == (2, 2, 2)
    assert 25 <= listed["waiting"] <= 31
    out = io.StringIO()
    call_command("queuety", "status", "--format", "json", stdout=out)
    assert {q["queue"]: q["budget"] for q in json.loads(out.getvalue())["queues"]}[queue] == 2
    out = io.StringIO()
    call_command("queuety", "status", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith(queue))
    assert line.split()[1:3] == ["2", "2/2"]
    client = Client()
    client.force_login(User.objects.create_superuser(f"q{token}", password="pw"))
    page = client.get("/admin/queuety/resourcegroup/").content.decode()
    assert f"<code>{queue}</code>" in page.split('id="queues"')[1]
    for run_id in runs:
        assert wait_for(run_id, timeout=120, worker=worker).status == "completed"
    spans = resource_steps.intervals(token)
    assert resource_steps.peak(spans) <= 2
    order = "".join(label[0] for _, _, label in spans)
    # Taking turns, the small tenant's three are done within the first nine or so steps and
    # the middle one's six within about fifteen (a wake-up that finds a tenant's lock busy,
    # the sweeper's say, may pass it over once); served oldest first, both would have waited
    # for all of the big tenant's twenty-four.
    assert order[:14].count("s") == 3 and order[:22].count("m") == 6, order
    assert set(StepRun.objects.filter(run_id__in=runs).values_list("attempt", flat=True)) == {1}


def test_a_release_on_one_queue_wakes_the_groups_step_waiting_on_a_budgeted_queue(
        worker, budget_node, token):
    # One tenant group across two steps on two queues: the first holds the group's one slot
    # on the default queue; the second, on the budgeted queue (idle), waits for the slot. The
    # first one's release starts it at once, not at the sweeper's next pass.
    group = _group(token)
    flow = (queuety.workflow("res_two_queues")
            .then(resource_steps.ledgered, concurrency_group=group, concurrency_limit=1))
    other = (queuety.workflow("res_two_queues_llm")
             .then(resource_steps.ledgered, concurrency_group=group, concurrency_limit=1,
                   queue=budget_node.queue))
    for round_ in range(3):
        label = f"first{round_}"
        holder = flow.dispatch({"token": token, "nap": 0.6, "label": label})
        _wait_until(lambda label=label: label in [s[2] for s in resource_steps.starts(token)],
                    30, "the first step to start")
        waiter = other.dispatch({"token": token, "nap": 0.05, "label": f"second{round_}"})
        row = StepRun.objects.get(run_id=waiter)
        assert (row.status, row.queue) == ("throttled", budget_node.queue)
        assert wait_for(holder, timeout=30, worker=worker).status == "completed"
        assert wait_for(waiter, timeout=30, worker=worker).status == "completed"
    spans = {label: (start, end) for start, end, label in resource_steps.intervals(token)}
    gaps = [spans[f"second{n}"][0] - spans[f"first{n}"][1] for n in range(3)]
    # The sweeper passes every second; three releases in a row each woke it sooner.
    assert all(0 <= gap < 0.35 for gap in gaps), gaps


def test_two_transactions_landing_steps_of_one_group_on_two_queues_do_not_deadlock(
        worker, budget_node, token):
    # One transaction lands a step of group G (holding G's lock), then, later, one of G on the
    # budgeted queue Q; meanwhile another lands one of G on Q (taking Q's lock, then waiting
    # for G's). The first must not wait for Q's lock while it holds G's: its second step is
    # published for its gate to decide instead, and both transactions commit.
    import threading

    from django.db import connection as default_connection

    group = _group(token)
    plain = queuety.workflow("res_deadlock_plain").then(
        resource_steps.ledgered, concurrency_group=group, concurrency_limit=5)
    budgeted = queuety.workflow("res_deadlock_q").then(
        resource_steps.ledgered, concurrency_group=group, concurrency_limit=5,
        queue=budget_node.queue)
    # Their definition rows exist already (a first dispatch creates one; two transactions
    # creating the same one would wait for each other's row instead).
    for flow in (plain, budgeted):
        assert wait_for(flow.dispatch({"token": token, "nap": 0.01}), timeout=60,
                        worker=worker).status == "completed"
    first_holds, errors, runs = threading.Event(), [], []

    def first():
        try:
            with transaction.atomic():
                runs.append(plain.dispatch({"token": token, "nap": 0.01}))
                first_holds.set()
                time.sleep(0.5)  # the other transaction takes Q's lock and waits for G's
                runs.append(budgeted.dispatch({"token": token, "nap": 0.01}))
        except Exception as error:  # noqa: BLE001 - the test's answer
            errors.append(error)
        finally:
            default_connection.close()

    def second():
        try:
            first_holds.wait(10)
            with transaction.atomic():
                runs.append(budgeted.dispatch({"token": token, "nap": 0.01}))
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        finally:
            default_connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(runs) == 3
    for run_id in runs:
        assert wait_for(run_id, timeout=60, worker=worker).status == "completed"
