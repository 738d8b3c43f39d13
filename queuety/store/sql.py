"""Every raw SQL statement of the engine, by name, each with why it is raw.

The ORM writes everything else. These statements exist because they carry a guarantee the ORM
cannot express in one round trip (a compare-and-set across tables, an insert that decides a
race) or because they run on every step, where a statement's planning costs more than its
execution. They hard-code table names and status words; ``queuety.models`` and
``queuety.core.status`` are the sources of both.
"""

from __future__ import annotations

# -- dispatch ---------------------------------------------------------------------------------

#: Records an idempotency key; the key's unique index decides races between dispatches.
INSERT_KEY = """
INSERT INTO queuety_workflow_dispatch_keys (key, run_id, payload_hash, definition_hash, created_at)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (key) DO NOTHING
RETURNING id
"""

#: The common dispatch (no idempotency key, a task step first) in one statement that commits
#: by itself: the run, its first step row and its workflow_started event, all or nothing.
DISPATCH_POSTGRES = """
WITH run AS (
    INSERT INTO queuety_workflowrun (definition_id, name, status, state, current_step,
                                     total_steps, revision, transitions, cost_units,
                                     started_workflows, deadline_at, loops, created_at,
                                     updated_at, trace_context, tags)
    VALUES (%(definition_id)s, %(name)s, 'running', %(state)s::jsonb, 0, %(total_steps)s, 0,
            0, 0, 0, %(deadline_at)s::timestamptz, '{}'::jsonb, %(now)s, %(now)s,
            %(trace_context)s, %(tags)s::jsonb)
    RETURNING id
), step AS (
    INSERT INTO queuety_steprun (run_id, kind, seq, branch, step_index, step_name, status,
                                 attempt, max_attempts, timeout, available_at, published_at,
                                 claimed_by, handler, created_at)
    SELECT run.id, 'step', 0, 0, 0, %(step_name)s, 'pending', 0, %(max_attempts)s,
           %(timeout)s::float8, %(available_at)s, %(published_at)s::timestamptz, '', '', %(now)s
      FROM run
    RETURNING id
), started AS (
    INSERT INTO queuety_event (run_id, kind, step_name, data, created_at)
    SELECT run.id, 'workflow_started', '', %(event)s::jsonb, %(now)s FROM run
)
SELECT (SELECT id FROM run), (SELECT id FROM step)
"""

# -- runs waiting for runs --------------------------------------------------------------------

#: Marks the runs a workflow wait names ``awaited`` (those not marked yet: a mark is taken once,
#: so waits on one run never queue on its row after the first, and a wait re-evaluated at each
#: wake-up writes nothing), locked in id order. A run no wait ever named finishes without
#: reading its waiters: its finishing statement returns the mark (see COMPLETE_POSTGRES).
MARK_AWAITED = """
WITH unmarked AS (
    SELECT id FROM queuety_workflowrun WHERE id = ANY(%s) AND NOT awaited
     ORDER BY id FOR NO KEY UPDATE
)
UPDATE queuety_workflowrun AS r SET awaited = true FROM unmarked WHERE r.id = unmarked.id
"""

#: The runs a workflow wait names, read FOR SHARE after MARK_AWAITED: one finishing
#: concurrently either committed before (and is seen finished) or waits for this transaction,
#: and then its finishing statement returns the mark and its waiters' read, a statement of its
#: own, finds the dependency rows this transaction committed. So no finish slips between the
#: check and the parking.
AWAITED_FOR_SHARE = """
SELECT id, status, state FROM queuety_workflowrun WHERE id = ANY(%s) ORDER BY id FOR SHARE
"""

#: The runs to wake when a run finishes: its parent, and the runs whose wait names it; and,
#: for a keyed run, its workflow and key (the run queued behind it), in the same statement
#: so that a finish costs no more statements than before keys existed.
WAITERS = """
SELECT parent_id, NULL, NULL FROM queuety_workflowrun WHERE id = %s AND parent_id IS NOT NULL
UNION SELECT run_id, NULL, NULL FROM queuety_workflowdependency WHERE depends_on = %s
UNION SELECT NULL, name, key FROM queuety_workflowrun WHERE id = %s AND key IS NOT NULL
"""

#: Runs parked at a workflow wait one of whose awaited runs finished or is gone: their
#: wake-up message may have been lost (the sweeper's backstop).
FINISHED_DEPENDENCIES = """
SELECT DISTINCT d.run_id FROM queuety_workflowdependency d
  JOIN queuety_workflowrun w ON w.id = d.run_id AND w.status = 'waiting_for_workflows'
  LEFT JOIN queuety_workflowrun r ON r.id = d.depends_on
 WHERE r.id IS NULL OR r.status IN ('completed', 'failed', 'cancelled')
 LIMIT 200
"""

# -- the tree-wide attempt budget -------------------------------------------------------------

