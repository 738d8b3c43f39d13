"""Shared test set-up: a folder for side-effect marks, visible to the worker subprocess."""

import os
import tempfile

os.environ.setdefault("QUEUETY_TEST_DIR", tempfile.mkdtemp(prefix="queuety-marks-"))
