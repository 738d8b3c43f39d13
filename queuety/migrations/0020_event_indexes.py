"""The indexes of the cross-run event log (``manage.py queuety log``, ``GET events/``, the
admin's events list): every filter reads its first page newest first, by
``(created_at, id)``, from an index that ends with that order, so a page stays an index range
scan on a table of millions of events. Built with CREATE INDEX CONCURRENTLY on PostgreSQL: a
plain build would block every step's event insert for a full scan of the event table."""

import django.db.models.fields.json
from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0019_run_key"),
    ]

    operations = [
        AddIndexOnline(
            model_name="event",
            index=models.Index(fields=["created_at", "id"], name="queuety_event_created"),
        ),
        AddIndexOnline(
            model_name="event",
            index=models.Index(fields=["kind", "created_at", "id"], name="queuety_event_kind"),
        ),
        AddIndexOnline(
            model_name="event",
            index=models.Index(fields=["run", "created_at", "id"],
                               name="queuety_event_run_created"),
        ),
        AddIndexOnline(
            model_name="event",
            index=models.Index(
                django.db.models.fields.json.KeyTextTransform(
                    "type", django.db.models.fields.json.KeyTransform("error", "data")),
                models.F("created_at"), models.F("id"),
                condition=models.Q(("data__has_key", "error")),
                name="queuety_event_error_type"),
        ),
    ]
