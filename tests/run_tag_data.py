"""A big runs table with tags, for the tag filter's plan test and benchmark
(tests/integration/test_tag_plans.py, benchmarks/run_tags.py).

One ``INSERT ... SELECT generate_series`` writes ``runs`` finished runs of one workflow, each
tagged ``customer`` (one of ``runs // per_customer`` customers, so each has about
``per_customer`` runs), ``plan`` (``free``, ``pro`` or ``team`` in turn) and ``region`` (one
of four); then ``ANALYZE``, so the planner knows the table's size.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import connection

from queuety.models import WorkflowDefinition

INSERT_RUNS = """
INSERT INTO queuety_workflowrun (definition_id, name, status, state, current_step, total_steps,
                                 revision, transitions, cost_units, started_workflows, loops,
                                 created_at, updated_at, finished_at, trace_context, tags)
SELECT %(definition)s, %(name)s, 'completed', '{}'::jsonb, 1, 1, 1, 1, 0, 0, '{}'::jsonb,
       now(), now(), now(), '',
       jsonb_build_object('customer', %(prefix)s || (i %% %(customers)s),
                          'plan', (ARRAY['free', 'pro', 'team'])[1 + i %% 3],
                          'region', 'r' || (i %% 4))
FROM generate_series(1, %(runs)s) AS i
"""


@dataclass
class Loaded:
    """What :func:`load` made: the workflow's name and the customers' tag prefix."""

    name: str
    prefix: str
    customers: int

    def customer(self, n: int) -> str:
        return f"{self.prefix}{n % self.customers}"


def load(runs: int = 100_000, per_customer: int = 100) -> Loaded:
    """Make the runs (in the caller's transaction, if any) and ANALYZE the runs table."""
    prefix = f"tag{uuid.uuid4().hex[:6]}_"
    name = f"{prefix}wf"
    definition = WorkflowDefinition.objects.create(
        name=name, definition={"name": name, "steps": []}, definition_hash=uuid.uuid4().hex * 2)
    customers = max(1, runs // per_customer)
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RUNS, {"definition": definition.pk, "name": name,
                                     "prefix": prefix, "customers": customers, "runs": runs})
        cursor.execute("ANALYZE queuety_workflowrun")
    return Loaded(name, prefix, customers)


INSERT_EVENTS = """
INSERT INTO queuety_event (run_id, kind, step_name, data, created_at)
SELECT r.id, (ARRAY['workflow_started', 'step_completed', 'workflow_completed'])[n], '',
       '{}'::jsonb, r.created_at + n * interval '1 millisecond'
  FROM queuety_workflowrun r CROSS JOIN generate_series(1, %(per_run)s) AS n
 WHERE r.name = %(name)s
"""


def load_events(loaded: Loaded, per_run: int = 3) -> None:
    """Give each run of ``loaded`` ``per_run`` events (at most 3), then ANALYZE the events."""
    with connection.cursor() as cursor:
        cursor.execute(INSERT_EVENTS, {"name": loaded.name, "per_run": min(per_run, 3)})
        cursor.execute("ANALYZE queuety_event")
