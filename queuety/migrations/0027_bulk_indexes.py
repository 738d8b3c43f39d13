"""Bulk operations read their runs by workflow or by definition in ascending id order
(``id > cursor``, keyset): ``(name, id)`` and ``(definition_id, id)`` serve that as an index
range scan, with no sort, however many runs the workflow has. Built with CREATE INDEX
CONCURRENTLY on PostgreSQL (a plain build would block every run insert for a scan of the
runs table). ``stalls`` counts the leases taken over since an operation last made progress."""

from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0026_queue_pause"),
    ]

    operations = [
        migrations.AddField(
            model_name="bulkoperation",
            name="stalls",
            field=models.IntegerField(default=0, db_default=0, help_text="Leases taken over since the "
                                                           "cursor last moved."),
        ),
        AddIndexOnline(
            model_name="workflowrun",
            index=models.Index(fields=["name", "id"], name="queuety_run_name_id"),
        ),
        AddIndexOnline(
            model_name="workflowrun",
            index=models.Index(fields=["definition", "id"], name="queuety_run_definition_id"),
        ),
    ]
