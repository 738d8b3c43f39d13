"""The I/O lane: many I/O-bound step bodies in flight in one worker process.

A worker started with Celery's threads pool (``celery worker -P threads -c 200 -Q io``) is a
lane worker. Each pool thread runs one attempt as the prefork pool would (claim, body,
transition), but the body runs differently:

* an ``async def`` body runs on the process's one shared event loop (a daemon thread), so a
  thousand bodies awaiting the network cost a thread each and no process each; at its
  deadline the body's task is cancelled;
* a sync body runs in the pool thread, or, when the step has a timeout, in a thread of its
  own that the pool thread stops waiting for at the deadline. Python cannot stop a thread: an
  abandoned thread runs on until its call returns, and what it returns is discarded. The lane
  counts them, and when more than ``LANE_MAX_ABANDONED`` are still running the worker replaces
  itself (a warm shutdown, then Celery re-executes the worker, which ends those threads);
* the attempt's database connection goes back to Django's pool for the time of the body, so
  a hundred steps awaiting the network hold no connection; a lane worker that could open
  more connections than ``LANE_MAX_CONNECTIONS`` (its threads without the pool, the pool's
  size with it) refuses to start (:func:`connection_refusal`);
* a body that blocks the event loop (``time.sleep`` in ``async def``) stalls every other
  async step of the process: a monitor thread notices, and reports it with the step's name.

In every case the outcome depends only on elapsed time (``queuety.runtime.watchdog.Deadline``):
a result that comes after the deadline is kept for the timeline and never merged.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import logging
import os
import signal as posix_signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from django.db import close_old_connections, connection, connections
from django.utils import timezone

from queuety.conf import settings
from queuety.models import Event
from queuety.runtime.claim import Claim
from queuety.runtime.watchdog import Deadline

logger = logging.getLogger("queuety")

#: How long a cancelled async body may take to unwind before the lane stops waiting for it.
CANCEL_GRACE = 1.0
#: How often the monitor pings the event loop.
PING_INTERVAL = 0.1


def refusal(vendor: str, broker_url: str) -> str | None:
    """Why a lane worker cannot start on this database and broker, or None when it can.

    The lane runs hundreds of attempts at once in one process: SQLite serialises every
    writer, and kombu's filesystem and memory transports are for one process on one machine.
    """
    missing = []
    if vendor != "postgresql":
        missing.append(f"PostgreSQL (the database is {vendor}; set DATABASES['default'] to "
                       "PostgreSQL, e.g. DATABASE_URL=postgres://...)")
    scheme = (broker_url or "").split("://", 1)[0].lower()
    if scheme in ("", "filesystem", "memory", "sqla", "sqlalchemy", "django"):
        missing.append(f"a real broker (the broker is {scheme or 'unset'}://; set "
                       "CELERY_BROKER_URL to Redis or RabbitMQ, e.g. redis://host:6379/0)")
    if not missing:
        return None
    return ("The Queuety I/O lane (a worker with --pool threads) needs " + " and ".join(missing)
            + ". Run the lane on a PostgreSQL + Redis/RabbitMQ deployment, or run this "
            "worker with --pool prefork (the default) instead.")


#: psycopg_pool's own default size, for a pool set as ``True`` or without ``max_size``.
POOL_DEFAULT_SIZE = 4
#: Connections a worker's main process opens besides its pool's threads: the registry's
#: beat, the sweeper's tick and the record of a lost attempt (with Django's pool the last
#: two share it; the registry's beat and the step heartbeat then have one each of their own,
#: ``queuety.store.unpooled``, so the pool's max_size plus 2 in all).
MAIN_PROCESS_CONNECTIONS = 3
_POOL_EXAMPLE = ("DATABASES['default']['OPTIONS']['pool'] = {'min_size': 2, 'max_size': 20} "
                 "(and CONN_MAX_AGE = 0; pip install 'psycopg[pool]')")


def pool_size(databases: dict[str, Any]) -> int | None:
    """The most connections Django's pool (``OPTIONS["pool"]``, Django 5.1+) of the default
    database opens in one process: its ``max_size``, else its ``min_size`` (psycopg_pool's
    rule); None without the pool."""
    options = (databases.get("default") or {}).get("OPTIONS") or {}
    pool = options.get("pool")
    if not pool:
        return None
    sizes = pool if isinstance(pool, dict) else {}
    return int(sizes.get("max_size") or sizes.get("min_size") or POOL_DEFAULT_SIZE)


def connection_refusal(databases: dict[str, Any], concurrency: int,
                       max_connections: int) -> str | None:
    """Why a lane worker of ``concurrency`` threads could open more PostgreSQL connections
    than ``QUEUETY['LANE_MAX_CONNECTIONS']`` (``max_connections``), or None when it cannot.

    Without Django's pool each thread that claims or finishes a step opens a connection of
    its own, so the threads are the bound; with it, the pool's size is, whatever the threads.
    """
    size = pool_size(databases)
    most = concurrency + MAIN_PROCESS_CONNECTIONS
    if size is None and most > max_connections:
        fewer = max(max_connections - MAIN_PROCESS_CONNECTIONS, 1)
        return (f"This I/O lane worker (--pool threads) runs {concurrency} threads, and without "
                "Django's connection pool each thread that claims or finishes a step opens a "
                f"PostgreSQL connection of its own: with the main process's "
                f"{MAIN_PROCESS_CONNECTIONS}, up to {most} connections, more than "
                f"QUEUETY['LANE_MAX_CONNECTIONS'] ({max_connections}), enough to use up the "
                "server's max_connections and have the site's web processes refused. Set "
                f"{_POOL_EXAMPLE}, so that the threads share at most max_size connections, or "
                f"start the worker with --concurrency {fewer} or fewer.")
    if size is not None and size > max_connections:
        return (f"Django's connection pool lets this I/O lane worker open {size} PostgreSQL "
                f"connections (DATABASES['default']['OPTIONS']['pool'] max_size), more than "
                f"QUEUETY['LANE_MAX_CONNECTIONS'] ({max_connections}). Lower the pool's "
                f"max_size to {max_connections} or fewer (the lane's threads then wait their "
                "turn for a connection), or raise QUEUETY['LANE_MAX_CONNECTIONS'] if the "
                "server's max_connections has room for that many per lane worker.")
    return None


def server_advice(databases: dict[str, Any], max_connections: int, server_max: int,
                  reserved: int) -> str | None:
    """Why one lane worker alone could take every connection the PostgreSQL server has for
    ordinary sessions (``server_max`` less the ``reserved`` ones: for superusers, and on
    PostgreSQL 16+ ``reserved_connections``), or None.

    A lane worker holds at most its pool's size, or without the pool
    ``QUEUETY['LANE_MAX_CONNECTIONS']`` (more threads than that refuse to start).
    """
    size = pool_size(databases)
    bound = max_connections if size is None else size
    room = server_max - reserved
    if bound < room:
        return None
    source = (f"QUEUETY['LANE_MAX_CONNECTIONS'] ({max_connections}), as it runs without "
              "Django's connection pool" if size is None
              else f"its connection pool's max_size ({size})")
    return (f"One I/O lane worker may open {bound} PostgreSQL connections ({source}), and the "
            f"server takes {room} (max_connections {server_max} less "
            f"{reserved} reserved): a single lane worker can use them all, and "
            "the site's web processes are then refused.")


@dataclass(frozen=True, slots=True)
class Abandoned:
    """A sync body still running after its attempt was recorded as timed out."""

    thread: threading.Thread
    step_name: str
    run_id: int
    deadline_at: float


class Lane:
    """One per lane worker process: the shared event loop, its monitor, the abandoned threads."""

    def __init__(self, *, max_abandoned: int, blocked_after: float) -> None:
        self.max_abandoned = max_abandoned
        self.blocked_after = blocked_after
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._abandoned: list[Abandoned] = []
        self._replacing = False
        #: The bodies on the loop, by label: (step name, claim), for the blocking report.
        self._bodies: dict[str, tuple[str, Claim]] = {}
        self._last_ping = time.monotonic()
        self._loop_thread = threading.Thread(target=self._run_loop, name="queuety-lane-loop",
                                             daemon=True)
        self._monitor = threading.Thread(target=self._watch_loop, name="queuety-lane-monitor",
                                         daemon=True)

    def start(self) -> None:
        """Start the event loop and its monitor."""
        self._loop_thread.start()
        self._monitor.start()

    # -- running bodies -----------------------------------------------------------------------

    def run(self, step_name: str, held: Claim, invoke: Callable[[], Any], *,
            is_async: bool) -> Any:
        """Run one step body and return its output, or raise what it raised, or
        :class:`~queuety.StepTimeout` at its deadline.

        ``invoke`` calls the handler: for an async handler it returns the coroutine, which
        runs on the shared loop; a sync handler runs inside ``invoke``.
        """
        watch = Deadline(step_name, held.timeout, held)
        # A step awaiting the network holds no database connection meanwhile: with Django's
        # pool, closing hands it back; the transition takes one again.
        connection.close()
        try:
            if is_async:
                return watch.settle(self._run_async(step_name, held, watch, invoke()))
            if held.timeout is None:
                output = invoke()
                if inspect.isawaitable(output):
                    output = self._run_async(step_name, held, watch, output)
                return output
            return watch.settle(self._run_sync(step_name, held, watch, invoke))
        except Exception as error:
            overruled = watch.overrule(error)
            if overruled is error:
                raise
            raise overruled from error
        finally:
            watch.closed = True
            if not is_async:
                connection.close()  # what a sync body opened goes back to the pool too

    def _run_async(self, step_name: str, held: Claim, watch: Deadline,
                   awaitable: Awaitable[Any]) -> Any:
        label = f"{step_name!r} of run {held.run_id} (step run id={held.step_run_id})"
        self._bodies[label] = (step_name, held)
        future, cancel = self._submit(label, awaitable)
        try:
            return self._await(label, watch, future, cancel)
        finally:
            self._bodies.pop(label, None)

    def _submit(self, label: str, awaitable: Awaitable[Any]
                ) -> tuple[concurrent.futures.Future[Any], Callable[[], None]]:
        """Start ``awaitable`` as a task on the loop; return a future of its outcome and a
        function that cancels the task. Unlike ``run_coroutine_threadsafe``'s future, this one
        reports what the task did with its cancellation (it may return, or go on)."""
        outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()
        tasks: list[asyncio.Task[Any]] = []

        def report(task: asyncio.Task[Any]) -> None:
            if task.cancelled():
                outcome.set_exception(concurrent.futures.CancelledError())
            elif task.exception() is not None:
                outcome.set_exception(task.exception())
            else:
                outcome.set_result(task.result())

        def start() -> None:
            task = self.loop.create_task(_guarded(label, awaitable))
            task.add_done_callback(report)
            tasks.append(task)

        def cancel() -> None:
            # Runs after start(): the loop runs callbacks in the order they were scheduled.
            self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in tasks])

        self.loop.call_soon_threadsafe(start)
        return outcome, cancel

    def _await(self, label: str, watch: Deadline, future: concurrent.futures.Future[Any],
               cancel: Callable[[], None]) -> Any:
        try:
            return future.result(timeout=watch.timeout)
        except concurrent.futures.TimeoutError:
            # The deadline passed: whatever comes now is late, even a result that came just now.
            interruption = watch.interrupt()
            if future.done():
                return future.result()  # settle() turns it into the timeout, kept as late
            cancel()  # the task is cancelled on the loop; wait for it to unwind
            try:
                late = future.result(timeout=CANCEL_GRACE)
            except concurrent.futures.CancelledError:
                raise interruption from None
            except concurrent.futures.TimeoutError:
                logger.error("Step %s ignored its cancellation at its deadline and is still "
                             "running on the I/O lane's event loop; its attempt is recorded "
                             "as timed out, and whatever it returns is discarded.", label)
                raise interruption from None
            return late  # it swallowed the cancellation and returned: settle() calls it late

    def _run_sync(self, step_name: str, held: Claim, watch: Deadline,
                  invoke: Callable[[], Any]) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def body() -> None:
            try:
                output = invoke()
                if inspect.isawaitable(output):
                    output = asyncio.run_coroutine_threadsafe(
                        _guarded(step_name, output), self.loop).result()
                box["output"] = output
            except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = error
            finally:
                connections.close_all()  # this thread's connections, back to the pool
                done.set()
                self._forget(threading.current_thread())

        thread = threading.Thread(target=body, daemon=True,
                                  name=f"queuety-lane-body-{held.step_run_id}")
        thread.start()
        assert watch.timeout is not None
        if not done.wait(watch.timeout):
            interruption = watch.interrupt()
            self._abandon(Abandoned(thread, step_name, held.run_id,
                                    time.monotonic()), held)
            raise interruption
        if "error" in box:
            raise box["error"]
        return box.get("output")

    # -- abandoned threads --------------------------------------------------------------------

    def abandoned(self) -> list[Abandoned]:
        """The sync bodies still running past their deadline, oldest first."""
        with self._lock:
            return [a for a in self._abandoned if a.thread.is_alive()]

    def _abandon(self, entry: Abandoned, held: Claim) -> None:
        with self._lock:
            self._abandoned = [a for a in self._abandoned if a.thread.is_alive()]
            if not entry.thread.is_alive():
                return
            self._abandoned.append(entry)
            count = len(self._abandoned)
        logger.warning(
            "Step %r of run %s (attempt %s) passed its timeout of %gs in a sync body that "
            "cannot be interrupted; the attempt is recorded as StepTimeout and its thread %s "
            "runs on until its call returns (its result is discarded). %d such threads are "
            "running in this worker; above QUEUETY['LANE_MAX_ABANDONED'] (%d) it replaces "
            "itself.", entry.step_name, entry.run_id, held.attempt, held.timeout or 0,
            entry.thread.name, count, self.max_abandoned)
        if count > self.max_abandoned:
            self._replace_worker(count)

    def _forget(self, thread: threading.Thread) -> None:
        with self._lock:
            before = len(self._abandoned)
            self._abandoned = [a for a in self._abandoned if a.thread is not thread]
            if len(self._abandoned) < before:
                logger.info("Abandoned thread %s ended; its result was discarded.", thread.name)

    def _replace_worker(self, count: int) -> None:
        with self._lock:
            if self._replacing:
                return
            self._replacing = True
        logger.error("%d sync step bodies are stuck past their deadline in lane worker pid %s "
                     "(more than QUEUETY['LANE_MAX_ABANDONED'] = %d): the worker stops taking "
                     "messages, lets its running steps finish, and restarts itself, which "
                     "ends those threads.", count, os.getpid(), self.max_abandoned)
        # A warm shutdown (Celery's SIGTERM: stop consuming, let running tasks finish), then
        # the same command again in this process (its pid, so a supervisor sees no exit).
        # Celery's own SIGHUP restart re-executes sys.argv, which `python -m celery` breaks.
        atexit.register(_reexecute)
        os.kill(os.getpid(), posix_signal.SIGTERM)

    # -- the event loop and its monitor -------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _touch(self) -> None:
        self._last_ping = time.monotonic()

    def _watch_loop(self) -> None:
        reported = False
        while True:
            try:
                self.loop.call_soon_threadsafe(self._touch)
            except RuntimeError:  # the loop is closed: the process is ending
                return
            time.sleep(PING_INTERVAL)
            lag = time.monotonic() - self._last_ping
            if lag < self.blocked_after:
                reported = False
                continue
            if not reported:
                reported = True
                self._report_blocked(lag)

    def _report_blocked(self, lag: float) -> None:
        label = self._running_body()
        name = label or "(none: code outside any step body)"
        logger.error("Step %s has blocked the I/O lane's event loop for %.1f s: every async "
                     "step of this worker waits meanwhile. Await instead of blocking (an async "
                     "client, asyncio.sleep), move blocking calls into "
                     "await asyncio.to_thread(...), or route the step to a prefork queue.",
                     name, lag)
        body = None if label is None else self._bodies.get(label)
        if body is None:
            return
        step_name, held = body
        try:
            close_old_connections()
            Event.objects.create(run_id=held.run_id, step_run_id=held.step_run_id,
                                 kind="loop_blocked", step_index=held.step_index,
                                 step_name=step_name, attempt=held.attempt,
                                 data={"blocked_seconds": round(lag, 3),
                                       "at": timezone.now().isoformat()})
        except Exception:  # noqa: BLE001 - the log line above is the report
            logger.exception("Could not record that step %s blocked the event loop.", label)
        finally:
            connection.close()  # the monitor holds no pooled connection between reports

    def _running_body(self) -> str | None:
        """The label of the body the loop thread is running now (read from its stack)."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread.ident or -1)
        while frame is not None:
            if frame.f_code is _guarded.__code__:
                label = frame.f_locals.get("label")
                return label if isinstance(label, str) else None
            frame = frame.f_back
        return None


