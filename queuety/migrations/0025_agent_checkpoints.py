"""Durable agents (queuety.contrib.pydantic_ai): the checkpoints of agent steps' model requests
and tool calls, and the slots of a concurrency group held from inside a running step.

Online-safe: two new tables, whose indexes are built while they are still empty."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queuety', '0024_retention_archives'),
    ]

    operations = [
        migrations.CreateModel(
            name='AgentCheckpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('step_index', models.PositiveIntegerField()),
                ('seq', models.PositiveIntegerField()),
                ('kind', models.CharField(choices=[('model', 'model request'), ('tool', 'tool call'), ('retry', 'tool call that asked the model to retry (ModelRetry)')], max_length=8)),
                ('key', models.CharField(blank=True, default='', max_length=255)),
                ('name', models.CharField(help_text='The model or the tool.', max_length=255)),
                ('fingerprint', models.CharField(help_text="What was asked (the request's parts, the tool's name and arguments): a replay that asks something else is non-deterministic.", max_length=64)),
                ('payload', models.JSONField(help_text="The ModelResponse, the tool's return value, or the ModelRetry's message.")),
                ('tokens', models.PositiveIntegerField(default=0)),
                ('attempt', models.PositiveIntegerField()),
                ('created_at', models.DateTimeField()),
                ('run', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='queuety.workflowrun')),
                ('step_run', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='queuety.steprun')),
            ],
            options={
                'indexes': [models.Index(fields=['run', 'step_index', 'seq'], name='queuety_agent_checkpoint_run')],
                'constraints': [models.UniqueConstraint(fields=('step_run', 'kind', 'seq', 'key'), name='queuety_agent_checkpoint_seq')],
            },
        ),
        migrations.CreateModel(
            name='GroupLease',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('group', models.CharField(max_length=255)),
                ('attempt', models.PositiveIntegerField()),
                ('acquired_at', models.DateTimeField()),
                ('holder', models.CharField(help_text='The claimed_by name of the process holding it; its heartbeat refreshes beat_at.', max_length=255)),
                ('beat_at', models.DateTimeField()),
                ('step_run', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='queuety.steprun')),
            ],
            options={
                'indexes': [models.Index(fields=['group', 'acquired_at'], name='queuety_lease_group'), models.Index(fields=['step_run'], name='queuety_lease_step')],
            },
        ),
    ]
