"""Jobs: the tasks of Django's tasks framework, run on Queuety's step boundary.

A job is a run of a one-step workflow named ``task:<the task's module path>`` whose step calls
the task's function (``queuety.jobs.execute``). So a job has everything a step has: the claim,
the heartbeat, the recovery of a dead worker's attempt, retries, timeouts, resource control,
the I/O lane, and the admin, CLI and API of runs. ``queuety.tasks_backend.QueuetyBackend`` is
the framework's face over it (docs/guide/tasks.md).
"""