#: Step attempts made (or due) in the tree of runs below one run, itself included.
TREE_ATTEMPTS = """
WITH RECURSIVE tree(id) AS (
    SELECT CAST(%s AS BIGINT)
    UNION ALL
    SELECT r.id FROM queuety_workflowrun r JOIN tree t ON r.parent_id = t.id
)
SELECT COALESCE(SUM(s.attempt + CASE WHEN s.status = 'pending' AND s.attempt > 0
                                      THEN 1 ELSE 0 END), 0)
  FROM queuety_steprun s JOIN tree t ON s.run_id = t.id
 WHERE s.kind = 'step'
"""

#: First key of the advisory locks that serialise max_step_attempts checks (second: run id).
ATTEMPTS_LOCK_KEY = 7_401

#: Serialises the attempt-budget checks of one tree until the transaction ends.
ATTEMPTS_LOCK = "SELECT pg_advisory_xact_lock(%s, %s)"

# -- the claim --------------------------------------------------------------------------------

# A claim also forgets why the row waited (a worker's memory deferral): ``throttled_by`` is
# what it waits for now, and a claimed row waits for nothing until its gate says otherwise.
_CLAIM_SET = ("status = 'processing', attempt = attempt + 1, claimed_at = %s, heartbeat_at = %s, "
              "claimed_by = %s, throttled_by = NULL")

# A task step's row is not claimed while the queue its message came from is paused (the last
# parameter, '' when unknown): one probe of the small queuety_queuepause table's unique index,
# in the claim's own statement (queuety.queues; the caller then holds the row throttled).
_NOT_PAUSED = ("(s.kind <> 'step' OR NOT EXISTS "
               "(SELECT 1 FROM queuety_queuepause AS p WHERE p.queue = %s))")

#: Claims a due pending step row of a running run (or a cleanup row) and reads back what the
#: attempt needs, in one statement: a message for a row it cannot claim changes nothing.
_CLAIM_POSTGRES = f"""
UPDATE queuety_steprun AS s SET {_CLAIM_SET}
  FROM queuety_workflowrun AS r{{relaxed}}
 WHERE s.id = %s AND s.status = 'pending' AND s.available_at <= %s
   AND r.id = s.run_id AND (r.status = 'running' OR s.kind <> 'step') AND {_NOT_PAUSED}
RETURNING s.run_id, s.step_index, s.seq, s.attempt, r.definition_id, r.state, r.revision,
          r.transitions, r.cost_units, r.started_workflows, s.kind, s.branch, s.timeout,
          r.trace_context
"""
CLAIM_POSTGRES = _CLAIM_POSTGRES.format(relaxed="")

#: The claim on its own (autocommit): its commit does not wait for the WAL flush. Losing it
#: takes a PostgreSQL (or host) crash within a fraction of a second, and runs the message
#: again, that attempt uncounted (docs/reliability.md); the attempt's outcome, committed after
#: it and waiting for its flush, makes the claim durable too (the WAL is flushed in order).
CLAIM_POSTGRES_ALONE = _CLAIM_POSTGRES.format(
    relaxed=", (SELECT set_config('synchronous_commit', 'off', true)) AS c")

#: SQLite cannot return columns of a joined table, so it reads the run in a second query.
CLAIM_SQLITE = f"""
UPDATE queuety_steprun AS s SET {_CLAIM_SET}
 WHERE id = %s AND status = 'pending' AND available_at <= %s
   AND (kind <> 'step'
        OR run_id IN (SELECT id FROM queuety_workflowrun WHERE status = 'running'))
   AND {_NOT_PAUSED}
RETURNING run_id, step_index, seq, attempt, kind, branch, timeout
"""

#: What the SQLite claim reads of the run after claiming its row.
CLAIMED_RUN_SQLITE = """
SELECT definition_id, state, revision, transitions, cost_units, started_workflows,
       trace_context
  FROM queuety_workflowrun WHERE id = %s
"""

# -- the transition ---------------------------------------------------------------------------

