"""Retention with archives: a restored run's ``restored_at``, and dispatch keys kept as
tombstones after their run is purged (``purged_at``, ``purged_workflow``, ``forget_at``).

Nullable columns without a volatile default: metadata-only on PostgreSQL. The tombstones'
index is partial (only purged keys), built with CREATE INDEX CONCURRENTLY so a big key table
keeps taking dispatches. No data step: a key whose run was purged before this migration
has no tombstone, and the dispatch's reuse check treats a key whose run no longer exists as
purged (RunPurged, never a gone run's id), so no table-wide UPDATE runs here."""

from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0023_bulk_operations"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun", name="restored_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="dispatchkey", name="purged_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="dispatchkey", name="purged_workflow",
            field=models.CharField(blank=True, db_default="", default="", max_length=255),
        ),
        migrations.AddField(
            model_name="dispatchkey", name="forget_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        AddIndexOnline(
            model_name="dispatchkey",
            index=models.Index(condition=models.Q(forget_at__isnull=False),
                               fields=["forget_at"], name="queuety_key_forget"),
        ),
    ]
