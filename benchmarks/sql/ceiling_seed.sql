-- Reset the pgbench_step database: queuety's own tables (created by `manage.py migrate`),
-- :runs running runs of a 3-step workflow, each with its pending step row (seq 0).
-- The state is the same size as the engine benchmark's ({"i": n, "token": "<32 hex>"}).
TRUNCATE queuety_event, queuety_signal, queuety_steprun, queuety_workflow_dispatch_keys,
         queuety_workflowrun, queuety_workflowdefinition RESTART IDENTITY CASCADE;
INSERT INTO queuety_workflowdefinition (name, definition, definition_hash, created_at)
VALUES ('ceiling', '{}', repeat('0', 64), now());
INSERT INTO queuety_workflowrun (definition_id, name, status, state, current_step, total_steps,
                                 revision, transitions, cost_units, started_workflows,
                                 created_at, updated_at)
SELECT 1, 'ceiling', 'running', jsonb_build_object('i', g, 'token', md5(g::text)), 0, 3,
       0, 0, 0, 0, now(), now()
  FROM generate_series(1, :runs) AS g;
INSERT INTO queuety_steprun (run_id, seq, branch, step_index, step_name, status, attempt,
                             max_attempts, available_at, published_at, claimed_by, created_at)
SELECT g, 0, 0, 0, 'noop', 'pending', 0, 3, now(), now(), '', now()
  FROM generate_series(1, :runs) AS g;
VACUUM ANALYZE queuety_workflowrun, queuety_steprun, queuety_event;
