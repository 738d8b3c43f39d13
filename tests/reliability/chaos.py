"""The fault harness: throwaway broker servers, worker pools on a chosen broker, and faults.

Nothing here touches the machine's shared servers: Redis faults hit a ``redis-server`` this
module starts on a free port; the PostgreSQL "restart" drops every connection to the session's
own test database and refuses new ones for a while (see ``pg_outage`` for why not a real
restart); RabbitMQ is used through a queue of its own.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from celery import Celery
from django.db import connection
from django.utils import timezone
from kombu import Connection

from queuety import publish
from queuety.models import StepRun
from tests.integration.conftest import Worker


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class RedisServer:
    """A private ``redis-server`` (no persistence: a restart loses every queued message)."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 5) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        with open(self.log_dir / f"redis-{self.port}.log", "a") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--daemonize", "no"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"The test's own redis-server did not listen on {self.port} "
                           "within 15 s.")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def flushdb(self, db: int = 5) -> None:
        import redis

        redis.Redis.from_url(self.url(db)).flushdb()


def purge_queue(broker_url: str, queue: str) -> int:
    """Drop every message waiting in ``queue`` (the broker "loses" them)."""
    with Connection(broker_url) as conn:
        return conn.default_channel.queue_purge(queue) or 0


def delete_queue(broker_url: str, queue: str) -> None:
    with Connection(broker_url, connect_timeout=5) as conn:
        try:
            conn.default_channel.queue_delete(queue)
        except Exception:  # noqa: BLE001 - clean-up only; the queue name is unique anyway
            pass


def broker_app(name: str, broker_url: str) -> Celery:
    """A Celery app of this process talking to ``broker_url``.

    Celery prefers the ``CELERY_BROKER_URL`` environment variable (the session's broker) to
    the ``broker`` argument; the read and write URLs take precedence over both.
    """
    app = Celery(name, set_as_current=False)
    app.conf.broker_read_url = app.conf.broker_write_url = broker_url
    app.conf.broker_connection_timeout = 2
    return app


