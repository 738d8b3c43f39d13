"""Inbound webhooks: providers (Stripe, GitHub, ...) calling the site back.

``declare`` holds the hooks declared with ``queuety.inbound(...)`` in the apps'
``workflows.py``; ``receive`` verifies, stores and acts on one delivery; the endpoint is
``queuety.api.hooks`` (``POST hooks/<name>/``). Guide: docs/guide/triggers-and-events.md.
"""
