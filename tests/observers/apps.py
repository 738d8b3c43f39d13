"""Connects the recording receivers when the app registry is ready."""

import json
import os

from django.apps import AppConfig


def record(name: str):
    def receiver(sender, signal, **arguments):
        from tests.workflows import marks_dir

        line = json.dumps({"signal": name, "sender": sender.__name__, "pid": os.getpid(),
                           **arguments}, default=str)
        with open(marks_dir() / "signals", "a") as handle:
            handle.write(line + "\n")
    return receiver


def broken(sender, **arguments):
    raise RuntimeError("this receiver always raises")


class ObserversConfig(AppConfig):
    name = "tests.observers"
    label = "test_observers"

    def ready(self) -> None:
        from queuety.signals import EVENTS

        self.receivers = []
        for name, kind in EVENTS.items():
            # A raising receiver first: the recording one after it must still be called.
            kind.signal.connect(broken, weak=False, dispatch_uid=f"broken-{name}")
            receiver = record(name)
            kind.signal.connect(receiver, weak=False, dispatch_uid=f"record-{name}")
        if os.environ.get("QUEUETY_TEST_TRACING"):
            trace_to_file()


def trace_to_file() -> None:
    """Export this process's finished spans to ``$QUEUETY_TEST_DIR/spans`` (one JSON line
    each) through the SDK's in-memory exporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class FileExporter(InMemorySpanExporter):
        def export(self, spans):
            from tests.workflows import marks_dir

            result = super().export(spans)
            with open(marks_dir() / "spans", "a") as handle:
                for span in self.get_finished_spans():
                    handle.write(json.dumps({
                        "name": span.name, "trace_id": f"{span.context.trace_id:032x}",
                        "span_id": f"{span.context.span_id:016x}",
                        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                        "status": span.status.status_code.name, "pid": os.getpid(),
                        "attributes": dict(span.attributes or {})}) + "\n")
            self.clear()
            return result

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)
