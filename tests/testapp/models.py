"""The test site's own models: the rows the model triggers watch (tests/integration/test_triggers.py)
and the counters transactional steps increment with the ORM (tests/txn_steps.py)."""

from __future__ import annotations

from django.db import models


class Article(models.Model):
    """A row the trigger tests save, update and delete; ``token`` finds a test's own rows."""

    token = models.CharField(max_length=40, db_index=True)
    title = models.CharField(max_length=200, default="")
    status = models.CharField(max_length=20, default="draft")
    #: The run a "signal to run=" trigger signals (test_triggers.py).
    run_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        app_label = "queuety_testapp"


class Counter(models.Model):
    """A named counter that transactional steps increment (tests/txn_steps.py)."""

    name = models.CharField(max_length=64, unique=True)
    value = models.IntegerField(default=0)

    class Meta:
        app_label = "queuety_testapp"
