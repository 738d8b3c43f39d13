"""Progress reported with heartbeats, prune_state_after's bookkeeping, and wait timeouts.

Three nullable (or defaulted) columns, so adding them rewrites no table. The partial index of
the runs parked at a wait with a timeout is 0008's, built without locking the runs table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("queuety", "0004_workers"),
    ]

    operations = [
        migrations.AddField(
            model_name="steprun",
            name="progress",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="state_writes",
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="wait_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
