"""Bulk operations (``queuety.bulk()``): one new table and its partial index of live
operations (created empty, so a plain build holds no lock worth the name)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queuety', '0022_run_tags'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='BulkOperation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action', models.CharField(choices=[('cancel', 'cancel'), ('pause', 'pause'), ('resume', 'resume'), ('retry', 'retry'), ('rewind', 'rewind'), ('migrate', 'migrate')], max_length=16)),
                ('arguments', models.JSONField(blank=True, default=dict, help_text="The action's arguments (rewind's step, migrate's to, step_map and state).")),
                ('filter', models.JSONField(blank=True, default=dict, help_text="The runs list's filter keys, as given.")),
                ('dry_run', models.BooleanField(default=False)),
                ('for_user', models.BooleanField(default=False)),
                ('actor', models.CharField(blank=True, default='', max_length=255)),
                ('status', models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('done', 'done'), ('cancelled', 'cancelled'), ('failed', 'failed')], default='pending', max_length=16)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('max_run_id', models.BigIntegerField(default=0)),
                ('cursor', models.BigIntegerField(default=0)),
                ('matched', models.IntegerField(default=0, help_text='Runs the filter matched at the start.')),
                ('acted', models.IntegerField(default=0)),
                ('skipped', models.IntegerField(default=0)),
                ('skipped_reasons', models.JSONField(blank=True, default=dict)),
                ('error', models.TextField(blank=True, default='')),
                ('lease_token', models.CharField(blank=True, default='', max_length=64)),
                ('heartbeat_at', models.DateTimeField(blank=True, null=True)),
                ('requested_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('status__in', ['pending', 'running'])), fields=['status'], name='queuety_bulk_live')],
            },
        ),
    ]
