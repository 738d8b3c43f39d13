"""The step boundary end to end: PostgreSQL, a real prefork Celery worker, the sweeper."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import queuety
from queuety import publish, signals
from queuety.models import Event, StepRun, WorkflowDefinition, WorkflowRun
from queuety.runtime import attempt
from queuety.store.definitions import definition_id
from queuety.tasks import execute_step
from queuety.webhooks import outbox
from tests import tag_steps, timeout_steps, workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker


def three_steps():
    return (queuety.workflow("three_steps")
            .then(workflows.step_a).then(workflows.StepB).then("tests.workflows.step_c"))


def kinds(run_id: int) -> list[str]:
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind", flat=True))


def test_three_steps__complete_with_merged_state(worker, token):
    run_id = three_steps().dispatch({"token": token, "order": 7})

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed"
    assert status.state == {"token": token, "order": 7, "log": ["a", "b", "c"],
                            "done_a": True, "done_b": True, "done_c": True}
    assert (status.current_step, status.total_steps, status.current_step_name) == (3, 3, None)
    assert status.error is None and status.finished_at is not None
    assert kinds(run_id) == ["workflow_started", "step_completed", "step_completed",
                             "step_completed", "workflow_completed"]
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.definition.definition_hash == status.definition_hash == \
        three_steps().build().definition_hash
    assert list(StepRun.objects.filter(run_id=run_id).order_by("seq")
                .values_list("step_name", "status", "attempt")) == [
        ("step_a", "completed", 1), ("StepB", "completed", 1), ("step_c", "completed", 1)]


def test_definitions__one_row_per_shape(worker, token):
    first = three_steps().dispatch({"token": token})
    second = three_steps().dispatch({"token": token})
    other = queuety.workflow("three_steps").then(workflows.step_a).dispatch({"token": token})

    runs = WorkflowRun.objects.in_bulk([first, second, other])
    assert runs[first].definition_id == runs[second].definition_id != runs[other].definition_id
    assert WorkflowDefinition.objects.filter(name="three_steps").count() >= 2
    for run_id in (first, second, other):
        wait_for(run_id, worker=worker)


def test_next_step__jumps_over_steps_and_drops_reserved_keys(worker, token):
    run_id = (queuety.workflow("jumping")
              .then(workflows.step_a).then(workflows.jump_to_c).then(workflows.step_b)
              .then(workflows.step_c).dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed"
    assert status.state["log"] == ["a", "jump", "c"]
    assert "_ignored_reserved" not in status.state and "_next_step" not in status.state
    assert workflows.marks(f"{token}-b") == []
    assert status.current_step == status.total_steps == 4


def test_next_step__unknown_name_fails_the_run_with_that_name(worker, token):
    run_id = (queuety.workflow("bad_jump")
              .then(workflows.step_a).then(workflows.jump_to_nowhere).then(workflows.step_c)
              .dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.UnknownStep"
    assert "'no_such_step'" in status.error["message"]
    assert "'step_a', 'jump_to_nowhere', 'step_c'" in status.error["message"]
    assert status.error["step"] == "jump_to_nowhere" and status.error["attempt"] == 1
    assert status.state["log"] == ["a"]
    assert workflows.marks(f"{token}-c") == []
    assert kinds(run_id)[-2:] == ["step_failed", "workflow_failed"]


def test_duplicate_messages__run_the_handler_once(worker, token):
    run_id = (queuety.workflow("duplicates").then(workflows.slow).then(workflows.step_a)
              .dispatch({"token": token, "sleep": 1.0}))
    first = StepRun.objects.get(run_id=run_id, seq=0)

    # Two extra deliveries of the same step: one while it runs, one after it completed.
    execute_step.apply_async((first.pk,))
    time.sleep(0.3)
    execute_step.apply_async((first.pk,))
    wait_for(run_id, worker=worker)
    execute_step.apply_async((first.pk,))
    last = StepRun.objects.get(run_id=run_id, seq=1)
    execute_step.apply_async((last.pk,))
    time.sleep(1.5)

    assert len(workflows.marks(f"{token}-slow")) == 1
    assert len(workflows.marks(f"{token}-a")) == 1
    status = queuety.workflow_status(run_id)
    assert status.status == "completed" and status.state["log"] == ["a"]
    assert kinds(run_id).count("step_completed") == 2


def start_hanging_run(name: str, token: str) -> tuple[int, int]:
    """Dispatch step_a -> hang_first_time -> step_c; return the run and the pid of the pool
    process once it is inside the hanging step."""
    run_id = (queuety.workflow(name)
              .then(workflows.step_a).then(workflows.hang_first_time).then(workflows.step_c)
              .dispatch({"token": token}))
    deadline = time.monotonic() + 30
    while not workflows.marks(f"{token}-hang"):
        assert time.monotonic() < deadline, "the hanging step never started"
        time.sleep(0.05)
    return run_id, int(workflows.marks(f"{token}-hang")[0].split()[0])


def test_sigkill_mid_step__sweeper_recovers_and_each_output_merges_once(worker, token):
    run_id, pool_pid = start_hanging_run("crashing", token)

    os.kill(pool_pid, signal.SIGKILL)
    status = wait_for(run_id, timeout=60, worker=worker)

    assert status.status == "completed", status.error
    assert status.state == {"token": token, "log": ["a", "c"], "done_a": True, "done_c": True,
                            "hung_once": True}
    executions = workflows.marks(f"{token}-hang")
    assert len(executions) == 2 and executions[1].split()[0] != str(pool_pid)
    hang = StepRun.objects.get(run_id=run_id, step_name="hang_first_time")
    assert (hang.status, hang.attempt) == ("completed", 2)
    timeline = list(Event.objects.filter(run_id=run_id).order_by("pk"))
    assert [e.kind for e in timeline] == ["workflow_started", "step_completed", "step_retried",
                                         "step_completed", "step_completed",
                                         "workflow_completed"]
    lost = timeline[2]
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    assert lost.attempt == 1 and lost.step_name == "hang_first_time"
    assert StepRun.objects.filter(run_id=run_id).count() == 3


def test_lost_message__sweeper_republishes_it(worker, token):
    with publish.captured() as swallowed:  # the broker "loses" the first message
        run_id = three_steps().dispatch({"token": token})
    assert len(swallowed) == 1

    status = wait_for(run_id, timeout=30, worker=worker)

    assert status.status == "completed"
    assert len(workflows.marks(f"{token}-a")) == 1


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "django-default"])
def test_step_boundary__query_count_is_pinned(token, monkeypatch, prepared):
    # With and without prepared statements (Django's OPTIONS["prepare_threshold"]: the demo
    # settings set it; Django leaves it off). Measured in this process. Dispatch is one statement. A step run from its own message is
    # the claim (one UPDATE) and the transition (one statement in autocommit, no BEGIN or
    # COMMIT); a step run inline after it is its transition alone, because the transition
    # before it inserted its row already claimed.
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "prepare_threshold",
                        5 if prepared else None)
    definition_id(three_steps().build())  # the definition row, once per process
    # The webhook endpoints the outbox subscribes: read once per process every 5 s, not per
    # step. Read now, and kept for the test: a refresh due in the middle of it (the last one
    # 4.9 s ago) would add a SELECT the step does not make.
    monkeypatch.setattr(outbox, "CACHE_SECONDS", 3600.0)
    outbox.forget()
    signals.sinks_want("run_started")
    with publish.captured() as sent:
        with CaptureQueriesContext(connection) as dispatched:
            run_id = three_steps().dispatch({"token": token})
        with CaptureQueriesContext(connection) as own_message:
            attempt.execute_step(sent[0].step_run_id, inline=False)
        with CaptureQueriesContext(connection) as inline:
            attempt.execute_step(sent[1].step_run_id)

    def statements(captured):
        return [q["sql"].split()[0] for q in captured.captured_queries]

    assert statements(dispatched) == ["WITH"]
    assert statements(own_message) == ["UPDATE", "WITH"]
    # The step that completes the run reads no waiters: nothing waits for this run.
    assert statements(inline) == ["UPDATE", "WITH", "WITH"]
    assert len(sent) == 2  # the last step ran inline: no message for it
    assert queuety.workflow_status(run_id).status == "completed"
    assert kinds(run_id) == ["workflow_started", "step_completed", "step_completed",
                             "step_completed", "workflow_completed"]


def test_step_boundary__a_tagging_step_costs_no_statement_and_keeps_inline(token, monkeypatch):
    # context.tag() rides on the transition's one statement (tags = tags || ...): the claim,
    # the tagging step's transition (which claims the next step for this process) and the
    # next step's transition, run inline; no message for it.
    tagging = (queuety.workflow("tagging_boundary").then(tag_steps.tags_plan)
               .then(tag_steps.plain))
    definition_id(tagging.build())
    monkeypatch.setattr(outbox, "CACHE_SECONDS", 3600.0)
    outbox.forget()
    signals.sinks_want("run_started")
    with publish.captured() as sent:
        run_id = tagging.dispatch({"token": token, "plan": "pro"}, tags={"stage": "given"})
        with CaptureQueriesContext(connection) as captured:
            attempt.execute_step(sent[0].step_run_id)
    assert [q["sql"].split()[0] for q in captured.captured_queries] == ["UPDATE", "WITH",
                                                                         "WITH"]
    assert len(sent) == 1  # the step after the tagging one ran inline
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "completed"
    assert run.tags == {"stage": "tagged", "plan": "pro"}
    completed = Event.objects.get(run_id=run_id, kind="step_completed", step_index=0)
    assert completed.data["tags"] == {"plan": "pro", "stage": "tagged"}


def test_inline__following_steps_run_in_the_same_process_without_messages(worker, token):
    run_id = three_steps().dispatch({"token": token})

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed" and status.state["log"] == ["a", "b", "c"]
    rows = list(StepRun.objects.filter(run_id=run_id).order_by("seq"))
    # The first step came with the dispatch's message; the transitions claimed the others
    # for the same pool process, so no message was ever published for them.
    assert rows[0].published_at is not None
    assert [r.published_at for r in rows[1:]] == [None, None]
    assert {r.claimed_by for r in rows} == {rows[0].claimed_by}
    assert [(r.status, r.attempt) for r in rows] == [("completed", 1)] * 3
    pids = {workflows.marks(f"{token}-{letter}")[0].split()[0] for letter in "abc"}
    assert len(pids) == 1


def test_inline__a_timed_step_gets_its_own_message(worker, token):
    run_id = (queuety.workflow("timed_middle").then(workflows.step_a)
              .then(workflows.step_b, timeout=5).then(workflows.step_c)
              .dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed" and status.state["log"] == ["a", "b", "c"]
    rows = list(StepRun.objects.filter(run_id=run_id).order_by("seq"))
    # The untimed first step's task has no hard limit to serve as the timed step's, so the
    # timed step gets its own message, which carries its limit; that limit covers its whole
    # task, which would cut the untimed step after it short, so that one gets its own too.
    assert [r.published_at is not None for r in rows] == [True, True, True]


def test_inline__timed_steps_follow_a_timed_step_whose_limit_serves_as_theirs(worker, token):
    run_id = (queuety.workflow("timed_chain").then(workflows.step_a, timeout=30)
              .then(workflows.step_b, timeout=30).then(workflows.step_c, timeout=30)
              .dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed" and status.state["log"] == ["a", "b", "c"]
    rows = list(StepRun.objects.filter(run_id=run_id).order_by("seq"))
    # The first message's hard limit (30 + grace + INLINE_SECONDS) comes within
    # INLINE_SECONDS after each following step's own: they run in the same task.
    assert [r.published_at is not None for r in rows] == [True, False, False]
    assert {r.claimed_by for r in rows} == {rows[0].claimed_by}
    assert [r.timeout for r in rows] == [30.0, 30.0, 30.0]


def test_inline__a_timed_step_whose_limit_the_task_cannot_serve_gets_its_own_message(
        worker, token):
    run_id = (queuety.workflow("timed_mismatch").then(workflows.step_a, timeout=5)
              .then(workflows.step_b, timeout=30).then(workflows.step_c, timeout=1)
              .dispatch({"token": token}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "completed"
    rows = list(StepRun.objects.filter(run_id=run_id).order_by("seq"))
    # b's hard limit would come after the task's (it would be killed early); c's long
    # before it (a stuck c would outlive its own limit by 29 s): both are published.
    assert [r.published_at is not None for r in rows] == [True, True, True]


def test_inline__a_timed_inline_step_is_interrupted_at_its_own_deadline(worker, token):
    run_id = (queuety.workflow("timed_inline_timeout").then(workflows.step_a, timeout=3)
              .then(timeout_steps.sync_block, timeout=3)
              .dispatch({"token": token, "body": 10}))

    status = wait_for(run_id, timeout=30, worker=worker)

    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    rows = list(StepRun.objects.filter(run_id=run_id).order_by("seq"))
    assert rows[1].published_at is None  # it ran inline, in the first step's task
    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    assert 3.0 <= (failed.created_at - rows[1].claimed_at).total_seconds() <= 4.5


def test_inline__a_step_on_another_queue_is_published_to_it(token):
    with publish.captured() as sent:
        run_id = (queuety.workflow("two_queues").then(workflows.step_a)
                  .then(workflows.step_b, queue="io-elsewhere")
                  .dispatch({"token": token}))
        attempt.execute_step(sent[0].step_run_id)

    rows = list(StepRun.objects.filter(run_id=run_id).order_by("seq"))
    assert [r.status for r in rows] == ["completed", "pending"]
    assert [m.queue for m in sent] == [None, "io-elsewhere"]
    assert sent[1].step_run_id == rows[1].pk


@pytest.mark.parametrize("limits, published", [
    ({}, [True, False, False]),
    ({"INLINE_STEPS": 2}, [True, False, True]),
    ({"INLINE_STEPS": 1}, [True, True, True]),
    ({"INLINE_SECONDS": 0.01}, [True, True, True]),  # every step sleeps longer than that
])
def test_inline__bounded_by_steps_and_time(token, settings, limits, published):
    settings.QUEUETY = {**settings.QUEUETY, **limits}
    with publish.captured() as sent:
        run_id = (queuety.workflow("bounded").then(workflows.slow, name="one")
                  .then(workflows.slow, name="two").then(workflows.slow, name="three")
                  .dispatch({"token": token, "sleep": 0.05}))
        done = 0
        while done < len(sent):
            attempt.execute_step(sent[done].step_run_id)
            done += 1

    assert queuety.workflow_status(run_id).status == "completed"
    rows = list(StepRun.objects.filter(run_id=run_id).order_by("seq"))
    assert [r.published_at is not None for r in rows] == published
    assert len(sent) == sum(published)
    assert [(r.status, r.attempt) for r in rows] == [("completed", 1)] * 3


def test_inline__sigkill_of_the_pool_process_mid_inline_step_recovers_it_once(worker, token):
    run_id, pool_pid = start_hanging_run("crashing_inline", token)
    first, hang = StepRun.objects.filter(run_id=run_id).order_by("seq")
    # The hanging step is running inline: claimed by the transition, never published.
    assert (hang.status, hang.published_at, hang.claimed_by) == (
        "processing", None, first.claimed_by)

    os.kill(pool_pid, signal.SIGKILL)
    status = wait_for(run_id, timeout=60, worker=worker)

    assert status.status == "completed", status.error
    assert status.state["log"] == ["a", "c"] and status.state["hung_once"] is True
    assert len(workflows.marks(f"{token}-a")) == 1 and len(workflows.marks(f"{token}-c")) == 1
    assert len(workflows.marks(f"{token}-hang")) == 2
    assert [e for e in kinds(run_id)] == ["workflow_started", "step_completed", "step_retried",
                                         "step_completed", "step_completed",
                                         "workflow_completed"]
    lost = Event.objects.get(run_id=run_id, kind="step_retried")
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    assert StepRun.objects.filter(run_id=run_id).count() == 3


def test_inline__sigkill_of_the_whole_worker_leaves_the_inline_step_to_the_sweeper(
        worker, token):
    run_id, _ = start_hanging_run("worker_killed_inline", token)
    hang = StepRun.objects.get(run_id=run_id, step_name="hang_first_time")
    assert hang.status == "processing" and hang.published_at is None

    # No main process survives to report the loss: only the stale heartbeat tells.
    worker.restart(signal.SIGKILL)
    status = wait_for(run_id, timeout=60, worker=worker)

    assert status.status == "completed", status.error
    assert len(workflows.marks(f"{token}-a")) == 1 and len(workflows.marks(f"{token}-c")) == 1
    assert len(workflows.marks(f"{token}-hang")) == 2
    hang.refresh_from_db()
    assert (hang.status, hang.attempt) == ("completed", 2)
    assert kinds(run_id).count("step_completed") == 3


def test_failed_step__fails_the_run_with_its_error(worker, token):
    run_id = (queuety.workflow("failing").then(workflows.step_a).then(workflows.boom)
              .dispatch({"token": token, "order": 42}))

    status = wait_for(run_id, worker=worker)

    assert status.status == "failed"
    assert status.error["type"] == "ValueError"
    assert status.error["message"] == "boom for order 42"
    assert status.current_step_name == "boom"
    # No policy anywhere: a plain exception is not retried.
    assert len(workflows.marks(f"{token}-boom")) == 1
    failed = Event.objects.get(run_id=run_id, kind="step_failed")
    assert "Traceback" in failed.data["error"]["traceback"]
    assert "boom for order 42" in failed.data["error"]["traceback"]


def test_dispatch__one_statement_writes_what_the_keyed_path_writes(token):
    # Dispatch without an idempotency key is one INSERT ... CTE; with a key it takes the ORM
    # path. Both must leave the same run, step row and event behind.
    builder = (queuety.workflow("dispatch_shapes").must_complete_within(seconds=60)
               .then(workflows.step_a, timeout=7).then(workflows.step_c))
    with publish.captured() as sent:
        plain = builder.dispatch({"token": token})
        keyed = builder.idempotency_key(f"shape-{token}").dispatch({"token": token})
    assert [m.step_run_id for m in sent] == [
        StepRun.objects.get(run_id=plain).pk, StepRun.objects.get(run_id=keyed).pk]
    assert sent[0]._replace(step_run_id=0) == sent[1]._replace(step_run_id=0)

    def shape(run_id):
        run = WorkflowRun.objects.filter(pk=run_id).values().get()
        step = StepRun.objects.filter(run_id=run_id).values().get()
        event = Event.objects.filter(run_id=run_id).values().get()
        assert abs(run["deadline_at"] - run["created_at"] - timedelta(seconds=60)) < \
            timedelta(seconds=1)
        assert abs(step["available_at"] - step["created_at"]) < timedelta(seconds=1)
        assert step["published_at"] == step["available_at"]
        for row, volatile in ((run, ("id", "idempotency_key", "created_at", "updated_at",
                                     "deadline_at")),
                              (step, ("id", "run_id", "available_at", "published_at",
                                      "created_at")),
                              (event, ("id", "run_id", "created_at"))):
            for key in volatile:
                row.pop(key)
        event["data"].pop("idempotency_key")
        return run, step, event

    assert shape(plain) == shape(keyed)
