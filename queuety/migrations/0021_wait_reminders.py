"""Reminders on waits (the run's ``remind_at``, ``waiting_since`` and ``reminders``) and the
sweeper's scans for due reminders and for expired workflow waits.

Online-safe: nullable columns and a constant default add no table rewrite on PostgreSQL 11+,
and the indexes are built with CREATE INDEX CONCURRENTLY (a plain build would block every
claim and transition for a full scan of the runs table)."""

from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0020_event_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="remind_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="waiting_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="reminders",
            field=models.IntegerField(db_default=0, default=0),
        ),
        AddIndexOnline(
            model_name="workflowrun",
            index=models.Index(
                condition=models.Q(("status__in", ["waiting_for_signal",
                                                   "waiting_for_workflows"]),
                                   ("wait_expires_at__isnull", False)),
                fields=["wait_expires_at"], name="queuety_run_timed_expiry"),
        ),
        AddIndexOnline(
            model_name="workflowrun",
            index=models.Index(
                condition=models.Q(("remind_at__isnull", False),
                                   ("status__in", ["waiting_for_signal",
                                                   "waiting_for_workflows"])),
                fields=["remind_at"], name="queuety_run_remind"),
        ),
    ]
