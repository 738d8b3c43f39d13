"""The observability benchmark's worker-side switches (``benchmarks/observability.py``).

``QBENCH_OBS_SIGNALS=1`` connects one receiver (a counter) to every Queuety signal;
``QBENCH_OBS_TRACING=1`` installs an OpenTelemetry SDK tracer provider whose batch processor
hands spans to the in-memory exporter (span creation and export, without a collector).
"""
