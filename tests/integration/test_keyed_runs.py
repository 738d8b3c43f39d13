"""Keyed runs against PostgreSQL and a real worker: signal-with-start and flow control per key
(debounce, singleton reject/queue/replace/signal, batch), the races from threads, each on its
own database connection."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety.models import Event, Signal, StepRun, WorkflowRun
from tests import keyed_steps
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker


def together(calls: int, threads: int, call):
    """Run ``call(i)`` for ``i`` in ``range(calls)`` from ``threads`` threads that start at
    once; each thread has its own connection (closed at its end). The results, by ``i``."""
    barrier = threading.Barrier(threads)
    per_thread = [list(range(t, calls, threads)) for t in range(threads)]

    def contender(indexes):
        try:
            barrier.wait()
            return [(i, call(i)) for i in indexes]
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        done = [pair for chunk in pool.map(contender, per_thread) for pair in chunk]
    return dict(done)


def runs_of(name: str, key: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(name=name, key=key).order_by("pk"))


def first_row(run_id: int) -> StepRun:
    return StepRun.objects.get(run_id=run_id, kind="step", seq=0)


def wait_until(condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("the condition did not hold in time")


@pytest.fixture
def key() -> str:
    return f"k-{uuid.uuid4().hex[:10]}"


# -- signal-with-start ---------------------------------------------------------------------------

def test_signal_or_start__32_concurrent_calls__one_run_and_32_signals_in_commit_order(
        worker, key):
    builder = keyed_steps.inbox("keyed_inbox")

    results = together(32, 32, lambda i: queuety.signal_or_start(builder, key, "event",
                                                                 {"n": i}))

    runs = runs_of("keyed_inbox", key)
    assert len(runs) == 1
    assert {result.run_id for result in results.values()} == {runs[0].pk}
    assert sum(result.started for result in results.values()) == 1
    stored = list(Signal.objects.filter(run_id=runs[0].pk).order_by("pk"))
    assert len(stored) == 32 and sorted(s.payload["n"] for s in stored) == list(range(32))
    # Each call's receipt names its own row; ids are taken under the key's lock, so their
    # order is the calls' commit order, and the times they were received follow it.
    assert {results[i].receipt.signal_id for i in range(32)} == {s.pk for s in stored}
    assert all(Signal.objects.get(pk=results[i].receipt.signal_id).payload == {"n": i}
               for i in range(32))
    received = [s.received_at for s in stored]
    assert received == sorted(received)
    # The first signal settled the wait the new run parked at; the others are kept.
    assert stored[0].consumed_by_step == "wait_for_event"
    assert queuety.workflow_status(runs[0].pk).current_step_name == "wait_for_close"
    queuety.signal(runs[0].pk, "close")
    assert wait_for(runs[0].pk, worker=worker).status == "completed"


def test_signal_or_start__a_live_run_gets_the_signal_and_a_finished_one_does_not(worker, key):
    first = queuety.signal_or_start(keyed_steps.gated("keyed_gate_sos"), key, "finish")
    assert first.started and first.receipt.run_id == first.run_id
    wait_for(first.run_id, worker=worker)  # the stored signal settles the wait: completed

    again = queuety.signal_or_start(keyed_steps.gated("keyed_gate_sos"), key, "finish", {})
    assert again.started and again.run_id != first.run_id
    with pytest.raises(queuety.InvalidPayload, match="No wait of workflow 'keyed_gate_sos' "
                                                     "listens for signal 'nope'"):
        queuety.signal_or_start(keyed_steps.gated("keyed_gate_sos"), key, "nope")


# -- debounce -----------------------------------------------------------------------------------

def test_debounce__100_concurrent_starts__one_run_with_the_last_payload_after_the_quiet(
        worker, key):
    builder = keyed_steps.plain("keyed_debounce")

    results = together(100, 25, lambda i: builder.dispatch({"n": i}, key=key, debounce=3))

    runs = runs_of("keyed_debounce", key)
    assert len(runs) == 1 and set(results.values()) == {runs[0].pk}
    run_id = runs[0].pk
    events = list(Event.objects.filter(run_id=run_id, kind__in=(
        "workflow_started", "debounce_extended")).order_by("pk"))
    # Every start folded into the one run, each replacing its state: the last one's stays.
    assert len(events) == 100
    assert sorted(e.data["state"]["n"] for e in events) == list(range(100))
    last = events[-1]
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed"
    assert status.state["n"] == last.data["state"]["n"]
    started = first_row(run_id).claimed_at
    assert (started - last.created_at).total_seconds() >= 3 - 0.05
    assert (started - events[0].created_at).total_seconds() >= 3


def test_debounce__a_start_after_the_run_started__debounces_a_new_run(worker, key):
    builder = keyed_steps.plain("keyed_debounce_again")
    first = builder.dispatch({"n": 1}, key=key, debounce=0.5)
    wait_for(first, worker=worker)

    second = builder.dispatch({"n": 2}, key=key, debounce=0.5)

    assert second != first
    assert wait_for(second, worker=worker).state["n"] == 2


# -- singleton ----------------------------------------------------------------------------------

def parked(run_id: int, worker) -> None:
    assert wait_for(run_id, ("waiting_for_signal",), worker=worker).current_step == 1


def starter() -> APIClient:
    user = User.objects.create_user(f"u{uuid.uuid4().hex[:10]}")
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="queuety",
        codename__in=("view_workflowrun", "add_workflowrun")))
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


def test_rest_start__a_debounced_start_joins_the_pending_run__200_not_created(key):
    client = starter()
    body = {"workflow": "reg_keyed_gate", "payload": {"n": 1}, "key": key, "debounce": 30}
    first = client.post("/queuety/api/runs/", data=json.dumps(body),
                        content_type="application/json")
    joined = client.post("/queuety/api/runs/", data=json.dumps({**body, "payload": {"n": 2}}),
                         content_type="application/json")

    assert first.status_code == 201 and first.json()["created"] is True
    assert joined.status_code == 200 and joined.json()["created"] is False
    run = joined.json()["run"]
    assert run["id"] == first.json()["run"]["id"] and run["state"] == {"n": 2}
    queuety.cancel(run["id"])


def test_singleton_reject__raises_run_conflict_and_the_rest_api_answers_409(worker, key):
    first = queuety.start("reg_keyed_gate", {}, key=key, singleton=True)
    parked(first, worker)

    with pytest.raises(queuety.RunConflict, match=f"Run {first} of workflow 'reg_keyed_gate' "
                                                  f"with key '{key}' is still live"):
        queuety.start("reg_keyed_gate", {}, key=key, singleton=True, on_conflict="reject")
    client = starter()
    answer = client.post("/queuety/api/runs/", data=json.dumps(
        {"workflow": "reg_keyed_gate", "payload": {}, "key": key, "singleton": True}),
        content_type="application/json")

    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert body["code"] == "run_conflict" and body["run_id"] == first and body["key"] == key
    assert f"Run {first} of workflow 'reg_keyed_gate'" in body["detail"]
    assert len(runs_of("reg_keyed_gate", key)) == 1
    bad = client.post("/queuety/api/runs/", data=json.dumps(
        {"workflow": "reg_keyed_gate", "key": key, "on_conflict": "report"}),
        content_type="application/json")
    assert bad.status_code == 400 and "idempotency-key option" in bad.json()["detail"]
    admin = Client()
    admin.force_login(User.objects.create_superuser(f"a{uuid.uuid4().hex[:10]}"))
    page = admin.post("/admin/queuety/workflowrun/start/reg_keyed_gate/",
                      {"payload": "{}", "key": key, "singleton": "reject"})
    assert page.status_code == 400
    assert f"Run {first} of workflow &#x27;reg_keyed_gate&#x27; with key" in page.content.decode()
    assert len(runs_of("reg_keyed_gate", key)) == 1
    queuety.signal(first, "finish")
    wait_for(first, worker=worker)
    # Once it finished, the key is free again.
    assert queuety.start("reg_keyed_gate", {}, key=key, singleton=True) != first


def test_singleton_queue__the_second_run_starts_when_the_first_ends(worker, key):
    builder = keyed_steps.gated("keyed_queue")
    first = builder.dispatch({}, key=key, singleton=True)
    parked(first, worker)

    second = builder.dispatch({}, key=key, singleton=True, on_conflict="queue")
    third = builder.dispatch({}, key=key, singleton=True, on_conflict="queue")

    time.sleep(1)
    assert first_row(second).status == "held" and first_row(third).status == "held"
    queuety.signal(first, "finish")
    done = wait_for(first, worker=worker)
    parked(second, worker)
    assert first_row(second).claimed_at >= done.finished_at
    assert first_row(third).status == "held"  # behind the second, which is live now
    queuety.cancel(second)  # a cancel ends it too
    parked(third, worker)


def test_singleton_queue__a_start_racing_the_live_runs_end_is_never_stranded(worker, key):
    # The live run's one step ends by the one-statement completion while the queued start
    # locks it: whichever commits first, the queued run starts (never left held).
    builder = keyed_steps.plain("keyed_queue_race")
    queued = 0
    for attempt in range(12):
        first = builder.dispatch({}, key=f"{key}-{attempt}", singleton=True)
        time.sleep(0.01 * attempt)
        second = builder.dispatch({}, key=f"{key}-{attempt}", singleton=True,
                                  on_conflict="queue")
        assert wait_for(second, worker=worker, timeout=15).status == "completed"
        assert queuety.workflow_status(first).status == "completed"
        kinds = set(Event.objects.filter(run_id=second).values_list("kind", flat=True))
        assert ("keyed_run_queued" in kinds) == ("keyed_run_released" in kinds)
        queued += "keyed_run_queued" in kinds
    assert queued  # the early ones found the first run live (they are the race's other side)


def test_singleton_replace__cancels_the_live_run_with_its_compensation(worker, key):
    builder = keyed_steps.gated("keyed_replace")
    first = builder.dispatch({}, key=key, singleton=True)
    parked(first, worker)

    second = builder.dispatch({}, key=key, singleton=True, on_conflict="replace")

    assert second != first
    assert queuety.workflow_status(first).status == "cancelled"
    wait_until(lambda: StepRun.objects.filter(run_id=first, kind="compensation",
                                              status="completed").exists())
    parked(second, worker)
    assert [run.pk for run in runs_of("keyed_replace", key) if run.status != "cancelled"] == \
        [second]


def test_singleton_signal__the_payload_goes_to_the_live_run(worker, key):
    builder = keyed_steps.gated("keyed_signal")
    first = builder.dispatch({}, key=key, singleton=True)
    parked(first, worker)

    again = builder.dispatch({"reason": "done"}, key=key, singleton=True,
                             on_conflict="signal", signal="finish")

    assert again == first
    status = wait_for(first, worker=worker)
    assert status.status == "completed" and status.state["reason"] == "done"
    assert len(runs_of("keyed_signal", key)) == 1


# -- batch --------------------------------------------------------------------------------------

def test_batch__max_items_closes_a_batch_and_items_keep_their_order(worker, key):
    builder = keyed_steps.plain("keyed_batch_items")
    batch = queuety.Batch(max_items=3, max_wait=60)

    ids = [builder.dispatch({"n": i}, key=key, batch=batch) for i in range(7)]

    assert ids[:3] == [ids[0]] * 3 and ids[3:6] == [ids[3]] * 3 and ids[6] not in ids[:6]
    assert wait_for(ids[0], worker=worker).state["items"] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert wait_for(ids[3], worker=worker).state["items"] == [{"n": 3}, {"n": 4}, {"n": 5}]
    time.sleep(1)
    assert queuety.workflow_status(ids[6]).state == {"items": [{"n": 6}]}
    assert first_row(ids[6]).status == "pending" and first_row(ids[6]).attempt == 0


def test_batch__max_wait_closes_a_batch(worker, key):
    builder = keyed_steps.plain("keyed_batch_wait")
    batch = queuety.Batch(max_items=100, max_wait=1.5)

    first = builder.dispatch({"n": "a"}, key=key, batch=batch)
    second = builder.dispatch({"n": "b"}, key=key, batch=batch)

    assert second == first
    status = wait_for(first, worker=worker)
    assert status.state["items"] == [{"n": "a"}, {"n": "b"}]
    opened = Event.objects.get(run_id=first, kind="workflow_started").created_at
    assert (first_row(first).claimed_at - opened).total_seconds() >= 1.5


def test_batch__concurrent_items__each_in_exactly_one_full_batch(worker, key):
    builder = keyed_steps.plain("keyed_batch_race")
    batch = queuety.Batch(max_items=5, max_wait=60)

    results = together(20, 20, lambda i: builder.dispatch({"n": i}, key=key, batch=batch))

    runs = runs_of("keyed_batch_race", key)
    assert len(runs) == 4 and set(results.values()) == {run.pk for run in runs}
    items = []
    for run in runs:
        state = wait_for(run.pk, worker=worker).state
        assert len(state["items"]) == 5
        items += [item["n"] for item in state["items"]]
        assert all(results[item["n"]] == run.pk for item in state["items"])
    assert sorted(items) == list(range(20))


def test_singleton_queue__a_live_run_that_died_before_releasing_is_released_by_the_sweep(
        worker, key):
    from queuety.runtime import finish

    builder = keyed_steps.gated("keyed_queue_stranded")
    first = builder.dispatch({}, key=key, singleton=True)
    parked(first, worker)
    second = builder.dispatch({}, key=key, singleton=True, on_conflict="queue")
    # The live run's process died between its completion and the release: finished, with
    # the queued run still held.
    WorkflowRun.objects.filter(pk=first).update(status="cancelled")
    assert first_row(second).status == "held"

    released = finish.release_stranded(timezone.now())

    assert released >= 1
    parked(second, worker)
    assert Event.objects.filter(run_id=second, kind="keyed_run_released").count() == 1
    queuety.cancel(second)


def test_rest_start__a_key_whose_live_run_is_another_users_is_refused_before_any_write(key):
    other = queuety.start("reg_keyed_gate", {"n": 1}, key=key, debounce=30)
    before = WorkflowRun.objects.get(pk=other).state
    client = starter()
    body = {"workflow": "reg_keyed_gate", "payload": {"n": 2}, "key": key, "debounce": 30}

    # A scope in which this user sees none of the runs: the live one is another tenant's.
    with override_settings(QUEUETY={**TEST_QUEUETY,
                                    "RUN_SCOPE": lambda user, runs: runs.none()}):
        answer = client.post("/queuety/api/runs/", data=json.dumps(body),
                             content_type="application/json")

    assert answer.status_code == 409 and answer.json()["code"] == "run_conflict"
    assert str(other) not in answer.content.decode()
    assert WorkflowRun.objects.get(pk=other).state == before  # not folded into it
    queuety.cancel(other)
