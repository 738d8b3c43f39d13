"""Finish the columns 0002 and 0009 add online: validate their checks and build the runs
table's ``started_by`` index, neither under a lock that writers wait for (ValidateFieldOnline).

A database that applied 0002 and 0009 before they added their columns online has both already:
then each statement here is a no-op.
"""

from django.db import migrations

from queuety.store.indexes import ValidateFieldOnline


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("queuety", "0013_run_migration"),
    ]

    operations = [
        ValidateFieldOnline("workflowrun", "parent_attempt"),
        ValidateFieldOnline("workflowrun", "started_by",
                            index="queuety_workflowrun_started_by_id_aeedc9f8"),
        ValidateFieldOnline("workflowrun", "started_by_step"),
        ValidateFieldOnline("steprun", "admitted_attempt"),
        ValidateFieldOnline("steprun", "cost_units"),
    ]