def _reexecute() -> None:
    """Run this worker's command again in this process: every thread, stuck ones included,
    ends here; descriptors close on exec (Python opens them non-inheritable)."""
    logging.shutdown()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


async def _guarded(label: str, awaitable: Awaitable[Any]) -> Any:
    # The monitor finds this frame on the loop thread's stack, and the label in it.
    return await awaitable


_lane: Lane | None = None


def start(concurrency: int) -> Lane:
    """Make this process a lane worker (called once, when the worker starts).

    Raises:
        ImproperlyConfigured: no PostgreSQL, no real broker, or more connections than
            ``QUEUETY['LANE_MAX_CONNECTIONS']`` (the message says which, and how to fix it).
    """
    global _lane
    from celery import current_app
    from django.conf import settings as django_settings
    from django.core.exceptions import ImproperlyConfigured

    refused = (refusal(connection.vendor, str(current_app.conf.broker_url or ""))
               or connection_refusal(django_settings.DATABASES, concurrency,
                                     settings.LANE_MAX_CONNECTIONS))
    if refused:
        raise ImproperlyConfigured(refused)
    if _lane is None:
        _lane = Lane(max_abandoned=settings.LANE_MAX_ABANDONED,
                     blocked_after=settings.LANE_BLOCKED_AFTER)
        _lane.start()
    size = pool_size(django_settings.DATABASES)
    logger.info("Queuety I/O lane: %d steps in flight at most in worker pid %s, on %s.",
                concurrency, os.getpid(),
                f"at most {size} pooled connections" if size is not None
                else f"a connection per thread ({concurrency})")
    return _lane


def current() -> Lane | None:
    """This process's lane, or None when it is not a lane worker."""
    return _lane
