"""Outbound webhook endpoints and deliveries, and the inbound deliveries received."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from queuety.conf import settings
from queuety.core import addresses


class WebhookEndpoint(models.Model):
    """An address that receives the events it subscribes to, signed with its secret.

    The secret signs each delivery (HMAC-SHA256); the admin never shows it back and nothing
    logs it.
    """

    url = models.URLField(max_length=2000, help_text="Where deliveries are POSTed (http or https).")
    events = models.JSONField(default=list, help_text="The event names it receives, such as "
                              "['run.failed', 'run.completed'].")
    secret = models.CharField(max_length=255, help_text="Signs each delivery (HMAC-SHA256).")
    active = models.BooleanField(default=True)
    description = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"webhook {self.pk} -> {self.url}"

    def clean(self) -> None:
        """Refuse a URL whose host is loopback, private, link-local or otherwise not public
        (SSRF), unless ``QUEUETY["WEBHOOK_ALLOW_PRIVATE"]``; delivery checks the resolved
        addresses again."""
        super().clean()
        refusal = None if settings.WEBHOOK_ALLOW_PRIVATE else addresses.url_refusal(self.url)
        if refusal is not None:
            raise ValidationError({"url": refusal})


class WebhookDelivery(models.Model):
    """One event for one endpoint: written in the event's transaction, sent by a Celery task
    (``queuety.deliver_webhook``) with retries and back-off, so it survives a worker crash."""

    PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"
    STATUSES = [(s, s) for s in (PENDING, SENDING, DELIVERED, FAILED)]

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    event = models.CharField(max_length=64)
    event_id = models.UUIDField(help_text="The same for every attempt and redelivery: a "
                                "receiver dedupes on it.")
    run_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["next_attempt_at"], name="queuety_webhook_due",
                                condition=Q(status__in=["pending", "sending"]))]

    def __str__(self) -> str:
        return f"{self.event} -> endpoint {self.endpoint_id} ({self.status})"


class InboundDelivery(models.Model):
    """One delivery received by an inbound hook (``queuety.inbound``): verified, stored and
    acted on in one transaction; the provider's retries of it find this row and start nothing.

    ``headers`` are kept without the signature and credential headers.
    """

    STARTED, SIGNALLED, FAILED = "started", "signalled", "failed"
    OUTCOMES = [(o, o) for o in (STARTED, SIGNALLED, FAILED)]

    hook = models.CharField(max_length=100)
    event_id = models.CharField(max_length=255, help_text="The provider's id of the delivery "
                                "(what its retries share): it deduplicates them.")
    received_at = models.DateTimeField(auto_now_add=True)
    headers = models.JSONField(default=dict)
    body = models.TextField(help_text="The raw body, as it was signed.")
    outcome = models.CharField(max_length=16, choices=OUTCOMES)
    run_id = models.BigIntegerField(null=True, blank=True, db_index=True,
                                    help_text="The run it started or signalled.")
    error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "inbound deliveries"
        constraints = [models.UniqueConstraint(fields=["hook", "event_id"],
                                               name="queuety_inbound_once")]
        indexes = [models.Index(fields=["hook", "received_at"], name="queuety_inbound_hook")]

    def __str__(self) -> str:
        return f"{self.hook} delivery {self.event_id} ({self.outcome})"

