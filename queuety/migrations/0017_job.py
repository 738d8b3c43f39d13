# The Job proxy (the admin's Jobs list): no table, no column, nothing for PostgreSQL to do.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('queuety', '0016_run_awaited'),
    ]

    operations = [
        migrations.CreateModel(
            name='Job',
            fields=[],
            options={
                'verbose_name': 'job',
                'verbose_name_plural': 'jobs',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('queuety.workflowrun',),
        ),
    ]
