"""Paused queues (``queuety.queues``): a small table the claim tests in its own statement.

Online-safe: a new table, no change to existing ones."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("queuety", "0025_agent_checkpoints"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueuePause",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("queue", models.CharField(max_length=255, unique=True)),
                ("paused_at", models.DateTimeField()),
                ("paused_by", models.CharField(blank=True, db_default="", default="",
                                               max_length=255)),
                ("reason", models.TextField(blank=True, db_default="", default="")),
            ],
            options={"verbose_name": "queue", "verbose_name_plural": "queues"},
        ),
    ]
