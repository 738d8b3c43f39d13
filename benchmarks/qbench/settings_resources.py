"""The project's settings plus one queue with a cost budget, for the resource benchmark's
"tenants sharing a queue budget" workload (qbench.resources): the queue is the run's own queue
name with ``-budget`` appended, so nothing else is bounded by it."""

import os

from project.settings import *  # noqa: F401,F403

BUDGET_QUEUE = os.environ["CELERY_TASK_DEFAULT_QUEUE"] + "-budget"
#: The cost budget of BUDGET_QUEUE (each benchmark step costs 1).
QUEUE_BUDGET = 4

QUEUETY = {"QUEUE_COST_BUDGETS": {BUDGET_QUEUE: QUEUE_BUDGET}}
