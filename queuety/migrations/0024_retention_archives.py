"""Retention with archives: a restored run's ``restored_at``, and dispatch keys kept as
tombstones after their run is purged (``purged_at``, ``purged_workflow``, ``forget_at``).

Nullable columns without a volatile default: metadata-only on PostgreSQL. The tombstones'
index is partial (only purged keys), built with CREATE INDEX CONCURRENTLY so a big key table
keeps taking dispatches. The keys of runs purged before this migration become tombstones
(kept forever, as every key was before), so reusing one raises RunPurged rather than answering
a gone run's id; a unique job's key is left to its next enqueue, which frees it."""

from django.db import migrations, models
from django.db.models import Exists, OuterRef
from django.utils import timezone

from queuety.store.indexes import AddIndexOnline


def tombstone_purged_keys(apps, schema_editor):
    keys = apps.get_model("queuety", "DispatchKey")
    runs = apps.get_model("queuety", "WorkflowRun")
    keys.objects.filter(purged_at__isnull=True).exclude(key__startswith="job:").exclude(
        Exists(runs.objects.filter(pk=OuterRef("run_id")))).update(purged_at=timezone.now())


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
        migrations.RunPython(tombstone_purged_keys, migrations.RunPython.noop, elidable=True),
        AddIndexOnline(
            model_name="dispatchkey",
            index=models.Index(condition=models.Q(forget_at__isnull=False),
                               fields=["forget_at"], name="queuety_key_forget"),
        ),
    ]
