"""The flow-control key of a run (``queuety.keyed``) and the partial index over live keyed
runs that a keyed start reads. The column is nullable, so adding it is a catalogue update; the
index is built CONCURRENTLY on PostgreSQL (a plain build would block every run's writes for a
scan of the runs table)."""

from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0018_inbound_delivery"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        AddIndexOnline(
            model_name="workflowrun",
            index=models.Index(
                condition=models.Q(("key__isnull", False),
                                   ("status__in", ["running", "waiting_for_signal",
                                                   "waiting_for_workflows", "paused"])),
                fields=["name", "key", "id"], name="queuety_run_key_live"),
        ),
        AddIndexOnline(
            model_name="steprun",
            index=models.Index(
                condition=models.Q(("kind", "step"), ("seq", 0), ("status", "held")),
                fields=["id"], name="queuety_step_queued"),
        ),
    ]
