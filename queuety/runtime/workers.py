"""The worker registry: each worker's main process says it is alive.

A pool process that dies is recorded at once by its worker's main process (``queuety.tasks``).
When the main process itself is gone (SIGKILL, out of memory, a lost machine), nobody is left
to say so: its rows stop beating, and the step messages it had reserved from the broker (a
retry's back-off, a short ``delay()``) are lost with it; Redis hands unacknowledged messages
out again only after its visibility timeout (an hour). So every main process beats every
``HEARTBEAT_INTERVAL``, and the sweeper takes back what a worker that stopped beating held
(``queuety.runtime.sweeper.recover_lost_workers``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from django.db import connection
from django.utils import timezone

from queuety.conf import settings
from queuety.runtime.claim import name_worker, worker_id, worker_name, worker_started
from queuety.store import rows
from queuety.store.unpooled import use_own_connection

logger = logging.getLogger("queuety")


class MainProcessBeat:
    """The beat of one worker's main process, in a daemon thread of its own.

    ``processes`` returns the pids of the worker's pool processes (for the solo pool, the
    main process runs the steps itself). The thread holds no database connection between
    beats: pool processes forked meanwhile must not inherit one.
    """

    def __init__(self, processes: Callable[[], list[int]]) -> None:
        self._processes = processes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Named before the pool forked (worker_init), as its pool processes' claims carry it;
        # the registry's start time is the one in the name.
        self.started_at = worker_started() or timezone.now()
        self.name = worker_name() or name_worker(self.started_at)

    def start(self) -> None:
        """Beat now and then every ``HEARTBEAT_INTERVAL``, in the thread, until :meth:`stop`
        (a database that cannot be reached never holds up the worker's main process)."""
        self._thread = threading.Thread(target=self._run, name="queuety-worker-beat",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and leave the registry: a clean shutdown holds nothing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            rows.forget_worker(self.name)
        except Exception:  # noqa: BLE001 - the sweeper forgets it once it stops beating
            logger.exception("Could not remove worker %s from the registry", self.name)
        finally:
            connection.close()

    def _run(self) -> None:
        use_own_connection()  # a beat never waits on the pool the steps may all hold
        self._beat()
        while not self._stop.wait(settings.HEARTBEAT_INTERVAL):
            self._beat()

    def _beat(self) -> None:
        try:
            # The list is for sweepers of earlier versions, which match claimed_by against
            # it; this one finds a worker's attempts by the name their claimed_by carries.
            pids = self._processes() or [os.getpid()]
            rows.record_worker(self.name, [worker_id(pid) for pid in pids], self.started_at)
        except Exception:  # noqa: BLE001 - beat again next time, on a new connection
            logger.exception("Worker %s could not record its beat", self.name)
        finally:
            connection.close()
