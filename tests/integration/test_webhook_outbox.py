"""The outbox against an endpoint list cached in this process while another process changes
it, and against an endpoint deleted while an event for it is being written."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, connections, transaction

from queuety.models import WebhookDelivery, WebhookEndpoint
from queuety.webhooks import outbox


@pytest.fixture
def endpoints(monkeypatch):
    """``endpoints(n)``: n active endpoints receiving ``run.completed``, deleted afterwards;
    the endpoint cache lives long enough for no test to see it refreshed by chance."""
    monkeypatch.setattr(outbox, "CACHE_SECONDS", 300.0)
    outbox.forget()
    made: list[WebhookEndpoint] = []

    def make(count: int) -> list[WebhookEndpoint]:
        made.extend(WebhookEndpoint.objects.create(
            url="http://127.0.0.1:9/outbox", secret="s" * 32, events=["run.completed"])
            for _ in range(count))
        return made[-count:]

    yield make
    WebhookEndpoint.objects.filter(pk__in=[endpoint.pk for endpoint in made]).delete()
    outbox.forget()  # a raw change left this process's cache naming an endpoint


def _behind_the_cache(sql: str, pk: int) -> None:
    """Change an endpoint as another process would: without this process's model signals,
    which would drop its cached endpoint list."""
    with connection.cursor() as cursor:
        cursor.execute(sql, [pk])


def _run_id() -> int:
    """A run id no run has, so that the deliveries found are this test's own."""
    return -int(uuid.uuid4().int % 1_000_000) - 1


def _event(run_id: int) -> None:
    with transaction.atomic():
        outbox.write("run_completed", {"run_id": run_id, "workflow": "outbox"})


def test_an_endpoint_deleted_elsewhere_gets_no_delivery_and_the_event_commits(endpoints):
    gone, kept = endpoints(2)
    assert {gone.pk, kept.pk} <= set(outbox.subscribers()["run.completed"])
    _behind_the_cache("DELETE FROM queuety_webhookendpoint WHERE id = %s", gone.pk)
    run_id = _run_id()
    # The cache still names the deleted endpoint: its delivery row would fail its foreign key
    # at the commit and roll the event back with it.
    assert gone.pk in outbox.subscribers()["run.completed"]
    _event(run_id)

    assert set(WebhookDelivery.objects.filter(run_id=run_id)
               .values_list("endpoint_id", flat=True)) == {kept.pk}


def test_an_endpoint_deactivated_elsewhere_gets_no_delivery(endpoints):
    (paused,) = endpoints(1)
    assert paused.pk in outbox.subscribers()["run.completed"]
    _behind_the_cache("UPDATE queuety_webhookendpoint SET active = false WHERE id = %s",
                      paused.pk)
    run_id = _run_id()
    _event(run_id)
    assert not WebhookDelivery.objects.filter(run_id=run_id).exists()


def test_an_endpoint_deleted_while_an_event_for_it_is_written_waits_then_deletes(endpoints):
    (endpoint,) = endpoints(1)
    outbox.subscribers()
    run_id = _run_id()
    written, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def event() -> None:
        try:
            with transaction.atomic():
                outbox.write("run_completed", {"run_id": run_id, "workflow": "outbox"})
                written.set()
                release.wait(30)
        finally:
            connections.close_all()

    def delete() -> None:
        try:
            WebhookEndpoint.objects.get(pk=endpoint.pk).delete()
            outcome["deleted_at"] = time.monotonic()
        except Exception as error:  # noqa: BLE001 - the test reports it
            outcome["error"] = error
        finally:
            connections.close_all()

    writer = threading.Thread(target=event)
    writer.start()
    assert written.wait(30), "the event was never written"
    deleter = threading.Thread(target=delete)
    deleter.start()
    deleter.join(1.0)
    # The event's transaction holds the endpoint: the delete waits for it.
    assert deleter.is_alive() and not outcome, outcome
    released_at = time.monotonic()
    release.set()
    writer.join(30)
    deleter.join(30)

    assert "error" not in outcome, outcome.get("error")
    assert outcome["deleted_at"] >= released_at
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert not WebhookDelivery.objects.filter(run_id=run_id).exists()
