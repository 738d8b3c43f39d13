"""The sweeper's tick: every worker offers to sweep, and one at a time does.

Recovery must not hang on one process. Every worker's main process runs a :class:`SweepTick`,
a daemon thread of its own (not the registry's beat: a long sweep must never delay a beat),
that asks for the sweeper's lease (``queuety.store.sweeps``) about once a ``SWEEP_INTERVAL``
and sweeps when it gets it; a ``queuety.sweep`` message (from beat, if a site keeps its entry)
goes through the same lease (:func:`sweep_once`). So sweeps run one at a time and about once an
interval however many workers there are, and go on as long as one worker lives.

The thread holds no database connection between ticks (pool processes forked meanwhile must
not inherit one), and a tick that fails, whatever the cause, is logged and the next one tries
again: it never takes the worker down.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from django.db import connection

from queuety.conf import settings
from queuety.runtime import sweeper
from queuety.store import sweeps

logger = logging.getLogger("queuety")
#: One DEBUG line as each sweep starts and ends, with its token and holder (what the tests
#: read to show that sweeps never overlap).
trace = logging.getLogger("queuety.sweeps")

#: Seconds a tick that could not ask (the database away) waits before asking again, at most.
RETRY_AFTER_ERROR = 5.0


def sweep_once(holder: str) -> dict[str, int] | None:
    """Sweep if this is the sweep's turn: the lease is due and free. Return the sweep's
    report, or None when another worker sweeps now or swept less than an interval ago."""
    claimed = sweeps.claim(holder, settings.SWEEP_INTERVAL, settings.SWEEP_LEASE)
    if isinstance(claimed, sweeps.Refusal):
        return None
    return _sweep(claimed)


def _sweep(lease: sweeps.Lease, stopping: Callable[[], bool] = lambda: False
           ) -> dict[str, int]:
    """Run one sweep under ``lease``, renewing it before each phase, then end it. A sweep
    whose worker is stopping (``stopping``) ends at its next phase and frees the lease, so the
    next worker sweeps at once rather than a ``SWEEP_LEASE`` later."""
    if lease.took_over is not None:
        logger.warning("The sweep of %s did not end and its lease expired (its worker died or "
                       "hung); %s sweeps instead (sweep %d).", lease.took_over, lease.holder,
                       lease.token)
    trace.debug("sweep %d started by %s at %.6f", lease.token, lease.holder, time.time())

    def still_held() -> bool:
        # One UPDATE a phase: a lease renewed only now and then could lapse in a phase
        # shorter than SWEEP_LEASE.
        return not stopping() and sweeps.renew(lease.token, settings.SWEEP_LEASE)

    try:
        return sweeper.sweep(still_held=still_held)
    finally:
        trace.debug("sweep %d ended by %s at %.6f", lease.token, lease.holder, time.time())
        try:
            sweeps.release(lease.token)
        except Exception:  # noqa: BLE001 - the lease then expires on its own
            logger.exception("Could not end sweep %d of %s; its lease expires in at most "
                             "%g s.", lease.token, lease.holder, settings.SWEEP_LEASE)


class SweepTick:
    """The sweeper's tick in one worker's main process, in a daemon thread of its own.

    ``holder`` names the worker in the lease (its registry name).
    """

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Ask for the lease now and then about once a ``SWEEP_INTERVAL``, until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="queuety-sweep-tick",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop ticking; wait up to ``timeout`` seconds for a sweep under way to end (one
        cut short by the exit is taken over once its lease expires)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        # Workers started together spread their first asks over an interval.
        delay = random.uniform(0, settings.SWEEP_INTERVAL)
        while not self._stop.wait(delay):
            try:
                delay = self.tick()
            except Exception:  # noqa: BLE001 - the thread must outlive any one tick
                logger.exception("Worker %s's sweep tick failed; it tries again.", self.holder)
                delay = RETRY_AFTER_ERROR

    def tick(self) -> float:
        """Ask for the lease once and sweep if it is granted; return the seconds to wait
        before asking again (when the next sweep is due, plus a little jitter so that the
        workers do not all ask at the same instant)."""
        interval = settings.SWEEP_INTERVAL
        try:
            claimed = sweeps.claim(self.holder, interval, settings.SWEEP_LEASE)
            if isinstance(claimed, sweeps.Lease):
                _sweep(claimed, self._stop.is_set)
                wait = float(interval)
            else:
                # Not due: ask when it is. Due but busy (a sweep under way, or another worker
                # asking): ask again well within the interval.
                wait = claimed.retry_in if claimed.retry_in > 0 else interval / 4
        except Exception:  # noqa: BLE001 - the next tick tries again, on a new connection
            logger.exception("Worker %s could not take its turn at sweeping; it tries again.",
                             self.holder)
            wait = min(float(interval), RETRY_AFTER_ERROR)
        finally:
            connection.close()
        return max(wait, 0.01) + random.uniform(0, min(0.1 * interval, 0.5))
