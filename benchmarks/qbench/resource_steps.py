"""Steps of the resource-control benchmark (qbench.resources): each appends its start and end
times to a ledger file, from which the driver rebuilds concurrency, rates and latencies."""

from __future__ import annotations

import os
import time


def ledgered(state):
    """Sleep ``state['nap']`` seconds; append ``<start> <end> <label> <pid>`` to the ledger."""
    started = time.time()
    time.sleep(float(state["nap"]))
    ended = time.time()
    line = f"{started!r} {ended!r} {state.get('label', '-')} {os.getpid()}\n"
    with open(os.path.join(os.environ["QBENCH_LEDGER_DIR"], state["ledger"]), "a") as out:
        out.write(line)  # one write of a short line with O_APPEND: whole across processes
    return None