class PoolWorker(Worker):
    """A ``Worker`` on a broker of its own choosing, pinged through that broker."""

    node_prefix = "rel"

    def __init__(self, log_dir: Path, broker_url: str, queue: str, *, beat: bool,
                 concurrency: int = 2, name: str = "w", options: tuple[str, ...] = ()) -> None:
        super().__init__(log_dir, queue=queue, beat=beat, concurrency=concurrency)
        self.name = name
        self.options = options
        self.env["CELERY_BROKER_URL"] = broker_url
        # The worker publishes the next steps (and the sweeper's re-publications) here too.
        self.env["CELERY_TASK_DEFAULT_QUEUE"] = queue
        self.app = broker_app(f"chaos-{name}", broker_url)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"worker-{self.name}-{self.starts}.log"

    @property
    def schedule_path(self) -> Path:
        return self.log_dir / f"beat-{self.name}"

    def control_app(self) -> Celery:
        return self.app

    def children(self) -> list[int]:
        """Pids of the main process's children (pool processes, and beat with ``-B``)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    found.append(int(entry))
        return found

    def exit_reason(self) -> str | None:
        """Why the main process ended on its own (its last CRITICAL line), or None if alive."""
        if self.proc is None or self.proc.poll() is None:
            return None
        critical = [line for line in self.log().splitlines() if "CRITICAL/" in line]
        last = critical[-1].split("] ", 1)[-1] if critical else "no CRITICAL line logged"
        return f"exit code {self.proc.returncode}: {last}"

    def kill_pool_process(self) -> int:
        pids = self.pool_pids()
        if not pids:
            raise AssertionError(f"Worker {self.name} reported no pool process to kill.")
        pid = random.choice(pids)
        os.kill(pid, signal.SIGKILL)
        return pid

    def crash(self) -> int:
        """SIGKILL the main process alone; then, as a supervisor would, its orphans."""
        orphans = self.children()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        time.sleep(0.5)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return len(orphans)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        super().stop(sig, timeout)
        try:  # pool processes orphaned by a crash of the main process
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, AttributeError):
            pass


@contextmanager
def publishing_to(broker_url: str, queue: str):
    """Send this process's step messages (dispatch, signals) to the pools under test.

    The test process's own Celery app talks to the session's broker; the runs under test
    must reach the pools on another broker, so their messages go through a second app.
    """
    app = broker_app("chaos-client", broker_url)

    def send(messages: list[publish.Message]) -> None:
        for message in messages:
            options = {"queue": queue, "retry": False}
            if message.countdown:
                options["countdown"] = message.countdown
            try:
                app.send_task("queuety.execute_step", (message.step_run_id,), **options)
            except Exception:  # noqa: BLE001 - as in queuety.publish: the sweeper re-sends
                pass

    try:
        with publish.redirected(send):
            yield app
    finally:
        app.close()


#: Step statuses of rows a fault can hit: due or running.
LIVE = ("pending", "processing")


def live_rows(run_ids) -> tuple[dict, dict]:
    """Step rows of ``run_ids`` running now, and rows due but not yet claimed (queued
    messages): ``{pk: (status, attempt)}`` each."""
    rows = StepRun.objects.filter(run_id__in=run_ids, status__in=LIVE,
                                  available_at__lte=timezone.now())
    running, queued = {}, {}
    for pk, status, attempt in rows.values_list("pk", "status", "attempt"):
        (running if status == "processing" else queued)[pk] = (status, attempt)
    return running, queued


def moved_on(name: str, running: dict, queued: dict, timeout: float, poll=lambda: None,
             tails=lambda: "", since: float | None = None) -> dict[str, float]:
    """Wait until every row of ``running`` and of ``queued`` (``live_rows`` at a fault) has
    moved on, its status or attempt changed; return the seconds each kind took (0.0: there
    were none), from ``since`` (a ``time.monotonic()``; default: now). ``poll`` runs each
    round (a supervisor); ``tails`` explains a timeout."""
    injected = time.monotonic() if since is None else since
    left = {"running": dict(running), "queued": dict(queued)}
    took: dict[str, float] = {}
    while any(left.values()):
        ids = [pk for rows in left.values() for pk in rows]
        now = {pk: (status, attempt) for pk, status, attempt in StepRun.objects.filter(
            pk__in=ids).values_list("pk", "status", "attempt")}
        for kind, rows in left.items():
            left[kind] = {pk: was for pk, was in rows.items() if now.get(pk) == was}
            if not left[kind] and kind not in took:
                took[kind] = round(time.monotonic() - injected, 2)
        if time.monotonic() - injected > timeout:
            raise AssertionError(f"After fault {name!r}, step rows {left} had not moved "
                                 f"on within {timeout}s.{tails()}")
        poll()
        time.sleep(0.1)
    return {"running_recovered_s": took.get("running", 0.0),
            "queued_recovered_s": took.get("queued", 0.0)}

def first_event(run_id: int, kind: str, timeout: float = 120):
    """The first event ``kind`` of run ``run_id``, waited for up to ``timeout`` seconds."""
    from queuety.models import Event

    deadline = time.monotonic() + timeout
    while True:
        event = Event.objects.filter(run_id=run_id, kind=kind).order_by("pk").first()
        if event is not None:
            return event
        assert time.monotonic() < deadline, f"no {kind} event for run {run_id} in {timeout} s"
        time.sleep(0.05)


def pg_outage(seconds: float) -> int:
    """Make PostgreSQL vanish for the workers, as a restart does, for ``seconds``.

    Every other session of the test database is terminated (what a restart does to clients)
    and new ones are refused until the window ends. A real restart of a private server would
    also need the session's test database to live there; the machine's shared server must
    not be restarted (others' tests run on it). This process keeps its own session to observe.
    Returns the number of sessions terminated.
    """
    with postgres_down() as terminated:
        time.sleep(seconds)
    return terminated


@contextmanager
def postgres_down():
    """``pg_outage`` for as long as the block lasts; yields the sessions terminated."""
    import psycopg
    from psycopg import sql

    name = connection.settings_dict["NAME"]
    # A database cannot refuse connections to itself from inside: act from the server's
    # maintenance database.
    with psycopg.connect(os.environ["DATABASE_URL"], dbname="postgres",
                         autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false")
                      .format(sql.Identifier(name)))
        try:
            yield admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> %s",
                [name, connection.connection.info.backend_pid]).fetchone()[0]
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true")
                          .format(sql.Identifier(name)))
