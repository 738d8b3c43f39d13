"""Sending one webhook delivery: claim it, POST it signed, record the answer, retry later.

A delivery is claimed by a conditional UPDATE (pending and due -> sending, attempts + 1), so a
duplicate message sends nothing twice at once. The POST happens outside any transaction, with
``WEBHOOK_TIMEOUT``, to an address checked after DNS resolution (``guard``: an endpoint on a
loopback, private or link-local address fails at once, with the reason, unless
``WEBHOOK_ALLOW_PRIVATE``); a 2xx answer delivers it, anything else (another status, a
refused connection, a timeout) schedules the next attempt after the next of
``WEBHOOK_RETRY_DELAYS``, and past the last one fails it. :func:`recover` is the sweeper's
backstop: deliveries whose message was lost, whose long back-off is over, or whose worker
died mid-send.
"""

from __future__ import annotations

import http.client
import json
import logging
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.db.models import F, Q
from django.utils import timezone

from queuety import publish
from queuety.conf import settings
from queuety.models import WebhookDelivery
from queuety.webhooks import guard, signing

logger = logging.getLogger("queuety")

#: Characters of an error kept on the row.
ERROR_CHARS = 500


def deliver(delivery_id: int) -> str | None:
    """Send delivery ``delivery_id`` if it is due and nobody else is sending it; return its
    status afterwards (None: not claimed, e.g. a duplicate message)."""
    now = timezone.now()
    claimed = WebhookDelivery.objects.filter(
        pk=delivery_id, status=WebhookDelivery.PENDING, next_attempt_at__lte=now,
    ).update(status=WebhookDelivery.SENDING, attempts=F("attempts") + 1, last_attempt_at=now)
    if not claimed:
        return None
    row = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
    endpoint = row.endpoint
    if not endpoint.active:
        return _finish(row, WebhookDelivery.FAILED, None, "The endpoint is not active.", now)
    body = json.dumps(row.payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "queuety-django webhooks",
        "Queuety-Event": row.event,
        "Queuety-Delivery": str(row.event_id),
        signing.HEADER: signing.sign(body, endpoint.secret),
    }
    code: int | None = None
    error = ""
    try:
        # Redirects are not followed: a 3xx is a failed attempt (a redirected POST would
        # carry the signature elsewhere, and the address it names was never checked).
        code = guard.post(endpoint.url, body, headers, timeout=settings.WEBHOOK_TIMEOUT,
                          allow_private=settings.WEBHOOK_ALLOW_PRIVATE)
    except guard.RefusedAddress as refused:
        # Not retried: the address will not become allowed by waiting.
        logger.warning("Webhook delivery id=%s (%s to %s) refused: %s", row.pk, row.event,
                       _address(endpoint.url), refused)
        return _finish(row, WebhookDelivery.FAILED, None, _refused(refused), now)
    except (OSError, http.client.HTTPException, ValueError) as failure:
        error = f"{type(failure).__name__}: {failure}"
    else:
        error = "" if 200 <= code < 300 else f"HTTP {code}"
    if code is not None and 200 <= code < 300:
        return _finish(row, WebhookDelivery.DELIVERED, code, "", timezone.now())
    return _retry_or_fail(row, code, error)


def _retry_or_fail(row: WebhookDelivery, code: int | None, error: str) -> str:
    delays = list(settings.WEBHOOK_RETRY_DELAYS)
    now = timezone.now()
    where = _address(row.endpoint.url)
    if row.attempts > len(delays):
        logger.warning("Webhook delivery id=%s (%s to %s) failed after %d attempts: %s",
                       row.pk, row.event, where, row.attempts, error)
        return _finish(row, WebhookDelivery.FAILED, code, error, now)
    delay = float(delays[row.attempts - 1])
    WebhookDelivery.objects.filter(pk=row.pk, status=WebhookDelivery.SENDING).update(
        status=WebhookDelivery.PENDING, next_attempt_at=now + timedelta(seconds=delay),
        last_status_code=code, last_error=error[:ERROR_CHARS])
    logger.info("Webhook delivery id=%s (%s to %s) attempt %d failed (%s); next in %gs",
                row.pk, row.event, where, row.attempts, error, delay)
    if delay <= settings.MAX_ETA:  # longer back-offs are sent by the sweeper when due
        publish.deliver_webhooks([row.pk], countdown=delay)
    return WebhookDelivery.PENDING


def _finish(row: WebhookDelivery, status: str, code: int | None, error: str,
            now: datetime) -> str:
    WebhookDelivery.objects.filter(pk=row.pk, status=WebhookDelivery.SENDING).update(
        status=status, last_status_code=code, last_error=error[:ERROR_CHARS],
        delivered_at=now if status == WebhookDelivery.DELIVERED else None)
    return status


def _refused(refused: guard.RefusedAddress) -> str:
    return (f"Refused (SSRF guard): {refused} Webhooks are sent to public addresses only; "
            "point the endpoint at one, or set QUEUETY['WEBHOOK_ALLOW_PRIVATE'] = True and "
            "redeliver.")


def _address(url: str) -> str:
    """The URL without its query or credentials, for logs (a token may ride in them)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{parts.path}"


def redeliver(delivery_ids: list[int]) -> int:
    """Send the given deliveries again, whatever became of them, with a fresh set of attempts
    (same ``event_id``, signed afresh); return how many were queued."""
    now = timezone.now()
    ids = list(WebhookDelivery.objects.filter(pk__in=delivery_ids).exclude(
        status=WebhookDelivery.SENDING).values_list("pk", flat=True))
    WebhookDelivery.objects.filter(pk__in=ids).update(
        status=WebhookDelivery.PENDING, attempts=0, next_attempt_at=now, delivered_at=None)
    publish.deliver_webhooks(ids)
    return len(ids)


def recover(now: datetime, limit: int = 500) -> int:
    """The sweeper's phase: publish due deliveries whose message looks lost or whose back-off
    outlasted ``MAX_ETA``, after taking back those whose sender died mid-send; return how many
    were published."""
    redeliver_after = timedelta(seconds=settings.REDELIVER_AFTER)
    stuck_before = now - redeliver_after - timedelta(seconds=settings.WEBHOOK_TIMEOUT)
    WebhookDelivery.objects.filter(status=WebhookDelivery.SENDING,
                                   last_attempt_at__lt=stuck_before).update(
        status=WebhookDelivery.PENDING, next_attempt_at=now - redeliver_after)
    due = WebhookDelivery.objects.filter(status=WebhookDelivery.PENDING).filter(
        Q(next_attempt_at__lte=now - redeliver_after)
        | Q(next_attempt_at__lte=now,
            next_attempt_at__gt=F("last_attempt_at") + timedelta(seconds=settings.MAX_ETA)))
    ids = list(due.order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
    publish.deliver_webhooks(ids)
    return len(ids)
