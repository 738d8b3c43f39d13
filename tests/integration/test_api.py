"""The REST API and approval links (DRF), against PostgreSQL and a real worker."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from rest_framework.test import APIClient

import queuety
from queuety import approvals
from queuety.models import Event, Signal
from tests import workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

pytestmark = pytest.mark.worker

API = "/queuety/api"
SCHEMA = {"type": "object", "required": ["decision", "amount"],
          "properties": {"decision": {"enum": ["approve", "reject"]},
                         "amount": {"type": "integer", "minimum": 0, "maximum": 1000}}}


def make_user(*perms: str, staff: bool = False) -> User:
    user = User.objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def operator():
    client = APIClient()
    client.force_authenticate(make_user("view_workflowrun", "signal_workflowrun"))
    return client


def post(client, path, body=None, **headers):
    return client.post(f"{API}{path}", data=json.dumps(body) if body is not None else "",
                       content_type="application/json", headers=headers)


def waiting_run(token, builder=None):
    builder = builder or queuety.workflow("api_approval").wait_for_approval()
    return builder.then(workflows.step_a).dispatch({"token": token})


def test_get_run__the_status_fields(operator, worker, token):
    run_id = waiting_run(token)
    response = operator.get(f"{API}/runs/{run_id}/")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == run_id and body["status"] == "waiting_for_signal"
    assert body["waiting_for"] == ["approval"] and body["wait_details"]["human_wait"] == \
        "approval"
    assert operator.get(f"{API}/runs/99999999/").json() == {
        "detail": "Workflow run 99999999 does not exist.", "code": "run_not_found"}


def test_approve__resumes_the_run_and_a_second_answer_is_409(operator, worker, token,
                                                             semantics):
    run_id = waiting_run(token)

    first = post(operator, f"/runs/{run_id}/approve/", {"by": "editor@example.com"})
    second = post(operator, f"/runs/{run_id}/approve/", {"by": "someone else"})

    status = wait_for(run_id, worker=worker)
    time.sleep(0.5)  # room for a second downstream run that should not come
    downstream = len(workflows.marks(f"{token}-a"))
    semantics.record("H5 a second approve POST to an answered wait",
                     "HTTP 409 AlreadyAnswered; the downstream step ran once",
                     f"first {first.status_code}, second {second.status_code} "
                     f"{second.json().get('code')}; downstream ran {downstream} time(s)")
    assert first.status_code == 200 and first.json()["settled"] is True
    assert second.status_code == 409 and second.json()["code"] == "already_answered"
    assert status.state["approval"] == {"by": "editor@example.com"}
    assert downstream == 1
    sender = Signal.objects.get(run_id=run_id).sent_by
    assert sender.startswith("user:")


def test_reject__answers_a_decision(operator, worker, token):
    run_id = waiting_run(token, queuety.workflow("api_decision").wait_for_decision())
    response = post(operator, f"/runs/{run_id}/reject/", {"reason": "missing citations"})
    assert response.status_code == 200
    assert wait_for(run_id, worker=worker).state["decision"]["outcome"] == "rejected"


def test_signal__200_when_it_settles_202_when_stored_409_when_nothing_listens(operator, worker,
                                                                              token):
    run_id = (queuety.workflow("api_signals").then(workflows.slow).wait_for_signal("go")
              .then(workflows.step_a).dispatch({"token": token, "sleep": 1.0}))
    stored = post(operator, f"/runs/{run_id}/signals/go/", {"early": True})
    nobody = post(operator, f"/runs/{run_id}/signals/nope/", {})
    assert stored.status_code == 202 and stored.json()["settled"] is False
    assert nobody.status_code == 409 and nobody.json()["code"] == "run_not_waiting"
    assert wait_for(run_id, worker=worker).state["early"] is True

    parked = (queuety.workflow("api_signals2").wait_for_signal("go")
              .dispatch({"token": token}))
    settled = post(operator, f"/runs/{parked}/signals/go/", [1, "two"])
    assert settled.status_code == 200 and settled.json()["status"] == "completed"
    assert queuety.workflow_status(parked).state["go"] == [1, "two"]


def test_input__invalid_reply_is_400_with_every_path_and_the_run_keeps_waiting(operator, worker,
                                                                              token):
    run_id = waiting_run(token, queuety.workflow("api_input").wait_for_input(schema=SCHEMA))

    bad = post(operator, f"/runs/{run_id}/input/", {"decision": "maybe", "amount": -5})
    text_amount = post(operator, f"/runs/{run_id}/input/", {"decision": "approve",
                                                            "amount": "42"})
    good = post(operator, f"/runs/{run_id}/input/", {"decision": "approve", "amount": 42})

    assert bad.status_code == 400 and bad.json()["code"] == "invalid_payload"
    assert [e["path"] for e in bad.json()["errors"]] == ["/amount", "/decision"]
    assert text_amount.status_code == 400  # "42" is a string: no coercion
    assert [e["path"] for e in text_amount.json()["errors"]] == ["/amount"]
    assert good.status_code == 200
    assert wait_for(run_id, worker=worker).state["input"] == {"decision": "approve",
                                                              "amount": 42}
    assert Event.objects.filter(run_id=run_id, kind="signal_received").count() == 1


@pytest.mark.parametrize("reply", ["42", "true", "042", "NaN", "null", '"quoted"'])
def test_input__text_replies_arrive_byte_identical_and_no_schema_takes_anything(
        operator, worker, token, reply):
    typed = waiting_run(token, queuety.workflow("api_text").wait_for_input(
        schema={"type": "string"}))
    assert post(operator, f"/runs/{typed}/input/", reply).status_code == 200
    assert queuety.workflow_status(typed).state["input"] == reply
    free = waiting_run(token, queuety.workflow("api_free").wait_for_input())
    assert post(operator, f"/runs/{free}/input/", {"n": reply}).status_code == 200
    assert queuety.workflow_status(free).state["input"] == {"n": reply}


def test_input__number_for_a_string_schema_is_refused(operator, worker, token):
    run_id = waiting_run(token, queuety.workflow("api_num").wait_for_input(
        schema={"type": "string"}))
    response = post(operator, f"/runs/{run_id}/input/", 42)
    assert response.status_code == 400
    assert response.json()["errors"] == [{"path": "/", "message": "42 is not of type 'string'"}]


def test_bad_bodies__400_for_bad_json_413_for_too_big(operator, worker, token):
    run_id = waiting_run(token)
    broken = operator.post(f"{API}/runs/{run_id}/approve/", data="{nope",
                           content_type="application/json")
    bare_nan = operator.post(f"{API}/runs/{run_id}/approve/", data="NaN",
                             content_type="application/json")
    huge = post(operator, f"/runs/{run_id}/approve/", {"blob": "x" * 70_000})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["detail"]
    assert bare_nan.status_code == 400
    assert huge.status_code == 413 and huge.json()["code"] == "payload_too_large"
    assert not Signal.objects.filter(run_id=run_id).exists()
    assert post(operator, "/runs/99999999/approve/", {}).status_code == 404


def test_budget_breach__409_with_the_figures_and_nothing_recorded(operator, worker, token):
    run_id = waiting_run(token, queuety.workflow("api_tight").max_state_bytes(120)
                         .wait_for_approval())
    response = post(operator, f"/runs/{run_id}/approve/", {"blob": "x" * 200})
    body = response.json()
    assert response.status_code == 409 and body["code"] == "budget_exceeded"
    assert (body["budget"], body["limit"]) == ("max_state_bytes", 120) and body["used"] > 120
    assert queuety.workflow_status(run_id).status == "waiting_for_signal"
    assert not Signal.objects.filter(run_id=run_id).exists()


def test_idempotency_key__a_retried_post_replays_the_first_answer(operator, worker, token,
                                                                  semantics):
    run_id = waiting_run(token)
    key = uuid.uuid4().hex
    first = post(operator, f"/runs/{run_id}/approve/", {"by": "a"}, **{"Idempotency-Key": key})
    again = post(operator, f"/runs/{run_id}/approve/", {"by": "a"}, **{"Idempotency-Key": key})
    elsewhere = post(operator, f"/runs/{run_id}/reject/", {}, **{"Idempotency-Key": key})

    semantics.record("H5 a retried approve POST with the same Idempotency-Key",
                     "the original 2xx again; one reply recorded",
                     f"first {first.status_code}, retry {again.status_code} (body "
                     f"{'identical' if again.json() == first.json() else 'DIFFERENT'}, "
                     f"Idempotent-Replayed: {again.headers.get('Idempotent-Replayed')}); the "
                     f"key on another endpoint {elsewhere.status_code} "
                     f"{elsewhere.json().get('code')}; "
                     f"{Signal.objects.filter(run_id=run_id).count()} signal(s) stored")
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert elsewhere.status_code == 409 and elsewhere.json()["code"] == "idempotency_key_reused"
    assert Signal.objects.filter(run_id=run_id).count() == 1


def test_access__anonymous_unpermitted_staff_csrf_and_object_level(worker, token):
    run_id = waiting_run(token)
    anonymous = APIClient()
    viewer = APIClient()
    viewer.force_authenticate(make_user("view_workflowrun"))
    staff = APIClient()
    staff.force_authenticate(make_user(staff=True))

    assert anonymous.get(f"{API}/runs/{run_id}/").status_code == 403
    assert post(anonymous, f"/runs/{run_id}/approve/", {}).status_code == 403
    assert staff.get(f"{API}/runs/{run_id}/").status_code == 403
    assert viewer.get(f"{API}/runs/{run_id}/").status_code == 200
    assert post(viewer, f"/runs/{run_id}/approve/", {}).status_code == 403

    session = APIClient(enforce_csrf_checks=True)
    user = make_user("view_workflowrun", "signal_workflowrun")
    session.login(username=user.username, password="pw")
    assert post(session, f"/runs/{run_id}/approve/", {}).status_code == 403  # no CSRF token

    operator = APIClient()
    operator.force_authenticate(user)
    denied = {**TEST_QUEUETY, "RUN_ACCESS": "tests.workflows.deny_all"}
    with override_settings(QUEUETY=denied):
        assert operator.get(f"{API}/runs/{run_id}/").status_code == 403
        assert post(operator, f"/runs/{run_id}/approve/", {}).status_code == 403
    assert not Signal.objects.filter(run_id=run_id).exists()
    assert queuety.workflow_status(run_id).status == "waiting_for_signal"


def test_waits__people_waits_oldest_first(operator, worker, token):
    first = waiting_run(token)
    second = waiting_run(token, queuety.workflow("api_input2").wait_for_input(schema=SCHEMA))
    machine = (queuety.workflow("api_machine").wait_for_signal("webhook")
               .dispatch({"token": token}))
    listed = [row["id"] for row in operator.get(f"{API}/waits/").json()]
    assert first in listed and second in listed and machine not in listed
    assert listed.index(first) < listed.index(second)
    entry = next(row for row in operator.get(f"{API}/waits/").json() if row["id"] == second)
    assert entry["human_wait"] == "input" and entry["schema"] == SCHEMA


def test_openapi_schema__describes_the_endpoints(operator):
    response = operator.get(f"{API}/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    schema = json.loads(response.content)
    paths = set(schema["paths"])
    assert response.status_code == 200 and schema["openapi"].startswith("3.")
    assert {f"{API}/runs/{{id}}/", f"{API}/runs/{{id}}/approve/", f"{API}/waits/",
            f"{API}/runs/{{id}}/signals/{{name}}/", f"{API}/runs/{{id}}/input/"} <= paths


def test_approval_link__page_approve_once(worker, token):
    run_id = waiting_run(token, queuety.workflow("linked").wait_for_decision())
    link = approvals.approval_link(run_id)
    browser = Client(enforce_csrf_checks=True)

    page = browser.get(link)
    assert page.status_code == 200
    html = page.content.decode()
    assert "linked" in html and 'value="approve"' in html and 'value="reject"' in html
    csrf = page.cookies["csrftoken"].value
    done = browser.post(link, {"action": "approve", "note": "lgtm",
                               "csrfmiddlewaretoken": csrf})
    assert done.status_code == 200 and "was recorded" in done.content.decode()
    assert wait_for(run_id, worker=worker).state["decision"]["outcome"] == "approved"

    reused = browser.post(link, {"action": "reject", "csrfmiddlewaretoken": csrf})
    assert reused.status_code == 410 and "already answered" in reused.content.decode()
    assert browser.get(link).status_code == 410
    assert Signal.objects.filter(run_id=run_id).count() == 1


def test_approval_link__absolute_with_base_url_for_mail_sent_without_a_request(worker, token):
    run_id = waiting_run(token)
    assert approvals.approval_link(run_id).startswith("/queuety/api/approvals/")
    with override_settings(QUEUETY={**TEST_QUEUETY, "BASE_URL": "https://shop.example.com/"}):
        link = approvals.approval_link(run_id)
    assert link.startswith("https://shop.example.com/queuety/api/approvals/")
    page = Client().get(link.removeprefix("https://shop.example.com"))
    assert page.status_code == 200 and "api_approval" in page.content.decode()
    # The demo overrides the page as a site would (templates/queuety/approval.html).
    assert 'id="shop-header"' in page.content.decode()


def test_approval_link__tampered_expired_and_csrf(worker, token):
    run_id = waiting_run(token)
    link = approvals.approval_link(run_id)
    token_part = link.rstrip("/").rsplit("/", 1)[1]
    tampered = link.replace(token_part, token_part[:-2] + ("AA" if token_part[-2:] != "AA"
                                                            else "BB"))
    assert Client().get(tampered).status_code == 403
    assert Client().post(tampered, {"action": "approve"}).status_code == 403
    assert Client(enforce_csrf_checks=True).post(link, {"action": "approve"}).status_code == 403
    with override_settings(QUEUETY={**TEST_QUEUETY, "APPROVAL_LINK_MAX_AGE": 1}):
        time.sleep(2.1)
        expired = Client().post(link, {"action": "approve"})
    assert expired.status_code == 410 and "expired" in expired.content.decode()
    assert queuety.workflow_status(run_id).status == "waiting_for_signal"
    assert not Signal.objects.filter(run_id=run_id).exists()


def test_approval_link__is_bound_to_its_run(worker, token):
    run_a = waiting_run(token)
    run_b = waiting_run(token)
    Client().post(approvals.approval_link(run_a), {"action": "approve"})
    assert queuety.workflow_status(run_b).status == "waiting_for_signal"
    assert wait_for(run_a, worker=worker).status == "completed"


def test_approval_link__input_form_from_the_schema(worker, token):
    run_id = waiting_run(token, queuety.workflow("linked_input").wait_for_input(schema=SCHEMA))
    link = approvals.approval_link(run_id)
    html = Client().get(link).content.decode()
    assert 'name="decision"' in html and "<option>approve</option>" in html
    assert 'type="number"' in html and 'name="amount"' in html

    refused = Client().post(link, {"action": "input", "decision": "approve", "amount": "abc"})
    assert refused.status_code == 400 and "/amount" in refused.content.decode()
    done = Client().post(link, {"action": "input", "decision": "reject", "amount": "12"})
    assert done.status_code == 200
    assert wait_for(run_id, worker=worker).state["input"] == {"decision": "reject",
                                                              "amount": 12}


def test_approval_link__an_answered_link_never_shows_later_state(worker, token):
    run_id = waiting_run(token, queuety.workflow("linked_later").wait_for_approval()
                         .wait_for_approval(name="second"))
    link = approvals.approval_link(run_id)
    Client().post(link, {"action": "approve"})
    queuety.workflow_status(run_id)  # parked at the second approval now
    for response in (Client().post(link, {"action": "bogus"}), Client().get(link),
                     Client().post(link, {"action": "approve"})):
        html = response.content.decode()
        assert response.status_code in (400, 410) and token not in html
        assert "What the run knows" not in html


def test_signal_override__a_reply_cannot_send_another_kind(operator, worker, token):
    run_id = waiting_run(token, queuety.workflow("api_override").wait_for_decision())
    response = operator.post(f"{API}/runs/{run_id}/approve/?signal=rejection", data="{}",
                             content_type="application/json")
    assert response.status_code == 409
    assert queuety.workflow_status(run_id).status == "waiting_for_signal"
