"""Resource control: concurrency groups, rate limits, cost budgets, priorities and worker
admission (docs/guide/resources.md). The indexes on the step-run table are built concurrently
in 0010_resource_indexes.py. The two columns with a check are added online (AddFieldOnline: no
scan of the step table under its lock); 0014_validate_online validates the checks."""

from django.db import migrations, models

from queuety.store.indexes import AddFieldOnline


class Migration(migrations.Migration):

    dependencies = [
        ('queuety', '0008_wait_expiry_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='GroupStart',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('group', models.CharField(max_length=255)),
                ('started_at', models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name='ResourceGroup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=255, unique=True)),
                ('wake_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        AddFieldOnline(
            model_name='steprun',
            name='admitted_attempt',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='steprun',
            name='concurrency_group',
            field=models.CharField(blank=True, db_default='', default='', help_text='The group key this attempt counts in.', max_length=255),
        ),
        AddFieldOnline(
            model_name='steprun',
            name='cost_units',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='steprun',
            name='priority',
            field=models.SmallIntegerField(db_default=1, default=1, help_text='2 high, 1 normal, 0 low.'),
        ),
        migrations.AddField(
            model_name='steprun',
            name='queue',
            field=models.CharField(blank=True, db_default='', default='', help_text='The Celery queue whose cost budget this attempt uses.', max_length=255),
        ),
        migrations.AddField(
            model_name='steprun',
            name='throttled_by',
            field=models.JSONField(blank=True, help_text='Why the step waits: {group, reason, ...}.', null=True),
        ),
        migrations.AddField(
            model_name='steprun',
            name='woken',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AlterField(
            model_name='steprun',
            name='status',
            field=models.CharField(choices=[('pending', 'Pending'), ('processing', 'Processing'), ('completed', 'Completed'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('held', 'Held'), ('throttled', 'Throttled')], default='pending', max_length=16),
        ),
        migrations.AddIndex(
            model_name='groupstart',
            index=models.Index(fields=['group', 'started_at'], name='queuety_group_start'),
        ),
    ]
