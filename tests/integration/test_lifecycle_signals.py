"""Lifecycle signals and webhooks, on PostgreSQL and real prefork workers.

The steps run on a worker of their own (two pool processes) started with
``QUEUETY_TEST_OBSERVERS=1``: tests/observers connects, to every Queuety signal, a receiver that
always raises and then one that writes each signal it receives to ``$QUEUETY_TEST_DIR/signals``.
What happens in this process (dispatch, signal(), cancel()) is observed by receivers connected
here. Webhook deliveries go through the session worker (the default queue) to an HTTP server
in this process.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction

import queuety
from queuety import operations, signals
from queuety.models import WebhookDelivery, WebhookEndpoint
from queuety.webhooks import delivery, outbox, signing
from tests import workflows
from tests.integration.conftest import Worker, wait_for
from tests.workflows import marks_dir

SECRET = "whsec-" + "s3cr3t-never-logged-0123456789"


@pytest.fixture(scope="module")
def observed(db_session, tmp_path_factory):
    handle = Worker(tmp_path_factory.mktemp("observed"), queue=f"obs-{uuid.uuid4().hex[:6]}",
                    concurrency=2)
    handle.env["QUEUETY_TEST_OBSERVERS"] = "1"
    handle.start()
    yield handle
    handle.stop()


def seen(run_id: int, name: str | None = None) -> list[dict]:
    """The signals the observed worker sent about run ``run_id``."""
    path = marks_dir() / "signals"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line.get("run_id") == run_id
            and (name is None or line["signal"] == name)]


class Received:
    """Receivers connected in this process for the length of a test."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, name):
        def receiver(sender, signal, **arguments):
            self.calls.append((name, arguments))
        return receiver

    def of(self, name: str, run_id: int) -> list[dict]:
        return [a for n, a in self.calls if n == name and a.get("run_id") == run_id]


@pytest.fixture
def received():
    here = Received()
    connected = []
    for name, kind in signals.EVENTS.items():
        receiver = here(name)
        kind.signal.connect(receiver, weak=False, dispatch_uid=f"test-{name}")
        connected.append((kind.signal, f"test-{name}"))
    yield here
    for signal, uid in connected:
        signal.disconnect(dispatch_uid=uid)


