"""The webhooks admin: the secret is write-only, the delivery log is read-only, and the
redeliver action sends a delivery again (through the session's real worker)."""

from __future__ import annotations

import time
import uuid

import pytest
from django.utils import timezone

from queuety.models import WebhookDelivery, WebhookEndpoint

ENDPOINTS = "/admin/queuety/webhookendpoint/"
DELIVERIES = "/admin/queuety/webhookdelivery/"
SECRET = "admin-secret-" + uuid.uuid4().hex


def test_an_endpoint__is_created_with_its_secret_which_is_never_shown_again(admin_client):
    response = admin_client.post(ENDPOINTS + "add/", {
        "url": "https://hooks.example.com/queuety", "events": ["run.failed", "step.failed"],
        "secret": SECRET, "active": "on", "description": "pager"})
    assert response.status_code == 302, response.content.decode()[:2000]
    endpoint = WebhookEndpoint.objects.get(description="pager", url__contains="example.com")
    try:
        assert endpoint.secret == SECRET and endpoint.events == ["run.failed", "step.failed"]
        for page in (ENDPOINTS, f"{ENDPOINTS}{endpoint.pk}/change/"):
            body = admin_client.get(page).content.decode()
            assert "hooks.example.com" in body and SECRET not in body
        # Saved with the secret left blank: the stored one is kept.
        admin_client.post(f"{ENDPOINTS}{endpoint.pk}/change/", {
            "url": "https://hooks.example.com/v2", "events": ["run.failed"], "secret": "",
            "active": "on", "description": "pager"})
        endpoint.refresh_from_db()
        assert (endpoint.url, endpoint.secret) == ("https://hooks.example.com/v2", SECRET)
    finally:
        endpoint.delete()


@pytest.mark.parametrize("values, message", [
    ({"url": "ftp://example.com/x", "secret": SECRET}, "must start with http:// or https://"),
    ({"url": "https://example.com/x", "secret": "short"}, "at least 16 characters"),
    ({"url": "https://example.com/x", "secret": ""}, "Enter a secret"),
])
def test_a_bad_endpoint__is_refused_saying_why_and_writes_nothing(admin_client, values,
                                                                  message):
    before = WebhookEndpoint.objects.count()
    response = admin_client.post(ENDPOINTS + "add/", {"events": ["run.failed"], "active": "on",
                                                      **values})
    assert response.status_code == 200
    assert message in response.content.decode()
    assert WebhookEndpoint.objects.count() == before


def test_the_delivery_log__lists_and_redelivers(admin_client, worker):
    endpoint = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/down", secret=SECRET,
                                              events=["run.failed"], active=False)
    try:
        row = WebhookDelivery.objects.create(
            endpoint=endpoint, event="run.failed", event_id=uuid.uuid4(), run_id=None,
            payload={"type": "run.failed", "data": {}}, status=WebhookDelivery.FAILED,
            attempts=3, last_status_code=502, next_attempt_at=timezone.now())
        body = admin_client.get(DELIVERIES).content.decode()
        assert "run.failed" in body and "502" in body and SECRET not in body
        assert admin_client.get(f"{DELIVERIES}{row.pk}/change/").status_code == 200
        assert admin_client.get(DELIVERIES + "add/").status_code == 403
        response = admin_client.post(DELIVERIES, {"action": "redeliver",
                                                  "_selected_action": [row.pk]}, follow=True)
        assert "1 deliveries queued to be sent again." in response.content.decode()
        # The worker sends it: the endpoint is inactive, so it fails at once, attempt 1.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            row.refresh_from_db()
            if row.status == WebhookDelivery.FAILED and row.attempts == 1:
                break
            time.sleep(0.1)
        assert (row.status, row.attempts, row.last_error) == (
            WebhookDelivery.FAILED, 1, "The endpoint is not active.")
    finally:
        endpoint.delete()


def test_the_sweeper__sends_a_delivery_whose_message_was_lost(worker):
    endpoint = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/down", secret=SECRET,
                                              events=["run.failed"], active=False)
    try:
        # Committed without any message: as if the worker died before publishing it.
        row = WebhookDelivery.objects.create(
            endpoint=endpoint, event="run.failed", event_id=uuid.uuid4(),
            payload={"type": "run.failed", "data": {}},
            next_attempt_at=timezone.now() - timezone.timedelta(seconds=10))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            row.refresh_from_db()
            if row.attempts:
                break
            time.sleep(0.2)
        assert (row.status, row.attempts) == (WebhookDelivery.FAILED, 1)
    finally:
        endpoint.delete()
