"""Inbound webhooks (queuety.inbound, POST hooks/<name>/) on PostgreSQL, through Django's
test client: each answer, what it stores, and a started run completing on a real worker."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings

import queuety
from queuety.hooks import declare, receive
from queuety.models import DispatchKey, InboundDelivery, Signal, WorkflowRun
from tests import keyed_steps, workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY

API = "/queuety/api"
SECRET = "whsec_inbound_test_secret"

#: Parks at once (no step message is published), so a test needs no worker for its run.
PARKED = queuety.workflow("hook_parked").wait_for_signal("go").then(workflows.step_a)


def stripe_headers(body: bytes, t: int | None = None, secret: str = SECRET) -> dict[str, str]:
    t = int(time.time()) if t is None else t
    signature = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={t},v1={signature}"}


def github_headers(body: bytes, delivery: str, secret: str = SECRET) -> dict[str, str]:
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={signature}", "X-GitHub-Delivery": delivery,
            "X-GitHub-Event": "push", "Authorization": "Bearer must-not-be-kept"}


def post(name: str, body: bytes, headers: dict[str, str]):
    # CSRF checks on, as a browser-facing site has them: the hook endpoint needs none.
    return Client(enforce_csrf_checks=True).post(f"{API}/hooks/{name}/", data=body, content_type="application/json",
                         headers=headers)


@pytest.fixture
def hook_name(token):
    name = f"hook-{token}"
    yield name
    declare.forget(name)


def event(**fields) -> bytes:
    return json.dumps({"id": f"evt_{uuid.uuid4().hex}", "type": "charge.succeeded",
                       **fields}).encode()


def test_stripe__a_delivery_is_stored_and_starts_a_run_with_its_payload(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token, amount=700)

    response = post(hook_name, body, stripe_headers(body))

    assert response.status_code == 202, response.content
    answer = response.json()
    assert answer["outcome"] == "started" and answer["replayed"] is False
    run = WorkflowRun.objects.get(pk=answer["run_id"])
    assert run.name == "hook_parked" and run.state["amount"] == 700 \
        and run.state["token"] == token
    delivery = InboundDelivery.objects.get(hook=hook_name)
    assert delivery.event_id == json.loads(body)["id"] and delivery.run_id == run.pk
    assert delivery.body == body.decode() and delivery.outcome == "started"
    assert "Stripe-Signature" not in delivery.headers and \
        not any(k.lower() == "stripe-signature" for k in delivery.headers)


def test_replay__answers_200_and_starts_nothing_new(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token)

    first = post(hook_name, body, stripe_headers(body))
    # Stripe's retry: the same event, signed again at a later time.
    again = post(hook_name, body, stripe_headers(body, t=int(time.time()) + 5))

    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["replayed"] is True and again.json()["run_id"] == first.json()["run_id"]
    assert InboundDelivery.objects.filter(hook=hook_name).count() == 1
    assert WorkflowRun.objects.filter(name="hook_parked", state__token=token).count() == 1


def test_github__the_delivery_header_dedupes_and_no_credential_is_stored(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.github(SECRET), start=PARKED,
                    payload=lambda e: {"token": e["token"], "ref": e["ref"]})
    delivery = str(uuid.uuid4())
    body = json.dumps({"ref": "refs/heads/main", "token": token}).encode()

    first = post(hook_name, body, github_headers(body, delivery))
    again = post(hook_name, body, github_headers(body, delivery))

    assert (first.status_code, again.status_code) == (202, 200)
    row = InboundDelivery.objects.get(hook=hook_name)
    assert row.event_id == delivery
    assert {k.lower() for k in row.headers} >= {"x-github-delivery", "x-github-event"}
    assert not {k.lower() for k in row.headers} & {"x-hub-signature-256", "authorization"}
    run = WorkflowRun.objects.get(pk=row.run_id)
    assert run.state == {"token": token, "ref": "refs/heads/main"}


def _nothing_stored(hook_name, token):
    assert not InboundDelivery.objects.filter(hook=hook_name).exists()
    assert not WorkflowRun.objects.filter(state__token=token).exists()


@pytest.mark.parametrize("spoil", ["secret", "body", "expired", "missing"])
def test_bad_signature__401_with_a_json_error_and_nothing_stored(hook_name, token, spoil):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token)
    headers = {"secret": stripe_headers(body, secret="whsec_wrong"),
               "body": stripe_headers(body + b" "),
               "expired": stripe_headers(body, t=int(time.time()) - 301),
               "missing": {}}[spoil]

    response = post(hook_name, body, headers)

    assert response.status_code == 401
    assert response.json()["code"] == "invalid_signature"
    assert "Nothing was stored" in response.json()["detail"]
    _nothing_stored(hook_name, token)


def test_oversized_body__413_and_nothing_stored(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token, padding="x" * 2000)
    with override_settings(QUEUETY={**TEST_QUEUETY, "INBOUND_MAX_BYTES": 1000}):
        response = post(hook_name, body, stripe_headers(body))
    assert response.status_code == 413 and response.json()["code"] == "payload_too_large"
    assert "INBOUND_MAX_BYTES" in response.json()["detail"]
    _nothing_stored(hook_name, token)


def test_unknown_hook__404_and_nothing_stored(token):
    body = event(token=token)
    response = post(f"nobody-{token}", body, stripe_headers(body))
    assert response.status_code == 404 and response.json()["code"] == "hook_not_found"
    _nothing_stored(f"nobody-{token}", token)


def test_signed_but_not_json__400_and_nothing_stored(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.hmac(SECRET, header="X-Sig"),
                    start=PARKED)
    body = f"token={token}".encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    response = post(hook_name, body, {"X-Sig": signature})
    assert response.status_code == 400 and response.json()["code"] == "malformed_delivery"
    _nothing_stored(hook_name, token)


def test_signal__delivered_to_the_run_chosen_by_run(hook_name, token):
    run_id = PARKED.dispatch({"token": token})
    queuety.inbound(hook_name, verify=queuety.verifiers.hmac(SECRET, header="X-Sig",
                                                               id_header="X-Id"),
                    signal="go", run=lambda e: e["run"])
    body = json.dumps({"run": run_id, "note": "paid"}).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()

    response = post(hook_name, body, {"X-Sig": signature, "X-Id": f"d-{token}"})
    again = post(hook_name, body, {"X-Sig": signature, "X-Id": f"d-{token}"})

    assert response.status_code == 202 and response.json()["outcome"] == "signalled"
    assert response.json()["run_id"] == run_id and again.status_code == 200
    signals = Signal.objects.filter(run_id=run_id, name="go")
    assert [s.payload for s in signals] == [{"run": run_id, "note": "paid"}]
    assert signals[0].sent_by == f"hook:{hook_name}"


def test_signal__a_refused_signal_is_stored_as_failed_with_the_error(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.hmac(SECRET, header="X-Sig"),
                    signal="go", run=lambda e: e["run"])
    body = json.dumps({"run": 2**62, "token": token}).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()

    response = post(hook_name, body, {"X-Sig": signature})

    assert response.status_code == 200 and response.json()["outcome"] == "failed"
    row = InboundDelivery.objects.get(hook=hook_name)
    assert row.outcome == "failed" and "RunNotFound" in row.error and row.run_id is None
    # No event id from the verifier nor event_id=: a hash of the body still dedupes retries.
    assert row.event_id.startswith("sha256:")


def test_event_id__a_custom_delivery_id_dedupes(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED,
                    event_id=lambda e: e["data"]["order"])
    first, second = (json.dumps({"id": f"evt_{n}_{token}", "token": token,
                                 "data": {"order": 17}}).encode() for n in (1, 2))
    assert post(hook_name, first, stripe_headers(first)).status_code == 202
    assert post(hook_name, second, stripe_headers(second)).status_code == 200
    assert InboundDelivery.objects.get(hook=hook_name).event_id == "17"
    assert WorkflowRun.objects.filter(state__token=token).count() == 1


def test_rolled_back__a_delivery_received_in_a_transaction_that_rolls_back_stores_nothing(
        hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token)

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        received = receive.receive(hook_name, stripe_headers(body), body)
        assert received.outcome == "started"
        raise Abort

    _nothing_stored(hook_name, token)
    assert not DispatchKey.objects.filter(key__startswith=f"inbound:{hook_name}:").exists()


def test_registered_workflow__started_by_name_completes_on_a_real_worker(
        hook_name, token, worker):
    queuety.inbound(hook_name, verify=queuety.verifiers.github(SECRET), start="reg_letters")
    body = json.dumps({"token": token}).encode()

    response = post(hook_name, body, github_headers(body, str(uuid.uuid4())))

    assert response.status_code == 202
    status = wait_for(response.json()["run_id"], worker=worker)
    assert status.status == "completed"
    assert WorkflowRun.objects.get(pk=response.json()["run_id"]).state["log"] == ["a", "b", "c"]
    assert workflows.marks(f"{token}-c")


@pytest.mark.parametrize("options, message", [
    ({"start": PARKED, "signal": "go", "run": int}, "not both or neither"),
    ({}, "needs start="),
    ({"signal": "go"}, "comes with run="),
    ({"start": 5}, "start= must be"),
    ({"start": PARKED, "key": "id"}, "key= must be a function"),
    ({"start": PARKED, "event_id": "id"}, "event_id= must be a function"),
    ({"start": PARKED, "signal": "go"}, "are per key: pass key="),
    ({"start": PARKED, "debounce": 5}, "are per key: pass key="),
    ({"start": PARKED, "key": str, "debounce": 5, "singleton": True}, "use one flow control"),
    ({"start": PARKED, "key": str, "debounce": -1}, "debounce"),
    ({"signal": "go", "run": int, "debounce": 5}, "applies to the runs start= starts"),
    ({"signal": "go", "run": int, "key": str}, "with run= the run is named already"),
])
def test_declaration__mistakes_are_errors_at_start_up(options, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        queuety.inbound("bad", verify=queuety.verifiers.github(SECRET), **options)
    with pytest.raises(queuety.WorkflowDefinitionError, match="verify="):
        queuety.inbound("bad", verify="github", start=PARKED)  # type: ignore[arg-type]
    with pytest.raises(queuety.WorkflowDefinitionError, match="URL"):
        queuety.inbound("no/slash", verify=queuety.verifiers.github(SECRET), start=PARKED)


def test_unauthenticated_random_posts__only_401_404_413_and_nothing_stored(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    bodies = [b"", b"{}", b"null", b"\xff\xfe", b"[" * 5000, event(token=token),
              b"x" * (1024 * 1024 + 1)]
    headers = [{}, {"Stripe-Signature": "t=1,v1=00"}, {"Stripe-Signature": "=,=,t"},
               {"Stripe-Signature": f"t={int(time.time())},v1={'a' * 64}"},
               {"Content-Type": "text/plain", "Stripe-Signature": "v1=" + "b" * 5000}]
    seen = set()
    for name in (hook_name, f"{hook_name}-other", "..", "%00"):
        for body in bodies:
            for header in headers:
                response = post(name, body, header)
                assert response.status_code in (401, 404, 413), (name, body[:20], header)
                assert response.json()["code"]
                seen.add(response.status_code)
    assert seen == {401, 404, 413}
    _nothing_stored(hook_name, token)


def test_admin__lists_deliveries_with_their_outcome_read_only(hook_name, token, admin_client):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token)
    post(hook_name, body, stripe_headers(body))
    row = InboundDelivery.objects.get(hook=hook_name)

    listing = admin_client.get("/admin/queuety/inbounddelivery/", {"hook": hook_name})
    page = admin_client.get(f"/admin/queuety/inbounddelivery/{row.pk}/change/")

    assert listing.status_code == 200 and row.event_id in listing.content.decode()
    assert "started" in listing.content.decode()
    assert page.status_code == 200 and token in page.content.decode()
    assert admin_client.get("/admin/queuety/inbounddelivery/add/").status_code == 403
    assert admin_client.post(f"/admin/queuety/inbounddelivery/{row.pk}/delete/",
                             {"post": "yes"}).status_code == 403
    assert InboundDelivery.objects.filter(pk=row.pk).exists()


def test_concurrent_retries__of_one_delivery_start_one_run(hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token)
    barrier = threading.Barrier(8)
    statuses = []

    def deliver():
        try:
            barrier.wait()
            statuses.append(post(hook_name, body, stripe_headers(body)).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(statuses) == [200] * 7 + [202]
    assert InboundDelivery.objects.filter(hook=hook_name).count() == 1
    assert WorkflowRun.objects.filter(state__token=token).count() == 1


def test_autodiscovery__a_hook_declared_in_an_apps_workflows_py_is_served(token):
    assert "testapp-github" in [hook.name for hook in declare.declared()]
    body = json.dumps({"token": token}).encode()
    refused = post("testapp-github", body, github_headers(body, str(uuid.uuid4())))
    assert refused.status_code == 401  # signed with another secret than the app's
    _nothing_stored("testapp-github", token)


def test_long_ids__two_ids_sharing_their_first_255_characters_are_two_deliveries(
        hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    prefix = "evt_" + "x" * 300
    bodies = [json.dumps({"id": f"{prefix}{n}_{token}", "token": token}).encode()
              for n in (1, 2)]

    answers = [post(hook_name, body, stripe_headers(body)) for body in bodies]
    again = post(hook_name, bodies[0], stripe_headers(bodies[0]))

    assert [a.status_code for a in answers] == [202, 202] and again.status_code == 200
    rows = InboundDelivery.objects.filter(hook=hook_name)
    assert rows.count() == 2 and all(len(row.event_id) <= 255 for row in rows)
    assert WorkflowRun.objects.filter(state__token=token).count() == 2


@pytest.mark.parametrize("signature", [
    "t=99999999999999999999999999,v1=00",  # a timestamp too large for the clock arithmetic
    "t=１２３,v1=00",  # digits, but not ASCII ones
    "t={now},v1=é" + "0" * 63,  # a non-ASCII signature
])
def test_hostile_signature_headers__401_not_500(hook_name, token, signature):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=PARKED)
    body = event(token=token)
    headers = {"Stripe-Signature": signature.format(now=int(time.time()))}

    response = post(hook_name, body, headers)

    assert response.status_code == 401, response.content
    assert response.json()["code"] == "invalid_signature"
    _nothing_stored(hook_name, token)


@pytest.mark.parametrize("returned", ["", None])
def test_a_secret_function_returning_no_secret__500_naming_it_and_nothing_stored(
        hook_name, token, returned):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(lambda: returned), start=PARKED)
    body = event(token=token)
    # Signed with the empty key an attacker could compute: it must still be refused.
    forged = hmac.new(b"", f"{int(time.time())}.".encode() + body, hashlib.sha256).hexdigest()

    response = post(hook_name, body, {"Stripe-Signature": f"t={int(time.time())},v1={forged}"})

    assert response.status_code == 500 and response.json()["code"] == "hook_misconfigured"
    assert "secret function returned" in response.json()["detail"]
    _nothing_stored(hook_name, token)


# -- with a run key: signal-with-start and flow control (queuety.keyed) -------------------------

def test_signal_with_start__deliveries_of_one_key_go_to_one_run_in_order(hook_name, token):
    inbox = keyed_steps.inbox(f"hook_inbox_{token}")
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET), start=inbox,
                    signal="event", key=lambda e: e["order"])
    bodies = [event(token=token, order=f"o-{token}", n=n) for n in range(3)]

    answers = [post(hook_name, body, stripe_headers(body)).json() for body in bodies]

    assert [a["outcome"] for a in answers] == ["started", "signalled", "signalled"]
    [run_id] = {a["run_id"] for a in answers}
    assert WorkflowRun.objects.get(pk=run_id).key == f"o-{token}"
    assert [s.payload["n"] for s in Signal.objects.filter(run_id=run_id).order_by("pk")] \
        == [0, 1, 2]
    queuety.cancel(run_id)


def test_debounce__a_burst_of_deliveries_of_one_key_is_one_pending_run_with_the_last(
        hook_name, token):
    queuety.inbound(hook_name, verify=queuety.verifiers.stripe(SECRET),
                    start=keyed_steps.plain(f"hook_debounced_{token}"),
                    key=lambda e: e["order"], debounce=60)
    bodies = [event(token=token, order=f"o-{token}", n=n) for n in range(5)]

    answers = [post(hook_name, body, stripe_headers(body)) for body in bodies]

    assert [a.status_code for a in answers] == [202] * 5  # each a new delivery, stored
    assert [a.json()["outcome"] for a in answers] == ["started"] + ["signalled"] * 4
    [run] = WorkflowRun.objects.filter(key=f"o-{token}")
    assert run.state["n"] == 4 and InboundDelivery.objects.filter(hook=hook_name).count() == 5
    queuety.cancel(run.pk)
