"""Webhooks: endpoints configured in the admin receive signed, durable event deliveries.

``outbox`` writes a delivery row per subscribed endpoint in the event's transaction;
``delivery`` sends one (a Celery task calls it), retries with back-off and records the answer;
``signing`` is the HMAC-SHA256 scheme a receiver verifies.
"""
