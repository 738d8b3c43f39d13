"""The step boundary: what a worker does with one message.

Read ``docs/internals/step-boundary.md`` first (its "Layout of the package" says the same per
module). The 18 modules, from the top, floor by floor as the import-linter contract in
``pyproject.toml`` checks them (a module imports only the floors below its own; modules on
one floor do not import each other):

- ``sweeper``: the backstops (lost attempts, lost messages, lost wake-ups, expired waits,
  deadlines, purges, webhook deliveries);
- ``attempt``: ``execute_step``: claim, run the handler, record the outcome, inline continuation;
- ``recovery``: a dead worker's attempt (recorded by the worker's main process; the sweeper
  uses its ``interruption`` to say why it recovers a lost one);
- ``expiry``: a wait whose timeout passed, settled exactly once (sweeper and replies);
- ``reminders``: a wait's due reminder, sent once (a compare-and-set claim of the run row);
- ``outcome``: record a success (one statement, transient errors retried) or a failure;
- ``settle``: fan-out joins, and runs woken because the runs they wait for finished;
- ``lane``: the I/O lane: step bodies on a shared event loop or in abandoned threads;
- ``wakeups``: waking throttled steps (a group's free slots, a queue's line across groups);
- ``landing``: move a run onto its next step (waits, starts, repeats, child runs, fan-out);
- ``finish``: the one way to fail a run, waking its waiters, the tree's attempt budget;
- ``watchdog``: the heartbeat thread and the deadline timer;
- ``workers``: the worker registry: each worker's main process beats;
- ``sink``: the sink of one attempt: its artifact writes and streamed chunks;
- ``gates``: resource control: the gate a claimed step passes, landing decisions, throttling;
- ``artifacts``: artifact rows, pending until the attempt's outcome publishes them;
- ``chunks``: chunk rows of streaming steps and the attempt's batching writer;
- ``admission``: worker admission: the memory headroom of this worker process;
- ``claim``: claiming a step row, and the guard that says a row is still this attempt's.
"""
