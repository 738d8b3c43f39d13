"""The Django admin for Queuety: see and steer workflow runs.

Nothing can be added, edited or deleted by hand: runs and definitions are read-only. Operators
steer runs with actions (retry, pause, resume, cancel, approve, reject, submit input) that call
the service layer. Each action is a CSRF-protected POST that is permission-checked, refused when
the run changed since the page was rendered (the form carries the run's ``revision``), and
recorded on the run's timeline with the acting user (``admin:<username>``).

Pages:

- the runs changelist (fast on big tables: planner-estimated counts, indexed filters, no
  per-row query);
- the run page (status block, error, budget bars, wait, definition, timeline, state, signals
  and the actions valid in the run's status);
- ``approvals/``: every run waiting on a person, oldest first, answerable inline;
- ``<id>/export/``: the run's JSON export (``export.export()``);
- the definitions changelist with run counts per status, and each definition's "Pause its
  live runs" / "Resume its paused runs" (``admin/quarantine.py``);
- webhook endpoints (the secret write-only) and the delivery log, with a redeliver action.
- the concurrency groups page: in flight against the limit, waiting steps, starts against the
  rate limit, running cost against the budget (``admin/groups.py``);
- the queues page: paused or not, waiting and running steps, pause and resume buttons
  (``admin/queues.py``).
- inbound deliveries: each delivery an inbound hook (``queuety.inbound``) received, with
  its outcome and the run it started or signalled, read-only (``admin/inbound.py``).
- the jobs changelist: Django tasks run as jobs, by task, queue and status, with their result
  or error, each linking to its run's page (``admin/jobs.py``).
- the events list: every run's events newest first, by kind, workflow, age, run or error
  type, each linking to its run's page, read-only (``admin/events.py``).
- bulk operations: each ``queuety.bulk()`` operation (the runs changelist's "Select all N"
  starts one over its filter) with its progress, read-only, with a cancel action
  (``admin/bulk.py``).
"""

from queuety.admin import (
    bulk,
    definitions,
    events,
    groups,
    inbound,
    jobs,
    queues,
    runs,
    webhooks,
)

__all__ = ["bulk", "definitions", "events", "groups", "inbound", "jobs", "queues", "runs",
           "webhooks"]
