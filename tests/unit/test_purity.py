"""The engine core imports neither Django, Celery nor DRF."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core__imports_no_framework():
    code = ("import sys, queuety, queuety.core.builder, queuety.core.engine, "
            "queuety.core.definition, queuety.core.describe, queuety.core.diff, "
            "queuety.core.flow, queuety.core.retry, queuety.core.handler_refs, "
            "queuety.core.imports, queuety.core.status, queuety.verifiers, queuety.hooks.declare; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('django', 'celery', 'kombu', 'rest_framework')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "[]"
