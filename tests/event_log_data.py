"""A big event table for the cross-run log's plan test and benchmark
(tests/integration/test_event_log_plans.py, benchmarks/event_log.py).

Runs are made with the ORM (a few thousand rows), the events by one
``INSERT ... SELECT generate_series``: ``events`` rows spread over ``runs`` runs of
``workflows`` workflows (one of them, ``<prefix>rare``, with a single run), one every
``spacing`` seconds back from now, newest last. One event in ten is a ``step_retried`` and one in
forty a ``step_failed``, each with an error of one of four types; the rest are completions,
starts and signals. Runs alternate between tenants ``a`` and ``b`` (their state's
``tenant``, as tests.workflows.tenant_scope reads it). Then ``ANALYZE``, so the planner knows the table's size.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import connection

from queuety.models import WorkflowDefinition, WorkflowRun

ERROR_TYPES = ("ValueError", "TimeoutError", "myapp.errors.RateLimited", "KeyError")

INSERT_EVENTS = """
INSERT INTO queuety_event (run_id, kind, step_index, step_name, attempt, duration_ms, data,
                           created_at)
SELECT runs.ids[1 + (i %% %(runs)s)],
       CASE WHEN i %% 40 = 0 THEN 'step_failed'
            WHEN i %% 10 = 0 THEN 'step_retried'
            WHEN i %% 10 IN (1, 2, 3, 4, 5) THEN 'step_completed'
            WHEN i %% 10 IN (6, 7) THEN 'workflow_started'
            ELSE 'signal_received' END,
       i %% 7, 'step_' || (i %% 7), 1 + i %% 3, (i %% 1000)::float,
       CASE WHEN i %% 10 = 0 THEN jsonb_build_object('error', jsonb_build_object(
                'type', (%(types)s::text[])[1 + (i / 10) %% 4], 'message', 'failure ' || i))
            ELSE jsonb_build_object('output', jsonb_build_object('n', i)) END,
       now() - make_interval(secs => (%(events)s - i) * %(spacing)s)
FROM generate_series(1, %(events)s) AS i,
     (SELECT array_agg(id ORDER BY id) AS ids FROM queuety_workflowrun
      WHERE name LIKE %(like)s) AS runs
"""


@dataclass
class Loaded:
    """What :func:`load` made: the workflow names (the last one the rare one) and run ids."""

    prefix: str
    workflows: list[str]
    run_ids: list[int]

    @property
    def rare(self) -> str:
        return self.workflows[-1]


def load(events: int = 200_000, runs: int = 2_000, workflows: int = 20,
         spacing: float = 1.0, batch: int = 5_000) -> Loaded:
    """Make the runs and events (in the caller's transaction, if any) and ANALYZE."""
    prefix = f"evlog_{uuid.uuid4().hex[:6]}_"
    names = [f"{prefix}wf{n}" for n in range(workflows - 1)] + [f"{prefix}rare"]
    definitions = {name: WorkflowDefinition.objects.create(
        name=name, definition={"name": name, "steps": []},
        definition_hash=uuid.uuid4().hex * 2) for name in names}
    made: list[int] = []
    # The rare workflow has one run; the others share the rest in turn.
    plan = [names[-1]] + [names[n % (workflows - 1)] for n in range(runs - 1)]
    for start in range(0, len(plan), batch):
        rows = WorkflowRun.objects.bulk_create(
            WorkflowRun(definition=definitions[name], name=name, status="completed",
                        total_steps=7, state={"tenant": "ab"[n % 2]})
            for n, name in enumerate(plan[start:start + batch], start))
        made += [row.pk for row in rows]
    with connection.cursor() as cursor:
        cursor.execute(INSERT_EVENTS, {"runs": runs, "events": events, "spacing": spacing,
                                       "types": list(ERROR_TYPES), "like": f"{prefix}%"})
        cursor.execute("ANALYZE queuety_event")
        cursor.execute("ANALYZE queuety_workflowrun")
    return Loaded(prefix, names, made)
