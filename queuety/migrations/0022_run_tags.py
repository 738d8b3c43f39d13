"""Run tags (``WorkflowRun.tags``) and the GIN index that serves ``GET runs/?tag=``.

Online-safe: a JSON column with a constant default is a catalogue update on PostgreSQL 11+
(no table rewrite), and the index is built with CREATE INDEX CONCURRENTLY (a plain build
would block every claim and transition for a full scan of the runs table)."""

from django.db import migrations, models

import queuety.models
from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0021_wait_reminders"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="tags",
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        AddIndexOnline(
            model_name="workflowrun",
            index=queuety.models.TagsIndex(name="queuety_run_tags"),
        ),
    ]
