"""The indexes a queue's cost budget reads: the steps holding a share of it (running, or woken
and on their way, as a group's slot is held), and the steps waiting for it in their groups'
order (the queue's waker takes each group's best in turn). Built and dropped CONCURRENTLY on
PostgreSQL: a plain build or drop would block every claim and transition of the step table."""

from django.db import migrations, models

from queuety.store.indexes import AddIndexOnline, RemoveIndexOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('queuety', '0010_resource_indexes'),
    ]

    operations = [
        AddIndexOnline(
            model_name='steprun',
            index=models.Index(condition=models.Q(('status__in', ['processing', 'pending']), models.Q(('queue', ''), _negated=True)), fields=['queue'], name='queuety_step_queue_held'),
        ),
        AddIndexOnline(
            model_name='steprun',
            index=models.Index(condition=models.Q(('status', 'throttled'), models.Q(('queue', ''), _negated=True)), fields=['queue', 'concurrency_group', '-priority', 'id'], name='queuety_step_queue_waiting'),
        ),
        RemoveIndexOnline(
            model_name='steprun',
            name='queuety_step_queue_live',
        ),
    ]