#: The whole transition in one statement, run in autocommit. The step row is locked first (the
#: same lock order as every other writer: step row, then run row), and every write depends on
#: the run's compare-and-set, so a lost claim or a moved run writes nothing: the caller then
#: discards the outcome or decides under the run's lock. The next task row is inserted either
#: pending (its message is published after the commit) or already claimed by this process,
#: which then runs it: an ordinary processing row with a heartbeat, recovered like any other.
#: A row this process would take whose queue is paused (``next_queue``, queuety.queues) is
#: inserted pending instead, its message the caller's: the queue's claim then holds it.
COMPLETE_POSTGRES = """
WITH owned AS (
    SELECT id FROM queuety_steprun
     WHERE id = %(step_run_id)s AND status = 'processing' AND attempt = %(attempt)s
       AND claimed_by = %(claimed_by)s
       FOR UPDATE
), run AS (
    UPDATE queuety_workflowrun
       SET state = %(state)s::jsonb, current_step = %(current_step)s, status = %(status)s,
           finished_at = COALESCE(%(finished_at)s::timestamptz, finished_at),
           updated_at = %(now)s, revision = revision + 1, transitions = transitions + 1,
           cost_units = cost_units + %(cost_units)s, tags = tags || %(tags)s::jsonb
     WHERE id = %(run_id)s AND revision = %(revision)s AND status = 'running'
       AND current_step = %(step_index)s AND migration IS NULL AND EXISTS (SELECT 1 FROM owned)
    RETURNING id, parent_id IS NOT NULL OR awaited AS awaited
), step AS (
    UPDATE queuety_steprun SET status = 'completed', finished_at = %(now)s,
           output = %(output)s::jsonb
     WHERE id = %(step_run_id)s AND status = 'processing' AND attempt = %(attempt)s
       AND claimed_by = %(claimed_by)s AND EXISTS (SELECT 1 FROM run)
), following AS (
    INSERT INTO queuety_steprun (run_id, seq, branch, step_index, step_name, status, attempt,
                                 max_attempts, timeout, available_at, published_at, claimed_at,
                                 heartbeat_at, claimed_by, created_at)
    SELECT %(run_id)s, %(seq)s, 0, %(next_index)s::integer, %(next_name)s::text,
           CASE WHEN p.paused THEN 'pending' ELSE %(next_status)s END,
           CASE WHEN p.paused THEN 0 ELSE %(next_attempt)s END, %(next_max_attempts)s::integer,
           %(next_timeout)s::float8, %(now)s,
           CASE WHEN p.paused THEN %(now)s ELSE %(next_published_at)s::timestamptz END,
           CASE WHEN p.paused THEN NULL ELSE %(next_claimed_at)s::timestamptz END,
           CASE WHEN p.paused THEN NULL ELSE %(next_claimed_at)s::timestamptz END,
           CASE WHEN p.paused THEN '' ELSE %(next_claimed_by)s END, %(now)s
      FROM (SELECT %(next_claimed_by)s <> '' AND EXISTS (
                SELECT 1 FROM queuety_queuepause WHERE queue = %(next_queue)s) AS paused) AS p
     WHERE %(next_index)s::integer IS NOT NULL AND EXISTS (SELECT 1 FROM run)
    RETURNING id, status
), events AS (
    INSERT INTO queuety_event (run_id, step_run_id, kind, step_index, step_name, attempt,
                               duration_ms, data, created_at)
    SELECT %(run_id)s, e.step_run_id, e.kind, e.step_index, COALESCE(e.step_name, ''),
           e.attempt, e.duration_ms, COALESCE(e.data, '{}'::jsonb), %(now)s
      FROM jsonb_to_recordset(%(events)s::jsonb) AS e(
           step_run_id bigint, kind text, step_index integer, step_name text, attempt integer,
           duration_ms double precision, data jsonb)
     WHERE EXISTS (SELECT 1 FROM run)
)
SELECT EXISTS (SELECT 1 FROM owned), EXISTS (SELECT 1 FROM run), (SELECT id FROM following),
       COALESCE((SELECT awaited FROM run), false), (SELECT status FROM following)
"""


# -- streaming steps --------------------------------------------------------------------------

#: Stores one chunk of a streaming step, only while the attempt still owns its step row (an
#: attempt the sweeper took back, or whose run was cancelled, writes nothing and stops). One
#: statement in autocommit: the chunk is durable when it returns. Portable (SQLite too).
APPEND_CHUNK = """
INSERT INTO queuety_stepchunk (run_id, step_run_id, step_index, step_name, "index", attempt,
                               content, created_at)
SELECT %s, %s, %s, %s, %s, %s, %s, %s
 WHERE EXISTS (SELECT 1 FROM queuety_steprun
                WHERE id = %s AND status = 'processing' AND attempt = %s AND claimed_by = %s)
"""

# -- resource control -------------------------------------------------------------------------

#: First keys of the advisory locks that serialise the admissions of one concurrency group and
#: of one queue's cost budget (second key: the name's hash).
GROUP_LOCK_KEY = 7_402
QUEUE_LOCK_KEY = 7_403

#: Serialises the admissions of one group (or queue) until the transaction ends.
GROUP_LOCK = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"

#: Tries to take one such lock without waiting; returns whether it did.
TRY_LOCK = "SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))"

#: Takes the locks of names (a text array) in one namespace, waiting for each, in the order
#: of their keys (so two takers of overlapping sets never wait for each other in a cycle).
HOLD_LOCKS = """
SELECT pg_advisory_xact_lock(%s, hashtext(name))
  FROM (SELECT name FROM unnest(%s::text[]) AS name ORDER BY hashtext(name)) AS names
"""

#: Takes, without waiting, the locks of names (a text array) in one namespace; returns the
#: names whose lock it got.
TRY_LOCKS = """
SELECT name FROM unnest(%s::text[]) AS name WHERE pg_try_advisory_xact_lock(%s, hashtext(name))
"""

#: Wakes throttled rows (pending, woken, due now) and reads back what their messages need, in
#: one statement: ``(id, definition id, step index, timeout)``.
WAKE_THROTTLED = """
UPDATE queuety_steprun AS s
   SET status = 'pending', woken = true, available_at = %s, published_at = %s
  FROM queuety_workflowrun AS r
 WHERE s.id = ANY(%s) AND s.status = 'throttled' AND r.id = s.run_id
RETURNING s.id, r.definition_id, s.step_index, s.timeout
"""
