"""The step boundary: what a worker does with one message.

Read ``docs/internals/step-boundary.md`` first. The modules, from the top (each imports only
the ones below it; the import-linter contract in ``pyproject.toml`` checks it):

- ``sweeper``: the backstops (lost attempts, lost messages, lost wake-ups, deadlines, purges);
- ``attempt``: ``execute_step``: claim, run the handler, record the outcome, inline continuation;
- ``recovery``: a dead worker's attempt (recorded by the worker's main process; the sweeper
  uses its ``interruption`` to say why it recovers a lost one);
- ``outcome``: record a success (one statement, transient errors retried) or a failure;
- ``settle``: fan-out joins, and runs woken because the runs they wait for finished;
- ``landing``: move a run onto its next step (waits, starts, repeats, child runs, fan-out);
- ``finish``: the one way to fail a run, waking its waiters, the tree's attempt budget;
- ``watchdog``: the heartbeat thread and the deadline timer;
- ``claim``: claiming a step row, and the guard that says a row is still this attempt's.
"""
