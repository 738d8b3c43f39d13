"""Streaming steps: chunks stored as they are yielded, kept across attempts (a worker
SIGKILLed mid-stream included), readable while the step runs through the Python API, the CLI,
the REST API and Server-Sent Events; against PostgreSQL and a real worker."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from rest_framework.test import APIClient

import queuety
from queuety.models import Artifact, Event, StepChunk, StepRun
from tests import streaming_steps as steps
from tests import workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

API = "/queuety/api"
RETRY = queuety.RetryPolicy(max_attempts=3, initial_delay=0.05, retry_on=[ConnectionError])


def wait_until(predicate, timeout=30, message="condition"):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.05)
    return found


def kinds(run_id):
    return list(Event.objects.filter(run_id=run_id).order_by("pk").values_list("kind",
                                                                             flat=True))


def stored(run_id):
    return list(StepChunk.objects.filter(run_id=run_id).order_by("index")
                .values_list("index", "content", "attempt"))


@pytest.fixture
def reader() -> APIClient:
    user = User.objects.create_user(f"s{uuid.uuid4().hex[:10]}", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun",
                                                     content_type__app_label="queuety"))
    client = APIClient()
    client.force_authenticate(User.objects.get(pk=user.pk))
    return client


def test_generator_step__each_chunk_stored_then_on_complete_output_merged(worker, token):
    run_id = (queuety.workflow("stream_basic").then(steps.Tokens).then(workflows.step_a)
              .dispatch({"token": token, "n": 5}))
    status = wait_for(run_id, worker=worker)

    assert status.status == "completed", status.error
    assert status.state["text"] == "t0 t1 t2 t3 t4 " and status.state["count"] == 5
    assert stored(run_id) == [(i, json.dumps(f"t{i} "), 1) for i in range(5)]
    page = queuety.chunks(run_id, "Tokens")
    assert page.finished and page.step_status == "completed"
    assert [c["content"] for c in page.chunks] == [f"t{i} " for i in range(5)]
    assert queuety.chunks(run_id, 0, after=2).chunks[0]["index"] == 3
    assert workflows.marks(f"{token}-resume")[0].split()[1] == "1:0"


def test_generator_function__its_return_value_is_the_output(worker, token):
    run_id = queuety.workflow("stream_return").then(steps.counted_tokens) \
        .dispatch({"token": token, "n": 3})
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed", status.error
    assert status.state["streamed"] == 3
    assert [c["content"] for c in queuety.chunks(run_id, "counted_tokens").chunks] == [
        {"i": 0}, {"i": 1}, {"i": 2}]


def test_async_generator_step__streams_and_completes(worker, token):
    run_id = queuety.workflow("stream_async").then(steps.AsyncTokens) \
        .dispatch({"token": token, "words": ["durable", "async", "tokens"]})
    status = wait_for(run_id, worker=worker)
    assert status.status == "completed", status.error
    assert status.state["sentence"] == "durable async tokens"
    assert [c[1] for c in stored(run_id)] == ['"durable"', '"async"', '"tokens"']


def test_failed_attempt__keeps_its_chunks_and_the_retry_resumes_after_them(worker, token):
    run_id = queuety.workflow("stream_retry").then(steps.FailAfterTwo, retry=RETRY) \
        .dispatch({"token": token})
    status = wait_for(run_id, worker=worker)

    assert status.status == "completed", status.error
    assert status.state["numbers"] == [0, 1, 2, 3]
    assert [line.split()[1] for line in workflows.marks(f"{token}-given")] == ["1:0", "2:2"]
    assert [(i, a) for i, _, a in stored(run_id)] == [(0, 1), (1, 1), (2, 2), (3, 2)]
    assert kinds(run_id) == ["workflow_started", "step_retried", "step_completed",
                             "workflow_completed"]


def test_sigkill_mid_stream__chunks_kept_and_the_next_attempt_resumes(worker, token):
    run_id = (queuety.workflow("stream_killed").then(steps.Tokens, retry=RETRY)
              .then(workflows.step_a)
              .dispatch({"token": token, "n": 6, "hang_at": 3}))
    pool_pid = wait_until(lambda: steps.pid_of_hang(token), message="the hanging stream")
    # The three chunks yielded become durable while the attempt hangs (within the writer's
    # CHUNK_FLUSH_INTERVAL), before anything is recorded.
    started = time.monotonic()
    wait_until(lambda: len(stored(run_id)) == 3, timeout=5, message="three stored chunks")
    assert time.monotonic() - started < 2
    assert [c[1] for c in stored(run_id)] == ['"t0 "', '"t1 "', '"t2 "']
    assert StepRun.objects.get(run_id=run_id, step_name="Tokens").status == "processing"
    assert not Artifact.objects.filter(run_id=run_id, visible=True).exists()

    os.kill(pool_pid, signal.SIGKILL)
    status = wait_for(run_id, timeout=90, worker=worker)

    assert status.status == "completed", status.error
    assert status.state["text"] == "t0 t1 t2 t3 t4 t5 " and status.state["count"] == 6
    assert [(i, a) for i, _, a in stored(run_id)] == [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2),
                                                      (5, 2)]
    assert [line.split()[1] for line in workflows.marks(f"{token}-resume")] == ["1:0", "2:3"]
    lost = Event.objects.get(run_id=run_id, kind="step_retried")
    assert lost.data["error"]["type"] == "queuety.exceptions.WorkerLost"
    # The killed attempt's artifact never became visible; the retry's replaced it: one row.
    assert list(Artifact.objects.filter(run_id=run_id).values_list("key", "visible")) == [
        ("partial", True)]
    assert queuety.artifact(run_id, "partial")["content"] == "attempt 2"
    assert len(workflows.marks(f"{token}-a")) == 1


def test_timeout__interrupts_a_stream_and_keeps_what_it_yielded(worker, token):
    run_id = queuety.workflow("stream_timeout").then(steps.EndlessTokens) \
        .dispatch({"token": token})
    status = wait_for(run_id, timeout=30, worker=worker)

    assert status.status == "failed"
    assert status.error["type"] == "queuety.exceptions.StepTimeout"
    kept = stored(run_id)
    assert 3 <= len(kept) <= 8, kept  # 0.2 s a chunk for 1.5 s
    assert [c[1] for c in kept] == [json.dumps(f"t{i}") for i in range(len(kept))]
    assert "never" not in status.state


def test_chunks__readable_while_the_step_runs(worker, token, reader):
    run_id = queuety.workflow("stream_live").then(steps.Tokens) \
        .dispatch({"token": token, "n": 8, "pause": 0.25})
    page = wait_until(lambda: (p := queuety.chunks(run_id, "Tokens")).chunks and
                      len(p.chunks) >= 2 and p, message="two chunks")
    assert not page.finished and page.step_status == "processing"

    response = reader.get(f"{API}/runs/{run_id}/steps/Tokens/chunks/", {"after": 0})
    assert response.status_code == 200
    body = response.json()
    assert body["step_name"] == "Tokens" and body["chunks"][0]["index"] == 1
    assert body["chunks"][0]["content"] == "t1 " and body["chunks"][0]["attempt"] == 1

    assert wait_for(run_id, worker=worker).status == "completed"
    done = reader.get(f"{API}/runs/{run_id}/steps/0/chunks/", {"limit": 3}).json()
    assert len(done["chunks"]) == 3 and done["finished"] is False  # more to read
    rest = reader.get(f"{API}/runs/{run_id}/steps/0/chunks/", {"after": 2}).json()
    assert [c["index"] for c in rest["chunks"]] == [3, 4, 5, 6, 7] and rest["finished"]
    out = StringIO()
    call_command("queuety", "workflow", "chunks", str(run_id), "Tokens", stdout=out)
    assert out.getvalue().strip() == "t0 t1 t2 t3 t4 t5 t6 t7"


def test_chunk_endpoints__errors(worker, token, reader):
    run_id = queuety.workflow("stream_errors").then(workflows.step_a) \
        .dispatch({"token": token})
    wait_for(run_id, worker=worker)
    missing = reader.get(f"{API}/runs/{run_id}/steps/nope/chunks/")
    assert (missing.status_code, missing.json()["code"]) == (404, "step_not_found")
    assert "has no step 'nope'; its steps are step_a" in missing.json()["detail"]
    assert reader.get(f"{API}/runs/{run_id}/steps/step_a/chunks/",
                      {"after": "x"}).status_code == 400
    assert reader.get(f"{API}/runs/999999999/steps/a/chunks/").status_code == 404
    with pytest.raises(queuety.UnknownStep):
        queuety.chunks(run_id, 5)
    assert queuety.chunks(run_id, "step_a").chunks == []  # a plain step streams nothing


def read_events(response, until_end=True):
    """Parse a Server-Sent Events response into (event, id, data) tuples, as they come."""
    buffer = ""
    for part in response.streaming_content:
        buffer += part.decode() if isinstance(part, bytes) else part
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.splitlines()
                          if ": " in line and not line.startswith(":"))
            if "event" in fields:
                yield fields.get("event"), fields.get("id"), fields.get("data")


def test_sse__pushes_chunks_as_they_are_stored_then_ends(worker, token, reader):
    run_id = queuety.workflow("stream_sse").then(steps.Tokens) \
        .dispatch({"token": token, "n": 6, "pause": 0.3})
    response = reader.get(f"{API}/runs/{run_id}/steps/Tokens/chunks/stream/",
                          HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"

    events = read_events(response)
    first = next(events)
    # The first token arrives while the step is still streaming the others.
    assert first == ("chunk", "0", '"t0 "')
    assert StepRun.objects.get(run_id=run_id, step_name="Tokens").status == "processing"
    rest = list(events)
    assert [e[1] for e in rest[:-1]] == ["1", "2", "3", "4", "5"]
    assert rest[-1] == ("end", None, '{"status": "completed"}')

    # A reconnecting EventSource sends the last id it saw: only later chunks come.
    again = reader.get(f"{API}/runs/{run_id}/steps/Tokens/chunks/stream/",
                       HTTP_ACCEPT="text/event-stream", HTTP_LAST_EVENT_ID="3")
    assert [e[1] for e in read_events(again)] == ["4", "5", None]


def test_sse__needs_the_view_permission(worker, token):
    run_id = queuety.workflow("stream_sse_denied").then(workflows.step_a) \
        .dispatch({"token": token})
    stranger = APIClient()
    stranger.force_authenticate(User.objects.create_user(f"n{uuid.uuid4().hex[:10]}"))
    response = stranger.get(f"{API}/runs/{run_id}/steps/step_a/chunks/stream/",
                            HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 403
    anonymous = APIClient().get(f"{API}/runs/{run_id}/steps/step_a/chunks/stream/",
                                HTTP_ACCEPT="text/event-stream")
    assert anonymous.status_code in (401, 403)


def test_generator_in_a_for_each__fails_with_a_clear_error(worker, token):
    run_id = (queuety.workflow("stream_in_item")
              .for_each("items", steps.stream_in_branch, "out")
              .dispatch({"token": token, "items": [1]}))
    status = wait_for(run_id, worker=worker)
    assert status.status == "failed"
    assert "is a generator (a streaming step), which only a then() step can be" in \
        status.error["message"]


@pytest.mark.parametrize("interval", [0, 0.05])
def test_attempt_that_lost_its_row__stores_no_more_chunks_and_stops(token, interval):
    from django.test import override_settings

    from queuety import publish
    from queuety.runtime.attempt import execute_step
    from tests.settings import QUEUETY as TEST_QUEUETY

    # In this process (the real attempt code on PostgreSQL), so the interval can be set.
    with override_settings(QUEUETY={**TEST_QUEUETY, "CHUNK_FLUSH_INTERVAL": interval}):
        with publish.captured():
            run_id = queuety.workflow("stream_taken_back").then(steps.TakenBack) \
                .dispatch({"token": token})
        row = StepRun.objects.get(run_id=run_id)
        execute_step(row.pk, inline=False)

    assert [c[1] for c in stored(run_id)] == ['"kept-0"', '"kept-1"']
    row.refresh_from_db()
    # Its outcome (WorkerLost) could not be recorded either: the row is the other owner's.
    assert (row.status, row.claimed_by) == ("processing", "elsewhere:1")
    assert kinds(run_id) == ["workflow_started"]
    queuety.cancel(run_id)


def test_admin_run_page__counts_each_step_rows_chunks_and_shows_them(worker, token):
    from django.test import Client

    run_id = queuety.workflow("stream_admin").then(steps.Tokens).then(workflows.step_a) \
        .dispatch({"token": token, "n": 4})
    assert wait_for(run_id, worker=worker).status == "completed"
    row = StepRun.objects.get(run_id=run_id, step_name="Tokens")
    client = Client()
    client.force_login(User.objects.create_superuser(f"adm{uuid.uuid4().hex[:8]}"))

    html = client.get(f"/admin/queuety/workflowrun/{run_id}/change/").content.decode()
    link = f"/admin/queuety/workflowrun/{run_id}/chunks/{row.pk}/"
    assert f'href="{link}" class="q-chunks">4 streamed</a>' in html
    shown = client.get(link).json()
    assert shown["step_name"] == "Tokens"
    assert [(c["index"], c["content"]) for c in shown["chunks"]] == [
        (i, f"t{i} ") for i in range(4)]
    other = StepRun.objects.exclude(run_id=run_id).values_list("pk", flat=True).first()
    assert client.get(f"/admin/queuety/workflowrun/{run_id}/chunks/{other}/").status_code \
        == 404


def test_sse__of_a_step_that_cannot_stream_ends_at_once(worker, token, reader):
    run_id = queuety.workflow("stream_wait").wait_for_approval().then(workflows.step_a) \
        .dispatch({"token": token})
    wait_for(run_id, ("waiting_for_signal",), worker=worker)
    started = time.monotonic()
    response = reader.get(f"{API}/runs/{run_id}/steps/0/chunks/stream/",
                          HTTP_ACCEPT="text/event-stream")
    assert list(read_events(response)) == [("end", None, '{"status": null}')]
    assert time.monotonic() - started < 5
    queuety.cancel(run_id)
