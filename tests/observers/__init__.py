"""A test app whose receivers record every Queuety signal a process sends (one JSON line per
signal in ``$QUEUETY_TEST_DIR/signals``), and one receiver that always raises.

Installed by tests/settings.py when ``QUEUETY_TEST_OBSERVERS`` is set, so only the worker
subprocesses that ask for it observe.
"""
