"""Definitions: canonical JSON and a definition_hash stable across processes and Pythons."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import queuety
from queuety.core.definition import WorkflowSpec, canonical_json
from tests.pythons import SUPPORTED, venv_python

ROOT = Path(__file__).resolve().parents[2]

REFERENCE = """
import queuety
spec = (queuety.workflow("golden")
        .version("research.v2")
        .max_transitions(20).max_for_each_items(12).max_state_bytes(32768)
        .max_cost_units(40).max_started_workflows(8)
        .retry(max_attempts=2, initial_delay=0.25)
        .then("tests.workflows.step_a")
        .then("tests.workflows.StepB", name="b", timeout=30,
              retry=queuety.RetryPolicy(max_attempts=4, initial_delay=0.5,
                                        retry_on=[ConnectionError, "queuety.StepTimeout"]))
        .then("tests.workflows.step_c", cost_units=0)
        .build())
"""

# Pinned: a change here means every stored definition changes identity. Bump DEFINITION_FORMAT
# and say so in the changelog if it is ever intended.
GOLDEN_HASH = "51dd5979d3144ee359daba165755340e4a1ad0c81268f9ef0ff6964a893dea8c"


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
        "cost_units": 1, "wait": None, "compensation": None,
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
    variants = [
        base,
        base.then("tests.workflows.step_b"),
        queuety.workflow("w").then("tests.workflows.step_b"),
        queuety.workflow("w").then("tests.workflows.step_a", name="x"),
        queuety.workflow("w").then("tests.workflows.step_a", timeout=1),
        queuety.workflow("w").then("tests.workflows.step_a", cost_units=3),
        base.retry(max_attempts=2),
        base.on_queue("q"),
        base.version("v1"),
        base.version("v2"),
        base.max_transitions(5),
        base.max_transitions(6),
        base.max_for_each_items(5),
        base.max_state_bytes(5),
        base.max_cost_units(5),
        base.max_started_workflows(5),
        queuety.workflow("other").then("tests.workflows.step_a"),
    ]
    assert len({v.build().definition_hash for v in variants}) == len(variants)
    # The idempotency key belongs to one dispatch, not to the definition.
    assert base.idempotency_key("k").build().definition_hash == base.build().definition_hash
    # Equivalent spellings are one definition: an int timeout is stored as a float.
    assert (queuety.workflow("w").then("tests.workflows.step_a", timeout=2).build()
            == queuety.workflow("w").then("tests.workflows.step_a", timeout=2.0).build())


@pytest.mark.parametrize("version", SUPPORTED)
def test_definition_hash__same_in_other_processes_and_python_versions(version):
    python = venv_python(version)
    code = REFERENCE + "\nprint(spec.definition_hash)"
    for seed in ("0", "12345"):
        result = subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed})
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == GOLDEN_HASH
