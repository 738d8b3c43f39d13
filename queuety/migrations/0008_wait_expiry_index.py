"""The runs parked at a wait with a timeout, so the sweeper's expiry scan stays cheap however
many runs the table has. Built with CREATE INDEX CONCURRENTLY on PostgreSQL: a plain build
would block every claim and transition for a full scan of the runs table."""

from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0007_artifacts_chunks"),
    ]

    operations = [
        AddIndexOnline(
            model_name="workflowrun",
            index=models.Index(
                condition=models.Q(("status", "waiting_for_signal"),
                                   ("wait_expires_at__isnull", False)),
                fields=["wait_expires_at"], name="queuety_run_wait_expiry"),
        ),
    ]
