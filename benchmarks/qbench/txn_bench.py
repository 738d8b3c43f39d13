"""The ``txn`` section: exactly-once ORM steps (``transactional=True``) against plain steps.

N three-step runs on the shipped worker of 2 prefork processes, each step incrementing the
run's own row of ``qbench_counter`` (no contention between runs): once as transactional steps
(the write, the output and the transition in one transaction), once as plain steps that wrap
the same write in their own ``transaction.atomic()`` (the write commits, then the transition
commits by itself). Both count the rows afterwards: every run's row must read exactly 3.
"""

from __future__ import annotations

import time
import uuid

from qbench.queuety_bench import Stats, wait_done
from qbench.util import Worker

TRANSACTIONAL = ("qbench.steps.bump", "qbench.steps.bump2", "qbench.steps.bump3")
PLAIN = ("qbench.steps.plain_bump", "qbench.steps.plain_bump2", "qbench.steps.plain_bump3")


def _reset(stats: Stats, n: int) -> None:
    stats.conn.execute("CREATE TABLE IF NOT EXISTS qbench_counter "
                       "(id integer PRIMARY KEY, value integer NOT NULL DEFAULT 0)")
    stats.conn.execute("TRUNCATE qbench_counter")
    stats.conn.execute("INSERT INTO qbench_counter (id) SELECT generate_series(0, %s)",
                       [n - 1])


def counter_steps(worker: Worker, n: int, *, transactional: bool) -> dict[str, float]:
    """N three-step counter runs through ``worker``: steps/s, and whether each run's row
    was incremented exactly three times."""
    import queuety

    queue = f"qbench-txn-{uuid.uuid4().hex[:6]}"
    name = "qbench_txn" if transactional else "qbench_txn_plain"
    builder = queuety.workflow(name).on_queue(queue)
    for step in TRANSACTIONAL if transactional else PLAIN:
        builder = builder.then(step, transactional=transactional)
    stats = Stats()
    try:
        _reset(stats, n)
        ids = [builder.dispatch({"i": i}) for i in range(n)]
        started = time.time()
        worker.consume(queue)
        end = wait_done(stats, ids[0], ids[-1], timeout=120 + n * 3 / 10)
        wrong = stats.one("SELECT count(*) FROM qbench_counter WHERE value <> 3")[0]
    finally:
        worker.ignore(queue)
        stats.close()
    if wrong:
        raise RuntimeError(f"{wrong} of {n} counter rows were not incremented exactly 3 times")
    return {"steps_per_s": 3 * n / (end - started), "seconds": end - started}
