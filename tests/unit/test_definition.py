"""Definitions: canonical JSON and a definition_hash stable across processes and Pythons."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import queuety
from queuety.core.definition import WorkflowSpec, canonical_json
from tests.pythons import SUPPORTED, find_python

ROOT = Path(__file__).resolve().parents[2]

REFERENCE = """
import queuety
spec = (queuety.workflow("golden")
        .retry(max_attempts=2, initial_delay=0.25)
        .then("tests.workflows.step_a")
        .then("tests.workflows.StepB", name="b", timeout=30,
              retry=queuety.RetryPolicy(max_attempts=4, initial_delay=0.5,
                                        retry_on=[ConnectionError, "queuety.StepTimeout"]))
        .then("tests.workflows.step_c")
        .build())
"""

# Pinned: a change here means every stored definition changes identity. Bump DEFINITION_FORMAT
# and say so in the changelog if it is ever intended.
GOLDEN_HASH = "7c4a6ce91275e766284a8885169ea5d9774625c0ddc5ad60901609743082de94"


def reference_spec() -> WorkflowSpec:
    scope: dict = {}
    exec(REFERENCE, scope)
    return scope["spec"]


def test_canonical_json__sorted_compact_ascii():
    assert canonical_json({"b": [1, 2.5, "é"], "a": None}) == '{"a":null,"b":[1,2.5,"\\u00e9"]}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_definition_hash__golden_value():
    spec = reference_spec()
    assert spec.definition_hash == GOLDEN_HASH
    assert json.loads(spec.canonical_json())["steps"][1] == {
        "handler": "tests.workflows.StepB", "kind": "task", "name": "b", "timeout": 30.0,
        "retry": {"backoff_factor": 2.0, "initial_delay": 0.5, "jitter": 0.1,
                  "max_attempts": 4, "max_delay": 60.0,
                  "retry_on": ["builtins.ConnectionError", "queuety.exceptions.StepTimeout"]},
    }


def test_definition_hash__round_trips_through_json():
    spec = reference_spec()
    again = WorkflowSpec.from_dict(json.loads(spec.canonical_json()))
    assert again == spec and again.definition_hash == spec.definition_hash


def test_definition_hash__changes_with_any_option():
    base = queuety.workflow("w").then("tests.workflows.step_a")
    hashes = {
        base.build().definition_hash,
        base.then("tests.workflows.step_b").build().definition_hash,
        queuety.workflow("w").then("tests.workflows.step_a", name="x").build().definition_hash,
        queuety.workflow("w").then("tests.workflows.step_a", timeout=1).build().definition_hash,
        base.retry(max_attempts=2).build().definition_hash,
        queuety.workflow("other").then("tests.workflows.step_a").build().definition_hash,
    }
    assert len(hashes) == 6
    # Equivalent spellings are one definition: an int timeout is stored as a float.
    assert (queuety.workflow("w").then("tests.workflows.step_a", timeout=2).build()
            == queuety.workflow("w").then("tests.workflows.step_a", timeout=2.0).build())


@pytest.mark.parametrize("version", SUPPORTED)
def test_definition_hash__same_in_other_processes_and_python_versions(version):
    python = find_python(version)
    code = REFERENCE + "\nprint(spec.definition_hash)"
    for seed in ("0", "12345"):
        result = subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed})
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == GOLDEN_HASH
