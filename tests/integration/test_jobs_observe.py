"""Jobs' lifecycle signals, webhooks and metrics, on PostgreSQL and a real prefork worker.

The jobs run on a worker of their own (its queue is tests.job_tasks.OBSERVED_QUEUE, which the
observed tasks name in their job options), started with ``QUEUETY_TEST_OBSERVERS=1`` (every
Queuety signal it sends is written to ``$QUEUETY_TEST_DIR/signals``, see tests/observers) and
``PROMETHEUS_MULTIPROC_DIR`` (it counts into that directory, read here by the exposition).
Webhook deliveries go through the session worker to an HTTP server in this process.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Imported before PROMETHEUS_MULTIPROC_DIR is set below: this process's own values stay
# in-memory ones, while the exposition reads the worker's files from the directory.
import prometheus_client  # noqa: F401
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import queuety
from queuety import metrics, publish, signals
from queuety.models import WebhookDelivery, WebhookEndpoint, WorkflowRun
from queuety.runtime import attempt, finish
from queuety.store.definitions import load_spec
from queuety.webhooks import outbox, signing
from tests import job_tasks, workflows
from tests.integration.conftest import Worker, wait_for
from tests.workflows import marks_dir

SECRET = "whsec-" + "jobs-never-logged-0123456789"


@pytest.fixture(scope="module")
def observed(db_session, tmp_path_factory):
    folder = tmp_path_factory.mktemp("job-metrics")
    handle = Worker(tmp_path_factory.mktemp("jobs-observed"), queue=job_tasks.OBSERVED_QUEUE,
                    concurrency=2, beat=False)
    handle.env["QUEUETY_TEST_OBSERVERS"] = "1"
    handle.env["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    handle.start()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    yield handle
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    handle.stop()


def seen(run_id: int, name: str | None = None) -> list[dict]:
    """The signals the observed worker sent about run ``run_id``."""
    path = marks_dir() / "signals"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line.get("run_id") == run_id
            and (name is None or line["signal"] == name)]


def job_signals(run_id: int) -> list[str]:
    return [line["signal"] for line in seen(run_id) if line["signal"].startswith("job_")]


def eventually(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def finished(result, worker) -> int:
    run_id = int(result.id)
    wait_for(run_id, worker=worker)
    return run_id


def test_a_job__sends_job_completed_once_with_its_run_completed(observed, token):
    run_id = finished(job_tasks.observed_add.enqueue(token, 2, b=3), observed)

    [completed] = eventually(lambda: seen(run_id, "job_completed"))
    assert {k: completed[k] for k in ("result_id", "run_id", "task", "sender")} == {
        "result_id": str(run_id), "run_id": run_id, "task": "tests.job_tasks.observed_add",
        "sender": "WorkflowRun"}
    time.sleep(0.5)  # nothing more arrives
    assert job_signals(run_id) == ["job_completed"]
    assert len(seen(run_id, "run_completed")) == 1
    # The receiver connected first raises: logged, and the job was recorded regardless.
    assert "raised RuntimeError: this receiver always raises" in observed.log()


def test_a_retried_job__sends_job_failed_for_the_failed_attempt_then_completes(observed,
                                                                               token):
    run_id = finished(job_tasks.observed_flaky.enqueue(token), observed)

    eventually(lambda: seen(run_id, "job_completed"))
    assert job_signals(run_id) == ["job_failed", "job_completed"]
    [failed] = seen(run_id, "job_failed")
    assert (failed["attempt"], failed["max_attempts"], failed["retry_in"]) == (1, 2, 0.1)
    assert failed["error"]["type"] == "ConnectionError"
    assert failed["error"]["message"] == f"first attempt of {token} fails"
    assert queuety.workflow_status(run_id).state["return_value"] == 2


def test_a_job_out_of_attempts__is_buried_once(observed, token):
    run_id = finished(job_tasks.observed_fails.enqueue(token), observed)

    [buried] = eventually(lambda: seen(run_id, "job_buried"))
    time.sleep(0.5)
    # The first attempt is retried (job_failed); the second is the last: no job_failed, but
    # the job is buried with its run's error.
    assert job_signals(run_id) == ["job_failed", "job_buried"]
    assert buried["task"] == "tests.job_tasks.observed_fails"
    assert buried["error"]["type"] == "ValueError" and buried["error"]["attempt"] == 2
    assert [s["will_retry"] for s in seen(run_id, "step_failed")] == [True, False]


@pytest.fixture
def received():
    """Job signals received in this process for the length of a test."""
    calls: list[tuple[str, dict]] = []
    for name in signals.JOB_OUTCOMES:
        def receiver(sender, signal, _name=name, **arguments):
            calls.append((_name, arguments))
        signals.EVENTS[name].signal.connect(receiver, weak=False, dispatch_uid=f"jt-{name}")
    yield calls
    for name in signals.JOB_OUTCOMES:
        signals.EVENTS[name].signal.disconnect(dispatch_uid=f"jt-{name}")


def test_a_job_failed_by_an_operator__is_buried(received, token):
    # A job due in an hour, failed as an operator's bury fails it: through the engine's
    # fail path, in this process.
    later = job_tasks.observed_add.using(run_after=timezone.now() + timedelta(hours=1))
    run_id = int(later.enqueue(token, 1, b=1).id)
    run = WorkflowRun.objects.get(pk=run_id)
    error = {"type": "queuety.Buried", "message": f"Job {run_id} was buried by ops:alice."}
    with transaction.atomic():
        assert finish.fail_run(load_spec(run.definition_id), run_id, error, timezone.now())
        assert received == []  # sent once the transaction commits
    assert received == [("job_buried", {"result_id": str(run_id), "run_id": run_id,
                                        "task": "tests.job_tasks.observed_add",
                                        "error": error})]


def test_a_cancelled_job_and_a_workflows_run__send_no_job_event(received, observed, token):
    later = job_tasks.observed_add.using(run_after=timezone.now() + timedelta(hours=1))
    job_id = int(later.enqueue(token, 1, b=1).id)
    queuety.cancel(job_id)
    run_id = (queuety.workflow("observed_not_a_job").on_queue(job_tasks.OBSERVED_QUEUE)
              .then(workflows.step_a).dispatch({"token": token}))
    assert wait_for(run_id, worker=observed).status == "completed"
    eventually(lambda: seen(run_id, "run_completed"))
    assert received == [] and job_signals(run_id) == []


class Endpoint(BaseHTTPRequestHandler):
    """Answers 200 to every delivery."""

    requests: list[tuple[dict, bytes]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Endpoint.requests.append((dict(self.headers), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint_url():
    Endpoint.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/jobs"
    server.shutdown()
    server.server_close()


def test_webhooks__a_jobs_events_are_delivered_signed(worker, observed, endpoint_url, token):
    endpoint = WebhookEndpoint.objects.create(
        url=endpoint_url, secret=SECRET, events=["job.completed", "job.failed", "job.buried"])
    try:
        time.sleep(outbox.CACHE_SECONDS + 0.5)  # the observed worker's endpoint cache
        done = finished(job_tasks.observed_add.enqueue(token, 4, b=5), observed)
        flaky = finished(job_tasks.observed_flaky.enqueue(token), observed)
        buried = finished(job_tasks.observed_fails.enqueue(token), observed)
        ids = (done, flaky, buried)

        def delivered():
            rows = list(WebhookDelivery.objects.filter(run_id__in=ids))
            return rows if len(rows) == 5 and all(
                r.status == WebhookDelivery.DELIVERED for r in rows) else None

        rows = eventually(delivered)
        assert rows, list(WebhookDelivery.objects.filter(run_id__in=ids).values_list(
            "run_id", "event", "status"))
        assert sorted((r.run_id, r.event) for r in rows) == sorted([
            (done, "job.completed"), (flaky, "job.failed"), (flaky, "job.completed"),
            (buried, "job.failed"), (buried, "job.buried")])
        bodies = []
        for headers, body in Endpoint.requests:
            signing.verify(body, headers[signing.HEADER], SECRET)
            bodies.append(json.loads(body))
        completed = next(b for b in bodies if b["type"] == "job.completed"
                         and b["data"]["run_id"] == done)
        assert completed["data"] == {"result_id": str(done), "run_id": done,
                                     "task": "tests.job_tasks.observed_add"}
        burial = next(b for b in bodies if b["type"] == "job.buried")
        assert burial["data"]["error"]["message"] == f"observed_fails was told to fail ({token})"
        assert SECRET not in worker.log() and SECRET not in observed.log()
    finally:
        endpoint.delete()
        # The observed worker's cache still names the endpoint for a moment: a delivery row
        # written for it then would be refused (its foreign key), failing that transition.
        time.sleep(outbox.CACHE_SECONDS + 0.5)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of series ``name`` with ``labels`` (0 when it has none yet)."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            return float(match.group(2))
    return 0.0


def test_metrics__count_jobs_by_task_and_outcome(observed, token):
    def counts() -> dict[tuple[str, str], float]:
        text = metrics.exposition()[0].decode()
        return {(task, outcome): sample(text, "queuety_jobs_total",
                                        task=f"tests.job_tasks.{task}", outcome=outcome)
                for task in ("observed_add", "observed_flaky", "observed_fails")
                for outcome in ("completed", "failed", "buried")}

    before = counts()
    for result in [job_tasks.observed_add.enqueue(token, 1, b=2) for _ in range(3)] + [
            job_tasks.observed_flaky.enqueue(token), job_tasks.observed_fails.enqueue(token)]:
        finished(result, observed)
    expected = {("observed_add", "completed"): 3, ("observed_flaky", "failed"): 1,
                ("observed_flaky", "completed"): 1, ("observed_fails", "failed"): 1,
                ("observed_fails", "buried"): 1}

    def grown():
        now = counts()
        return {key: now[key] - before[key] for key in now if now[key] != before[key]}

    assert eventually(lambda: grown() == expected, timeout=10) or grown() == expected, grown()
    text = metrics.exposition()[0].decode()
    assert sample(text, "queuety_jobs_by_status", task="tests.job_tasks.observed_fails",
                  status="failed") >= 1


def test_the_step_boundary__costs_a_job_no_statement_more_with_its_events_observed(
        received, monkeypatch, token):
    # In this process: a receiver on every job signal and the metrics on; the attempt of a job
    # that succeeds is still the claim and the transition (tests/integration/
    # test_tasks_backend.py pins the same two unobserved).
    job_tasks.add.enqueue(token, 0, 0)  # the definition row, once per process
    monkeypatch.setattr(outbox, "CACHE_SECONDS", 3600.0)
    outbox.forget()
    outbox.subscribers()
    with override_settings(QUEUETY={**settings.QUEUETY, "METRICS": True}), \
            publish.captured() as sent:
        result = job_tasks.add.enqueue(token, 1, 1)
        with CaptureQueriesContext(connection) as ran:
            attempt.execute_step(sent[-1].step_run_id, inline=False)

    assert [q["sql"].split()[0] for q in ran.captured_queries] == ["UPDATE", "WITH"]
    assert received == [("job_completed", {"result_id": result.id, "run_id": int(result.id),
                                           "task": "tests.job_tasks.add"})]
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("queuety_jobs_total", {
        "task": "tests.job_tasks.add", "outcome": "completed"}) >= 1
