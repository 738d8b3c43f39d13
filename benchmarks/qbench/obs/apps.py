"""Connects the benchmark's receiver and tracer provider in the worker."""

import os
from collections import Counter

from django.apps import AppConfig

RECEIVED: Counter = Counter()


def receiver(sender, signal, **arguments):
    RECEIVED[id(signal)] += 1


class ObsConfig(AppConfig):
    name = "qbench.obs"
    label = "qbench_obs"

    def ready(self) -> None:
        if os.environ.get("QBENCH_OBS_SIGNALS"):
            from queuety.signals import EVENTS

            for kind in EVENTS.values():
                kind.signal.connect(receiver, weak=False, dispatch_uid="qbench")
        if os.environ.get("QBENCH_OBS_TRACING"):
            from opentelemetry import trace
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )

            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
            trace.set_tracer_provider(provider)
