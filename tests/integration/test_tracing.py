"""OpenTelemetry: a run dispatched inside a span is traced across processes. The steps run on
a prefork worker of their own, which exports its spans through the SDK's in-memory exporter to
a file (tests/observers); this process's spans go to an in-memory exporter here."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from django.conf import settings
from django.test import override_settings

import queuety
from queuety.models import WorkflowRun
from tests import workflows
from tests.integration.conftest import Worker, wait_for
from tests.workflows import marks_dir

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def traced(db_session, tmp_path_factory):
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    handle = Worker(tmp_path_factory.mktemp("traced"), queue=f"otel-{uuid.uuid4().hex[:6]}",
                    concurrency=2, beat=False)
    handle.env.update(QUEUETY_TEST_OBSERVERS="1", QUEUETY_TEST_TRACING="1")
    handle.start()
    with override_settings(QUEUETY={**settings.QUEUETY, "TRACING": True}):
        yield handle
    handle.stop()


def worker_spans(run_id: int) -> list[dict]:
    path = marks_dir() / "spans"
    spans = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [s for s in spans if s["attributes"].get("queuety.run_id") == run_id]


def test_step_spans__join_the_trace_of_the_span_that_dispatched_the_run(traced, token):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("checkout") as outer:
        run_id = (queuety.workflow("traced").version("2").on_queue(traced.queue)
                  .then(workflows.step_a)
                  .then(workflows.flaky, retry=queuety.RetryPolicy(max_attempts=2,
                                                                   initial_delay=0.2))
                  .dispatch({"token": token, "fail_times": 1,
                             "raise": "builtins.ConnectionError"}))
    assert wait_for(run_id, worker=traced).status == "completed"
    trace_id = f"{outer.get_span_context().trace_id:032x}"
    [run_span] = [s for s in EXPORTER.get_finished_spans()
                  if s.attributes.get("queuety.run_id") == run_id]
    assert run_span.name == "queuety.run traced"
    assert run_span.parent.span_id == outer.get_span_context().span_id
    assert dict(run_span.attributes) == {"queuety.workflow": "traced", "queuety.version": "2",
                                         "queuety.run_id": run_id}
    stored = WorkflowRun.objects.get(pk=run_id).trace_context
    assert stored.startswith(f"00-{trace_id}-{run_span.context.span_id:016x}-")

    deadline = time.monotonic() + 10
    while len(worker_spans(run_id)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    spans = sorted(worker_spans(run_id), key=lambda s: (s["attributes"]["queuety.step"] != "step_a",
                                                        s["attributes"]["queuety.attempt"]))
    assert [(s["name"], s["attributes"]["queuety.attempt"], s["status"],
             s["attributes"]["queuety.status"]) for s in spans] == [
        ("queuety.step traced.step_a", 1, "UNSET", "completed"),
        ("queuety.step traced.flaky", 1, "ERROR", "failed"),
        ("queuety.step traced.flaky", 2, "UNSET", "completed")]
    for span in spans:  # another process, later: the same trace, under the run's span
        assert span["trace_id"] == trace_id
        assert span["parent_id"] == f"{run_span.context.span_id:016x}"
        assert span["attributes"]["queuety.workflow"] == "traced"
        assert span["attributes"]["queuety.version"] == "2"
    assert spans[1]["attributes"]["queuety.error.type"] == "ConnectionError"


def test_tracing_off__stores_no_context_and_records_nothing(traced, token):
    with override_settings(QUEUETY={**settings.QUEUETY, "TRACING": False}):
        EXPORTER.clear()
        run_id = queuety.workflow("untraced").on_queue(traced.queue).then(
            workflows.step_a).dispatch({"token": token})
        assert EXPORTER.get_finished_spans() == ()
    assert WorkflowRun.objects.get(pk=run_id).trace_context == ""


def test_agent_steps__one_span_per_real_model_request_and_tool_call_none_on_replay(traced):
    from tests import agent_steps

    run_id = (queuety.workflow("traced_agent").on_queue(traced.queue)
              .then(agent_steps.traced_agent_step,
                    retry=queuety.RetryPolicy(max_attempts=2, initial_delay=0.1))
              .dispatch({}))
    assert wait_for(run_id, worker=traced).status == "completed"
    deadline = time.monotonic() + 10
    while len(worker_spans(run_id)) < 9 and time.monotonic() < deadline:
        time.sleep(0.1)
    work = [(s["name"], s["attributes"]["queuety.checkpoint"], s["status"])
            for s in worker_spans(run_id) if s["name"].startswith("queuety.agent.")]
    # Attempt 1: requests 1 and 2, both tools (the second fails). Attempt 2 replays requests
    # 1-2 and "lookup" (no spans), runs "flaky_tool" again and request 3.
    assert sorted(work) == sorted([
        ("queuety.agent.request function:traced", 1, "UNSET"),
        ("queuety.agent.tool lookup", 1, "UNSET"),
        ("queuety.agent.request function:traced", 2, "UNSET"),
        ("queuety.agent.tool flaky_tool", 2, "ERROR"),
        ("queuety.agent.tool flaky_tool", 2, "UNSET"),
        ("queuety.agent.request function:traced", 3, "UNSET")])
    steps = {s["span_id"]: s for s in worker_spans(run_id) if s["name"].startswith("queuety.step")}
    assert len(steps) == 2
    assert all(s["parent_id"] in steps for s in worker_spans(run_id)
               if s["name"].startswith("queuety.agent."))
