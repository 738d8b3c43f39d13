"""Bad input everywhere it enters: each gets a clear 4xx or exception naming the problem, and
nothing is written.

Already covered elsewhere and referenced from docs/reliability.md: bad dispatch payloads
(tests/integration/test_concurrent_writers.py), malformed replay documents and replay never
importing code of an unknown definition (tests/integration/test_operations.py), invalid input
schemas failing the build and invalid replies listing every path
(tests/integration/test_signals.py).
"""

from __future__ import annotations

import json

import pytest
from django.db.models import Count

import queuety
from queuety import export
from queuety.models import ApiReply, Event, Signal, StepRun, WorkflowRun
from tests import workflows
from tests.integration.conftest import wait_for
from tests.integration.test_api import make_user

API = "/queuety/api"
SCHEMA = {"type": "object", "required": ["amount"],
          "properties": {"amount": {"type": "integer", "minimum": 0}}}


def nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def footprint() -> dict[str, int]:
    """Row counts of every table an input could write to."""
    return {model.__name__: model.objects.aggregate(n=Count("pk"))["n"]
            for model in (WorkflowRun, StepRun, Event, Signal, ApiReply)}


@pytest.fixture
def operator():
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(make_user("view_workflowrun", "signal_workflowrun"))
    return client


@pytest.fixture
def waiting(worker, token):
    run_id = (queuety.workflow("rel_hostile").wait_for_input(schema=SCHEMA)
              .then(workflows.step_a).dispatch({"token": token}))
    wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)
    return run_id


BODIES = [
    # (case, path suffix, raw body, status, code, words in the detail)
    ("malformed JSON", "input/", b'{"amount": 1', 400, "parse_error", "not valid JSON"),
    ("NaN is not JSON", "input/", b'{"amount": NaN}', 400, "parse_error", "not valid JSON"),
    ("wrong type", "input/", b'{"amount": "12"}', 400, "invalid_payload", "/amount"),
    ("missing field", "input/", b"{}", 400, "invalid_payload", "amount"),
    ("huge body", "input/", b'{"amount": 1, "pad": "' + b"x" * 70_000 + b'"}', 413,
     "payload_too_large", "MAX_SIGNAL_BYTES"),
    ("deeply nested JSON", "input/", b"[" * 20_000 + b"]" * 20_000, 400, "parse_error",
     "nested"),
    ("signal nobody waits for", "signals/nobody/", b"{}", 409, "run_not_waiting", "nobody"),
    ("approve an input wait", "approve/", b"{}", 409, "run_not_waiting", "input"),
]


@pytest.mark.parametrize("case,path,body,status,code,words", BODIES,
                         ids=[case[0].replace(" ", "_") for case in BODIES])
def test_api_bad_body__clear_4xx_and_nothing_written(operator, waiting, case, path, body,
                                                     status, code, words, figures):
    before = footprint()

    response = operator.post(f"{API}/runs/{waiting}/{path}", data=body,
                             content_type="application/json", HTTP_IDEMPOTENCY_KEY=case)

    assert response.status_code == status, response.content[:300]
    answer = response.json()
    assert answer["code"] == code and words in answer["detail"], answer
    assert footprint() == before
    assert queuety.workflow_status(waiting).status == "waiting_for_signal"
    figures.record(f"bad_input_api_{case}", status=status, code=code)


@pytest.mark.parametrize("path", ["runs/987654321/", "runs/0/", "runs/-1/",
                                  "runs/99999999999999999999/", "runs/abc/",
                                  "runs/987654321/approve/"])
def test_api_unknown_ids__json_404_and_nothing_written(operator, path):
    before = footprint()
    response = (operator.get(f"{API}/{path}") if not path.endswith("approve/") else
                operator.post(f"{API}/{path}", data=b"{}", content_type="application/json"))
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json", response.content[:200]
    assert footprint() == before


@pytest.mark.parametrize("payload,words", [
    (nested(3), "must be a dict"),
    ({"deep": nested(5_000)}, "nested too deeply"),
    ({"when": {1, 2}}, "not JSON-serialisable"),
    ({"_secret": 1}, "reserved"),
])
def test_dispatch_bad_payload__named_and_nothing_written(payload, words):
    before = footprint()
    with pytest.raises(queuety.WorkflowDefinitionError, match=words):
        queuety.workflow("rel_bad_dispatch").then(workflows.step_a).dispatch(payload)
    assert footprint() == before


def test_dispatch_huge_payload__refused_by_max_state_bytes(token):
    before = footprint()
    with pytest.raises(queuety.BudgetExceeded, match="nothing was dispatched"):
        (queuety.workflow("rel_huge").max_state_bytes(65_536).then(workflows.step_a)
         .dispatch({"token": token, "blob": "x" * 1_000_000}))
    assert footprint() == before


@pytest.mark.parametrize("data,words", [
    (nested(5_000), "nested"),
    ("x" * 70_000, "MAX_SIGNAL_BYTES"),
    (float("nan"), "not JSON"),
])
def test_signal_bad_data__named_and_nothing_written(waiting, data, words):
    before = footprint()
    with pytest.raises(queuety.InvalidSignalData, match=words):
        queuety.signal(waiting, "input", data)
    assert footprint() == before


@pytest.mark.parametrize("damage,words", [
    (lambda doc: doc["run"]["state"].update(deep=nested(5_000)), "nested"),
    (lambda doc: doc["run"]["state"].update(pad="x" * 5_000_000), "max_state_bytes"),
    (lambda doc: doc["definition"]["steps"][0].update(handler="os.system"), "hash"),
    (lambda doc: doc["run"].update(current_step=99), "past the definition"),
])
def test_replay_hostile_document__refused_and_nothing_written(worker, token, damage, words):
    run_id = (queuety.workflow("rel_hostile_replay").max_state_bytes(65_536)
              .wait_for_approval().then(workflows.step_a).dispatch({"token": token}))
    wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)
    document = queuety.export_workflow(run_id)
    damage(document)
    before = footprint()
    with pytest.raises(queuety.WorkflowDefinitionError, match=words):
        export.replay(document)
    assert footprint() == before


def test_replay_document_as_text__deeply_nested_is_refused(waiting):
    before = footprint()
    with pytest.raises(queuety.WorkflowDefinitionError, match="nested"):
        export.replay("[" * 20_000 + "]" * 20_000)
    assert footprint() == before
    assert json.dumps(queuety.export_workflow(waiting))  # the real export still round-trips
