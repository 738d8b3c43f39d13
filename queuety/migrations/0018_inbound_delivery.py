# Inbound webhook deliveries: a new table, its indexes and constraint built while it is empty;
# no existing table is touched, so it is safe while the previous release runs.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queuety', '0017_job'),
    ]

    operations = [
        migrations.CreateModel(
            name='InboundDelivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hook', models.CharField(max_length=100)),
                ('event_id', models.CharField(help_text="The provider's id of the delivery (what its retries share): it deduplicates them.", max_length=255)),
                ('received_at', models.DateTimeField(auto_now_add=True)),
                ('headers', models.JSONField(default=dict)),
                ('body', models.TextField(help_text='The raw body, as it was signed.')),
                ('outcome', models.CharField(choices=[('started', 'started'), ('signalled', 'signalled'), ('failed', 'failed')], max_length=16)),
                ('run_id', models.BigIntegerField(blank=True, db_index=True, help_text='The run it started or signalled.', null=True)),
                ('error', models.TextField(blank=True, default='')),
            ],
            options={
                'verbose_name_plural': 'inbound deliveries',
                'indexes': [models.Index(fields=['hook', 'received_at'], name='queuety_inbound_hook')],
                'constraints': [models.UniqueConstraint(fields=('hook', 'event_id'), name='queuety_inbound_once')],
            },
        ),
    ]
