"""The test site's own models: rows its step handlers write with the ORM."""

from __future__ import annotations

from django.db import models


class Counter(models.Model):
    """A named counter that transactional steps increment (tests/txn_steps.py)."""

    name = models.CharField(max_length=64, unique=True)
    value = models.IntegerField(default=0)

    class Meta:
        app_label = "queuety_testapp"
