"""What watches an attempt while its handler runs: the heartbeat thread and the deadline.

A fresh heartbeat tells the sweeper the attempt's process is alive; the deadline interrupts a
handler at its step's timeout. Code stuck in C that ignores signals is killed by Celery's hard
time limit instead, which every timed step's message carries (see ``queuety.publish``).
"""

from __future__ import annotations

import json
import logging
import os
import signal as posix_signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any

from django.db import close_old_connections, connection
from django.utils import timezone

from queuety import exceptions
from queuety.conf import settings
from queuety.core import engine
from queuety.core.progress import check_progress
from queuety.models import StepRun, StepStatus
from queuety.runtime.claim import Claim, worker_id
from queuety.store import leases
from queuety.store.unpooled import use_own_connection

logger = logging.getLogger("queuety")


class Heartbeats:
    """One daemon thread per process refreshes the heartbeat of every step it is running.

    Cheaper than a thread per step (measured: 0.2-0.5 ms a step), and its rows are guarded by
    this process's ``claimed_by``, so it never keeps alive a row another process owns.

    Progress a handler reports (:meth:`report`) rides on that thread's heartbeat write: the
    thread is woken, writes the latest report with ``heartbeat_at`` in one UPDATE, then waits
    ``PROGRESS_INTERVAL`` before writing progress again, so a handler that reports in a tight
    loop costs one write per interval, and a step that reports nothing costs nothing more.
    """

    #: The thread's name; an attempt's report leaves it out of the threads a handler left.
    name = "queuety-heartbeat"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[int] = set()
        self._progress: dict[int, dict[str, Any]] = {}
        self._beat_now = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextmanager
    def running(self, step_run_id: int) -> Iterator[None]:
        """Keep ``step_run_id``'s heartbeat fresh inside the block."""
        with self._lock:
            self._live.add(step_run_id)
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                # A forked child inherits no threads: start this process's own.
                self._pid = os.getpid()
                self._wake = threading.Event()
                self._thread = threading.Thread(target=self._beat, name=self.name, daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._live.discard(step_run_id)
                self._progress.pop(step_run_id, None)

    def report(self, step_run_id: int, progress: dict[str, Any] | None) -> None:
        """Have the heartbeat thread write ``progress`` (the latest wins) with the next beat of
        ``step_run_id``, soon; ``None`` only asks for an early beat."""
        with self._lock:
            if step_run_id not in self._live:
                return  # the attempt is over: its outcome is what counts now
            if progress is not None:
                self._progress[step_run_id] = progress
            else:
                self._beat_now = True
        self._wake.set()

    def _beat(self) -> None:
        use_own_connection()  # a beat never waits on the pool the steps may all hold
        me = worker_id()
        next_beat = time.monotonic() + settings.HEARTBEAT_INTERVAL
        while True:
            self._wake.wait(max(0.0, next_beat - time.monotonic()))
            self._wake.clear()
            with self._lock:
                live = list(self._live)
                progress, self._progress = self._progress, {}
                beat_now, self._beat_now = self._beat_now, False
            if not live:
                # Hold no database session while idle (most steps end before their first
                # beat); a no-op when this thread has not connected.
                connection.close()
                next_beat = time.monotonic() + settings.HEARTBEAT_INTERVAL
                continue
            try:
                close_old_connections()
                now = timezone.now()
                mine = StepRun.objects.filter(status=StepStatus.PROCESSING, claimed_by=me)
                for step_run_id, data in progress.items():
                    mine.filter(pk=step_run_id).update(heartbeat_at=now, progress=data)
                if beat_now or time.monotonic() >= next_beat:
                    mine.filter(pk__in=live).update(heartbeat_at=now)
                    leases.beat(me, now)  # the group slots its steps hold live on
                    next_beat = time.monotonic() + settings.HEARTBEAT_INTERVAL
            except Exception:  # noqa: BLE001 - beat again next time, on a new connection
                logger.exception("Heartbeat of step runs %s failed", live)
                connection.close()
            if progress or beat_now:
                time.sleep(settings.PROGRESS_INTERVAL)  # reports meanwhile are coalesced


_heartbeats = Heartbeats()


def heartbeat(step_run_id: int) -> AbstractContextManager[None]:
    """Keep the step's heartbeat fresh while this process works on it."""
    return _heartbeats.running(step_run_id)


def progress_reporter(step_run_id: int, run_id: int, step_name: str
                      ) -> Callable[[dict[str, Any] | None], None]:
    """The ``StepContext.beat`` of one attempt: check a report, hand it to the thread.

    Raises (from the returned function):
        InvalidProgress: the report is not a small JSON dict; nothing is recorded.
    """
    def beat(progress: dict[str, Any] | None) -> None:
        if progress is not None:
            progress = check_progress(run_id, step_name, progress, settings.MAX_PROGRESS_BYTES)
        _heartbeats.report(step_run_id, progress)
    return beat


class Deadline:
    """The deadline of one attempt, and whether it has passed.

    The outcome of an attempt depends only on the elapsed time: once the timer fired, the
    attempt timed out, whatever the body does with the interruption (a body that catches
    ``TimeoutError`` around a socket read, or ``Exception``, and returns). :meth:`settle`
    turns such a late return into the timeout; the context manager :func:`deadline` does the
    same for a late error. A ``TimeoutError`` the body raises and catches before the timer
    fired is the body's own business.
    """

    def __init__(self, step_name: str, timeout: float | None, held: Claim) -> None:
        self.step_name, self.timeout, self.held = step_name, timeout, held
        self.interruption: exceptions.StepTimeout | None = None
        #: Set once the attempt's block is being left: an alarm that comes now is too late
        #: to interrupt anything and must not escape from the clean-up.
        self.closed = False

    @property
    def passed(self) -> bool:
        """True once the timer fired."""
        return self.interruption is not None

    def interrupt(self) -> exceptions.StepTimeout:
        """Record that the deadline passed; return the error that interrupts the body."""
        self.interruption = exceptions.StepTimeout(
            f"Step {self.step_name!r} of run {self.held.run_id} (attempt {self.held.attempt}) "
            f"exceeded its timeout of {self.timeout:g}s and was interrupted.")
        return self.interruption

    def settle(self, output: Any) -> Any:
        """Return ``output``, or raise the timeout when it came after the deadline.

        Raises:
            StepTimeout: the body caught its interruption and returned; ``late`` keeps what
                it returned, for the timeline.
        """
        if self.interruption is None:
            return output
        self.interruption.late = {"output": _storable(output)}
        raise self.interruption

    def overrule(self, error: BaseException) -> BaseException:
        """The error the attempt ends with: ``error``, or the timeout when the deadline passed
        and the body raised something else in its place (kept in ``late``)."""
        if self.interruption is None or error is self.interruption:
            return error
        if self.interruption.late is None:
            self.interruption.late = {
                "error": engine.describe_error(error, with_traceback=False)}
        return self.interruption


@contextmanager
def deadline(step_name: str, timeout: float | None, held: Claim) -> Iterator[Deadline]:
    """Interrupt the handler with StepTimeout when ``timeout`` seconds pass; yield the
    :class:`Deadline`, whose :meth:`~Deadline.settle` the caller applies to the body's output.

    Uses a real-time interval timer, so blocking Python code (``time.sleep``, socket reads, busy
    loops) is interrupted at the deadline, with sub-second precision. An error the body raises
    after the deadline passed leaves the block as the timeout.

    Raises:
        PermanentError: the step has a timeout but this is not a process's main thread, where
            no timer can interrupt it.
    """
    watch = Deadline(step_name, timeout, held)
    if timeout is None:
        yield watch
        return
    if threading.current_thread() is not threading.main_thread():
        raise exceptions.PermanentError(
            f"Step {step_name!r} of run {held.run_id} has timeout={timeout:g}s but runs "
            "outside a process's main thread (an eventlet or gevent pool), where it cannot "
            "be interrupted. Run Queuety workers with --pool prefork (the default) or solo, or "
            "run I/O-bound steps on the I/O lane (--pool threads), which enforces timeouts "
            "itself."
        )

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if not watch.closed:
            raise watch.interrupt()

    previous = posix_signal.signal(posix_signal.SIGALRM, on_alarm)
    posix_signal.setitimer(posix_signal.ITIMER_REAL, timeout)
    try:
        yield watch
    except Exception as error:
        overruled = watch.overrule(error)
        if overruled is error:
            raise
        raise overruled from error
    finally:
        watch.closed = True
        try:
            posix_signal.setitimer(posix_signal.ITIMER_REAL, 0)
        finally:
            posix_signal.signal(posix_signal.SIGALRM, previous)


#: The most of a late output the timeline keeps (it is shown, never merged).
_LATE_OUTPUT_BYTES = 10_000


def _storable(output: Any) -> Any:
    """A late output as the timeline can store it: itself when it is JSON of reasonable size,
    else a note of what it was (a compensation, whose output is ignored, may return anything)."""
    try:
        text = json.dumps(output, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return {"unstorable": f"{type(output).__name__}: {repr(output)[:200]}"}
    if len(text) > _LATE_OUTPUT_BYTES or "\\u0000" in text:
        return {"unstorable": f"{type(output).__name__} of {len(text)} bytes of JSON"}
    return output
