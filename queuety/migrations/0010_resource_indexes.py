"""The indexes resource control reads on the step-run table: live steps of a group, throttled
steps in their order, live steps under a queue's cost budget. Built with CREATE INDEX
CONCURRENTLY on PostgreSQL: a plain build would block every claim and transition for a full
scan of the step-run table."""

from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0009_resources"),
    ]

    operations = [
        AddIndexOnline(
            model_name='steprun',
            index=models.Index(condition=models.Q(('status__in', ['processing', 'pending']), models.Q(('concurrency_group', ''), _negated=True)), fields=['concurrency_group'], name='queuety_step_group_live'),
        ),
        AddIndexOnline(
            model_name='steprun',
            index=models.Index(condition=models.Q(('status', 'throttled')), fields=['concurrency_group', '-priority', 'id'], name='queuety_step_throttled'),
        ),
        AddIndexOnline(
            model_name='steprun',
            index=models.Index(condition=models.Q(('status', 'processing'), models.Q(('queue', ''), _negated=True)), fields=['queue'], name='queuety_step_queue_live'),
        ),
    ]
