"""Who gets in: one table of callers and links against one waiting run, each with the answer
it must get and nothing written. docs/reliability.md lists the same cases and results.

Admin actions per permission (pause, approve, ... for viewers, signallers, operators) and
CSRF on them are covered in tests/integration/test_admin.py.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import User
from django.core import signing
from django.test import Client, override_settings
from rest_framework.test import APIClient

import queuety
from queuety import approvals
from queuety.models import Signal, WorkflowRun
from tests import workflows
from tests.integration.conftest import wait_for
from tests.integration.test_api import make_user
from tests.settings import QUEUETY as TEST_QUEUETY

API = "/queuety/api"
DENY = {**TEST_QUEUETY, "RUN_ACCESS": "tests.workflows.deny_all"}


def api(user: User | None = None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def approve(client, run_id, **extra):
    return client.post(f"{API}/runs/{run_id}/approve/", data=json.dumps({}),
                       content_type="application/json", **extra)


def session_client() -> APIClient:
    """A browser-like client: session login, CSRF enforced as for real browsers."""
    user = make_user("view_workflowrun", "signal_workflowrun")
    client = APIClient(enforce_csrf_checks=True)
    client.login(username=user.username, password="pw")
    return client


def with_csrf(run_id):
    client = session_client()
    # Any page with a form hands out the cookie; the API itself sets none.
    token = Client().get("/admin/login/").cookies["csrftoken"].value
    client.cookies["csrftoken"] = token
    return approve(client, run_id, HTTP_X_CSRFTOKEN=token)


def forged_for(run_id: int, other: int) -> str:
    """A token naming ``other`` instead of ``run_id``'s wait, signed with a wrong key."""
    run = WorkflowRun.objects.get(pk=run_id)
    return signing.dumps({"r": other, "s": run.current_step, "t": run.transitions, "n": "x"},
                         key="not-this-site's-key", salt=approvals.SALT, compress=True)


CASES = [
    # (case, request, expected status)
    ("API: anonymous reads a run", lambda r, o: api().get(f"{API}/runs/{r}/"), 403),
    ("API: anonymous approves", lambda r, o: approve(api(), r), 403),
    ("API: signed in, no permission, reads",
     lambda r, o: api(make_user()).get(f"{API}/runs/{r}/"), 403),
    ("API: view permission only, approves",
     lambda r, o: approve(api(make_user("view_workflowrun")), r), 403),
    ("API: staff without the model permissions, reads",
     lambda r, o: api(make_user(staff=True)).get(f"{API}/runs/{r}/"), 403),
    ("API: staff without the model permissions, approves",
     lambda r, o: approve(api(make_user(staff=True)), r), 403),
    ("API: object-level denial (RUN_ACCESS), reads",
     lambda r, o: _denied(lambda: api(_operator()).get(f"{API}/runs/{r}/")), 403),
    ("API: object-level denial (RUN_ACCESS), approves",
     lambda r, o: _denied(lambda: approve(api(_operator()), r)), 403),
    ("API: session login, POST without a CSRF token",
     lambda r, o: approve(session_client(), r), 403),
    ("Link: tampered token", lambda r, o: Client().post(_tampered(r), {"action": "approve"}),
     403),
    ("Link: token for another run (forged, wrong key)",
     lambda r, o: Client().post(f"{API}/approvals/{forged_for(o, r)}/",
                                {"action": "approve"}), 403),
    ("Link: expired token", lambda r, o: _expired(r), 410),
    ("Link: POST without a CSRF token (browser with cookies)",
     lambda r, o: Client(enforce_csrf_checks=True).post(approvals.approval_link(r),
                                                        {"action": "approve"}), 403),
    ("Admin: anonymous opens the run page",
     lambda r, o: Client().get(f"/admin/queuety/workflowrun/{r}/change/"), 302),
    ("Admin: staff without the model permission opens the run page",
     lambda r, o: _staff().get(f"/admin/queuety/workflowrun/{r}/change/"), 403),
    ("Admin: staff without the model permission downloads the export",
     lambda r, o: _staff().get(f"/admin/queuety/workflowrun/{r}/export/"), 403),
]


def _operator() -> User:
    return make_user("view_workflowrun", "signal_workflowrun")


def _denied(call):
    with override_settings(QUEUETY=DENY):
        return call()


def _tampered(run_id: int) -> str:
    link = approvals.approval_link(run_id)
    part = link.rstrip("/").rsplit("/", 1)[1]
    return link.replace(part, part[:-2] + ("AA" if part[-2:] != "AA" else "BB"))


def _expired(run_id: int):
    link = approvals.approval_link(run_id)
    with override_settings(QUEUETY={**TEST_QUEUETY, "APPROVAL_LINK_MAX_AGE": -1}):
        return Client().post(link, {"action": "approve"})


def _staff() -> Client:
    client = Client()
    client.force_login(make_user(staff=True))
    return client


@pytest.fixture
def waiting_pair(worker, token):
    spec = (queuety.workflow(f"rel_access_{uuid.uuid4().hex[:6]}").wait_for_approval()
            .then(workflows.step_a))
    runs = [spec.dispatch({"token": token}) for _ in range(2)]
    for run_id in runs:
        wait_for(run_id, statuses=("waiting_for_signal",), worker=worker)
    return runs


@pytest.mark.parametrize("case,call,expected", CASES, ids=[c[0] for c in CASES])
def test_access__refused_with_the_expected_status_and_nothing_written(
        waiting_pair, case, call, expected, figures):
    run_id, other = waiting_pair

    response = call(run_id, other)

    assert response.status_code == expected, (case, response.content[:300])
    for pk in waiting_pair:
        assert queuety.workflow_status(pk).status == "waiting_for_signal"
        assert not Signal.objects.filter(run_id=pk).exists()
    figures.record(f"access: {case}", status=response.status_code)


def test_access__reused_link_and_the_control_cases(waiting_pair, worker, figures):
    run_id, other = waiting_pair
    link = approvals.approval_link(run_id)

    assert with_csrf(other).status_code == 200  # a session with its CSRF token gets in
    first = Client().post(link, {"action": "approve"})
    reused = Client().post(link, {"action": "approve"})

    assert first.status_code == 200 and reused.status_code == 410
    assert Signal.objects.filter(run_id=run_id).count() == 1
    assert wait_for(run_id, worker=worker).status == "completed"
    figures.record("access: Link: reused token", status=reused.status_code)
    figures.record("access: API: session login, POST with its CSRF token (control)",
                   status=200)
