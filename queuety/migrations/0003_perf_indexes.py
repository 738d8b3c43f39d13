"""Drop the single-column indexes of StepRun.run and Event.run.

Each is covered by a composite index that leads with ``run_id`` (the unique
``queuety_step_run_seq_branch`` and ``queuety_event_run``), and every step inserts a step row
and an event, so each redundant index cost an index insertion per write. The indexes are
dropped by name: letting Django alter the foreign keys would also drop and re-validate the
foreign key constraints, a full scan of both tables under lock. ``DROP INDEX CONCURRENTLY`` on
PostgreSQL (so ``atomic = False``): a plain drop waits for every query of the table, and every
query that comes after it waits behind it.
"""

import django.db.models.deletion
from django.db import migrations, models

from queuety.store.indexes import DropIndexOnline

INDEXES = [
    ("queuety_event_run_id_70de9ab7", "queuety_event"),
    ("queuety_steprun_run_id_3f857b12", "queuety_steprun"),
]


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0002_dependencies"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                DropIndexOnline(name=name, table=table, columns=["run_id"])
                for name, table in INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="run",
                    field=models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name="events", to="queuety.workflowrun"),
                ),
                migrations.AlterField(
                    model_name="steprun",
                    name="run",
                    field=models.ForeignKey(db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name="steps", to="queuety.workflowrun"),
                ),
            ],
        ),
    ]