def eventually(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_a_run__sends_started_waiting_and_completed_once_each(observed, received, token):
    run_id = (queuety.workflow("observed_wait").on_queue(observed.queue).version("v7")
              .then(workflows.step_a).wait_for_signal("go").then(workflows.step_b)
              .dispatch({"token": token}))
    assert received.of("run_started", run_id) == [
        {"run_id": run_id, "workflow": "observed_wait", "version": "v7"}]

    waiting = eventually(lambda: seen(run_id, "run_waiting"))
    assert [(w["waiting_for"], w["kind"], w["sender"]) for w in waiting] == [
        (["go"], "signal", "WorkflowRun")]
    queuety.signal(run_id, "go", {})
    assert wait_for(run_id, worker=observed).status == "completed"

    completed = eventually(lambda: seen(run_id, "run_completed"))
    time.sleep(0.5)  # nothing more arrives
    assert [(c["workflow"], c["version"]) for c in seen(run_id, "run_completed")] == [
        ("observed_wait", "v7")]
    assert len(seen(run_id, "run_waiting")) == 1 and completed
    # The receiver that raises was logged, and the run went on regardless.
    assert "ObserversConfig" not in observed.log()
    assert "raised RuntimeError: this receiver always raises" in observed.log()


def test_failed_attempts__say_whether_they_are_retried_then_the_run_fails(observed, token):
    run_id = (queuety.workflow("observed_fail").on_queue(observed.queue)
              .then(workflows.boom, retry=queuety.RetryPolicy(max_attempts=2,
                                                              initial_delay=0.1))
              .dispatch({"token": token}))
    assert wait_for(run_id, worker=observed).status == "failed"
    eventually(lambda: seen(run_id, "run_failed"))
    failed = seen(run_id, "step_failed")
    assert [(f["attempt"], f["will_retry"], f["max_attempts"]) for f in failed] == [
        (1, True, 2), (2, False, 2)]
    assert failed[0]["retry_in"] == pytest.approx(0.1, abs=0.05)
    assert failed[1]["error"]["type"] == "ValueError"
    [run_failed] = seen(run_id, "run_failed")
    assert run_failed["error"]["message"].startswith("boom for order")
    assert run_failed["error"]["step"] == "boom"
    assert seen(run_id, "budget_exceeded") == []


def test_a_budget_breach__sends_budget_exceeded_with_the_run_failed(observed, token):
    run_id = (queuety.workflow("observed_budget").on_queue(observed.queue).max_transitions(1)
              .then(workflows.step_a).then(workflows.step_b).dispatch({"token": token}))
    assert wait_for(run_id, worker=observed).status == "failed"
    [breach] = eventually(lambda: seen(run_id, "budget_exceeded"))
    assert (breach["budget"], breach["limit"], breach["used"]) == ("max_transitions", 1, 2)
    assert len(seen(run_id, "run_failed")) == 1


def test_cancel__sends_run_cancelled_with_the_actor(received, observed, token):
    run_id = (queuety.workflow("observed_cancel").on_queue(observed.queue)
              .wait_for_signal("never").dispatch({"token": token}))
    operations.cancel(run_id, actor="ops:alice")
    assert received.of("run_cancelled", run_id) == [
        {"run_id": run_id, "workflow": "observed_cancel", "actor": "ops:alice",
         "previous_status": "waiting_for_signal"}]


def test_signals__wait_for_the_commit_and_are_not_sent_for_a_rollback(received, observed,
                                                                     token):
    builder = queuety.workflow("observed_atomic").on_queue(observed.queue).wait_for_signal("x")
    with transaction.atomic():
        kept = builder.dispatch({"token": token})
        assert received.of("run_started", kept) == []  # not yet: the run is not committed
    assert len(received.of("run_started", kept)) == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        dropped = builder.dispatch({"token": token})
        raise RuntimeError("roll back")
    assert received.of("run_started", dropped) == []


class Endpoint(BaseHTTPRequestHandler):
    """Answers 500 to the first delivery of each event id, 200 afterwards."""

    requests: list[tuple[dict, bytes]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Endpoint.requests.append((dict(self.headers), body))
        event_id = self.headers["Queuety-Delivery"]
        first = sum(1 for h, _ in Endpoint.requests if h["Queuety-Delivery"] == event_id) == 1
        self.send_response(500 if first else 200)
        self.end_headers()

    def log_message(self, *args):
        pass

    def finish(self):
        super().finish()
        self.connection.close()


@pytest.fixture
def endpoint_server():
    Endpoint.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks?token=abc"
    server.shutdown()
    server.server_close()


def test_webhooks__a_failed_run_is_delivered_signed_retried_and_redeliverable(
        worker, observed, endpoint_server, token):
    endpoint = WebhookEndpoint.objects.create(url=endpoint_server, secret=SECRET,
                                              events=["run.failed", "step.failed"])
    try:
        time.sleep(outbox.CACHE_SECONDS + 0.5)  # the observed worker's endpoint cache
        run_id = (queuety.workflow("observed_hook").on_queue(observed.queue)
                  .then(workflows.boom).dispatch({"token": token, "order": 42}))
        assert wait_for(run_id, worker=observed).status == "failed"
        rows = eventually(lambda: list(WebhookDelivery.objects.filter(
            run_id=run_id, status=WebhookDelivery.DELIVERED)) if WebhookDelivery.objects.filter(
            run_id=run_id).exclude(status=WebhookDelivery.DELIVERED).count() == 0 and
            WebhookDelivery.objects.filter(run_id=run_id).count() == 2 else [])
        assert sorted(r.event for r in rows) == ["run.failed", "step.failed"]
        for row in rows:  # the first answer was a 500: delivered on the second attempt
            assert (row.attempts, row.last_status_code, row.endpoint_id) == (2, 200,
                                                                             endpoint.pk)
        mine = [(h, b) for h, b in Endpoint.requests
                if json.loads(b)["data"]["run_id"] == run_id]
        assert len(mine) == 4
        for headers, body in mine:
            signing.verify(body, headers[signing.HEADER], SECRET)
            with pytest.raises(signing.SignatureError):
                signing.verify(body, headers[signing.HEADER], "another-secret-0123456789")
        failed = next(json.loads(b) for h, b in mine if h["Queuety-Event"] == "run.failed")
        assert failed["type"] == "run.failed" and failed["data"]["workflow"] == "observed_hook"
        assert failed["data"]["error"]["message"] == "boom for order 42"
        # A retry is the same event: the receiver dedupes on its id.
        assert len({h["Queuety-Delivery"] for h, _ in mine}) == 2

        assert delivery.redeliver([rows[0].pk]) == 1
        again = eventually(lambda: WebhookDelivery.objects.filter(
            pk=rows[0].pk, status=WebhookDelivery.DELIVERED, attempts=1).exists())
        assert again
        assert SECRET not in worker.log() and SECRET not in observed.log()
    finally:
        endpoint.delete()


def test_webhooks__an_endpoint_down_never_delays_the_run(worker, observed, token):
    # Nothing listens on this port: every attempt is refused, the run completes regardless.
    endpoint = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/down", secret=SECRET,
                                              events=["run.completed"])
    try:
        time.sleep(outbox.CACHE_SECONDS + 0.5)
        started = time.monotonic()
        run_id = (queuety.workflow("observed_down").on_queue(observed.queue)
                  .then(workflows.step_a).dispatch({"token": token}))
        assert wait_for(run_id, worker=observed).status == "completed"
        assert time.monotonic() - started < 10
        row = eventually(lambda: WebhookDelivery.objects.filter(
            run_id=run_id, status=WebhookDelivery.FAILED).first())
        assert row is not None and row.attempts == 3  # 1 + len(WEBHOOK_RETRY_DELAYS)
        assert row.last_status_code is None and "Connection refused" in row.last_error
    finally:
        endpoint.delete()


def test_an_idle_worker__logs_no_sweeps(observed):
    before = observed.log().count("\n")
    time.sleep(3.5)  # three sweeps at SWEEP_INTERVAL=1
    new = observed.log().splitlines()[before:]
    # Every worker sweeps the whole database in its turn (queuety.runtime.sweep_tick), so rows
    # other tests left behind may give a sweep something to do: a sweep logs only then, and
    # Celery's routine lines about the sweep task never.
    assert [line for line in new if "queuety.sweep" in line] == []
    swept = [line for line in new if "Sweep " in line]
    assert all(re.search(r"=[1-9]", line) for line in swept), swept


def test_a_signal_that_leaves_the_wait_open__sends_no_second_run_waiting(received, token):
    run_id = (queuety.workflow("observed_two_signals").wait_for_signals(["a", "b"])
              .dispatch({"token": token}))
    assert len(received.of("run_waiting", run_id)) == 1
    queuety.signal(run_id, "a", {})  # the wait stays open: the run was waiting already
    assert len(received.of("run_waiting", run_id)) == 1
    queuety.signal(run_id, "b", {})
    assert queuety.workflow_status(run_id).status == "completed"
    assert len(received.of("run_waiting", run_id)) == 1
    assert len(received.of("run_completed", run_id)) == 1


class Redirecting(BaseHTTPRequestHandler):
    """Answers each POST with a redirect to a path that would answer 200."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(302)
        self.send_header("Location", "/elsewhere")
        self.end_headers()

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_webhooks__a_redirect_is_a_failed_attempt_not_a_delivery(token):
    from django.utils import timezone

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = WebhookEndpoint.objects.create(
        url=f"http://127.0.0.1:{server.server_address[1]}/hooks", secret=SECRET,
        events=["run.failed"])
    try:
        row = WebhookDelivery.objects.create(
            endpoint=endpoint, event="run.failed", event_id=uuid.uuid4(), payload={"t": token},
            next_attempt_at=timezone.now())
        delivery.deliver(row.pk)
        row.refresh_from_db()
        assert row.status != WebhookDelivery.DELIVERED
        assert (row.attempts, row.last_status_code) == (1, 302)
    finally:
        endpoint.delete()
        server.shutdown()
        server.server_close()


def test_a_step_parked_at_landing__sends_run_throttled_after_the_commit(received, token):
    # On a queue no worker consumes: the first run's step holds the group's one slot, so the
    # second run is parked throttled when it lands on its first step, in dispatch().
    from tests import resource_steps

    def dispatch() -> int:
        return (queuety.workflow("observed_throttle").on_queue(f"nobody-{token}")
                .then(resource_steps.ledgered, concurrency_group=f"obs-{token}",
                      concurrency_limit=1)
                .dispatch({"token": token}))

    first = dispatch()
    with transaction.atomic():
        second = dispatch()
        assert received.of("run_throttled", second) == []  # receivers wait for the commit
    assert received.of("run_throttled", first) == []
    assert received.of("run_throttled", second) == [
        {"run_id": second, "workflow": "observed_throttle", "step": "ledgered",
         "reason": "concurrency"}]
    assert queuety.workflow_status(second).throttled_by["reason"] == "concurrency"
