"""The webhook outbox: a delivery row per subscribed endpoint, written in the transaction of
the event it announces, so it commits (and survives a crash) with the event or not at all.

:func:`wants` answers from a per-process cache of the active endpoints' events (read at most
every :data:`CACHE_SECONDS`, and at once after an endpoint is saved in this process), so an
event no endpoint subscribes to costs no query.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from django.db import connection, connections, transaction
from django.utils import timezone

from queuety import publish, signals
from queuety.masking import mask
from queuety.models import WebhookDelivery, WebhookEndpoint

#: Seconds an endpoint change made in another process may take to reach this one.
CACHE_SECONDS = 5.0

_cache: tuple[float, dict[str, list[int]]] | None = None


def forget(**kwargs: Any) -> None:
    """Drop the cached endpoints (connected to the endpoint model's save and delete)."""
    global _cache
    _cache = None


def subscribers() -> dict[str, list[int]]:
    """Webhook event name -> ids of the active endpoints that receive it (cached)."""
    global _cache
    if _cache is None or _cache[0] < time.monotonic():
        by_event: dict[str, list[int]] = {}
        for pk, events in WebhookEndpoint.objects.filter(active=True).values_list("pk",
                                                                                  "events"):
            for event in events or ():
                by_event.setdefault(event, []).append(pk)
        _cache = (time.monotonic() + CACHE_SECONDS, by_event)
    return _cache[1]


#: The cached endpoints that are still there and active, locked until the commit: the cache
#: may name one another process deleted, whose delivery row would fail its foreign key at the
#: commit (Django's are deferred) and take the event's transaction, a step's outcome, with it.
_LOCK_ACTIVE = """
SELECT id FROM queuety_webhookendpoint WHERE id = ANY(%s) AND active ORDER BY id FOR KEY SHARE
"""


def _still_active(endpoints: list[int]) -> list[int]:
    """Those of ``endpoints`` still present and active, held against deletion until this
    transaction ends (on PostgreSQL; SQLite's single writer cannot race the delete)."""
    if connection.vendor != "postgresql":
        return list(WebhookEndpoint.objects.filter(pk__in=endpoints, active=True)
                    .values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_ACTIVE, [list(endpoints)])
        return [row[0] for row in cursor.fetchall()]


def hold_for_delete(sender: Any, instance: WebhookEndpoint, using: str, **kwargs: Any) -> None:
    """Before an endpoint is deleted (``pre_delete``, inside the delete's transaction): lock it
    against the events being written, then delete its deliveries, including those of events
    that committed after Django collected the ones to cascade; an event written after the lock
    finds the endpoint gone and writes it none, so the delete commits."""
    connection_ = connections[using]
    with connection_.cursor() as cursor:
        if connection_.vendor == "postgresql":
            cursor.execute(_LOCK_FOR_DELETE, [instance.pk])
        cursor.execute(_DELETE_DELIVERIES, [instance.pk])


_LOCK_FOR_DELETE = "SELECT id FROM queuety_webhookendpoint WHERE id = %s FOR UPDATE"
_DELETE_DELIVERIES = "DELETE FROM queuety_webhookdelivery WHERE endpoint_id = %s"


def wants(name: str) -> bool:
    """Whether an active endpoint receives signal ``name``'s webhook event."""
    return bool(subscribers().get(signals.EVENTS[name].webhook))


def write(name: str, arguments: dict[str, Any]) -> None:
    """Write one delivery row per endpoint receiving ``name`` (in the current transaction)
    and have them sent once it commits."""
    event = signals.EVENTS[name].webhook
    endpoints = subscribers().get(event, [])
    if not endpoints:
        return
    # The lock must last until the deliveries commit: outside a transaction, make one.
    with transaction.atomic(savepoint=False):
        _write(event, _still_active(endpoints), arguments)


def _write(event: str, endpoints: list[int], arguments: dict[str, Any]) -> None:
    if not endpoints:
        return
    now = timezone.now()
    event_id = uuid.uuid4()
    # Values a site marks secret (SECRET_KEYS) never leave in a webhook either.
    data = mask(json.loads(json.dumps(arguments, default=str)))
    payload = {"id": str(event_id), "type": event, "created_at": now.isoformat(), "data": data}
    created = WebhookDelivery.objects.bulk_create([
        WebhookDelivery(endpoint_id=pk, event=event, event_id=event_id,
                        run_id=arguments.get("run_id"), payload=payload, next_attempt_at=now)
        for pk in endpoints])
    publish.deliver_webhooks([row.pk for row in created])
