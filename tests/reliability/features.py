"""The fault harness of ``test_faults_features.py``: its workers, its faults (a pool process
or a main process SIGKILLed, PostgreSQL cut off) with what each hit and how long until that
moved on, a sampler thread, the checks every scenario ends with, and a webhook receiver."""

from __future__ import annotations

import os
import queue
import random
import signal
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.db import connection
from django.db.utils import DatabaseError

import queuety
from queuety.models import Event, StepRun, WorkflowRun
from queuety.runtime.claim import pid_of
from queuety.webhooks import signing
from tests.reliability.chaos import PoolWorker, free_port, live_rows, moved_on, pg_outage

BROKER = os.environ["CELERY_BROKER_URL"]
#: Worker losses are retried while attempts remain; this leaves room for several.
RETRY = queuety.RetryPolicy(max_attempts=8, initial_delay=0.1, backoff_factor=1.5,
                            max_delay=1.0, jitter=0, retry_on=[ConnectionError])
#: Webhook back-offs (s) that outlast the receiver's downtime: 1 + 6 attempts over 15 s.
HOOK_DELAYS = [1, 1, 2, 3, 3, 5]
SECRET = "feature-faults-secret-" + uuid.uuid4().hex


class Pools:
    """Workers ``a`` (beat) and ``b`` on ``queue``, and the lane worker on ``lane_queue``."""

    def __init__(self, log_dir) -> None:
        self.queue = f"queuety-feat-{uuid.uuid4().hex[:10]}"
        self.lane_queue = self.queue + "-io"
        self.a = PoolWorker(log_dir, BROKER, self.queue, beat=True, name="a")
        self.b = PoolWorker(log_dir, BROKER, self.queue, beat=False, name="b")
        self.lane = PoolWorker(log_dir, BROKER, self.lane_queue, beat=False, name="lane",
                               concurrency=16)
        self.lane.pool = "threads"
        self.lane.env.update({"QUEUETY_DB_POOL": "5", "CELERY_TASK_DEFAULT_QUEUE": self.queue,
                              "QUEUETY_DB_APPLICATION_NAME": f"lane-{uuid.uuid4().hex[:8]}"})
        for worker in self.workers:
            worker.env["QUEUETY_TEST_WEBHOOK_RETRY_DELAYS"] = str(HOOK_DELAYS)

    @property
    def workers(self) -> list[PoolWorker]:
        return [self.a, self.b, self.lane]

    def tails(self) -> str:
        return "".join(f"\n--- worker {w.name} (log {w.log_path}) ---\n{w.log()[-2500:]}"
                       for w in self.workers)


class Faults:
    """The faults of one scenario: what each hit, how long until it had moved on, and which
    processes died when (a killed step's interval ends there)."""

    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self.rows: list[dict] = []
        self.died: dict[int, float] = {}
        self.back: dict[str, float] = {}
        """When each restarted worker was launched again (epoch seconds)."""
        self._restarts: list[threading.Thread] = []

    def inject(self, name: str, action, run_ids, timeout: float = 60) -> dict:
        """Inject ``action`` once a step of ``run_ids`` runs; measure, from the fault, until
        every step running or queued at that moment has moved on (``chaos.moved_on``)."""
        self.settle()
        deadline = time.monotonic() + 20
        while not StepRun.objects.filter(run_id__in=run_ids, status="processing").exists():
            assert time.monotonic() < deadline, f"Nothing ran to inject {name!r} into."
            time.sleep(0.02)
        running, queued = live_rows(run_ids)
        started = time.monotonic()
        detail = action()
        row = {"fault": name, "detail": detail, "running": len(running),
               "queued": len(queued), "fault_s": round(time.monotonic() - started, 2)}
        row.update(moved_on(name, running, queued, timeout, since=started,
                            tails=self.pools.tails))
        self.settle()
        self.rows.append(row)
        return row

    def settle(self) -> None:
        """Wait until the workers restarted after a crash answer."""
        while self._restarts:
            self._restarts.pop().join()

    def kill_pool(self, worker: PoolWorker, run_ids=(), pid: int | None = None):
        """SIGKILL a pool process of ``worker``: ``pid``, else one running a step of
        ``run_ids`` if there is one, else any."""
        def action():
            pids = worker.pool_pids()
            busy = {pid_of(claimed) for claimed in StepRun.objects.filter(
                run_id__in=list(run_ids), status="processing").values_list("claimed_by",
                                                                           flat=True)
                    if claimed} & set(pids)
            victim = pid or random.choice(sorted(busy) or pids)
            os.kill(victim, signal.SIGKILL)
            self.died[victim] = time.time()
            return f"pool process {victim} of worker {worker.name} SIGKILLed" + (
                " (running a step of the scenario)" if victim in busy else "")
        return action

    def crash(self, worker: PoolWorker, down: float = 0.0):
        """SIGKILL ``worker``'s main process (then its orphans); a thread starts it again
        after ``down`` seconds while the fault is measured (:meth:`settle` waits for it)."""
        def restart() -> None:
            time.sleep(down)
            self.back[worker.name] = time.time()
            worker.start()

        def action():
            children = worker.children() + [worker.proc.pid]
            orphans = worker.crash()
            self.died.update(dict.fromkeys(children, time.time()))
            self._restarts.append(threading.Thread(target=restart))
            self._restarts[-1].start()
            return (f"main process of worker {worker.name} SIGKILLed ({orphans} children "
                    f"orphaned, then killed), started again" + (f" {down:g} s later" if down
                                                                 else ""))
        return action

    @staticmethod
    def outage(seconds: float = 2.0):
        def action():
            return f"{pg_outage(seconds)} sessions terminated, connections refused for " \
                   f"{seconds:g} s"
        return action


def wait_finished(run_ids, timeout: float, pools: Pools) -> None:
    """Wait until every run of ``run_ids`` has finished (the workers' logs on a timeout)."""
    deadline = time.monotonic() + timeout
    while WorkflowRun.objects.filter(pk__in=run_ids).exclude(
            status__in=("completed", "failed", "cancelled")).exists():
        if time.monotonic() > deadline:
            stuck = list(WorkflowRun.objects.filter(pk__in=run_ids).exclude(
                status="completed").values_list("pk", "status", "current_step")[:10])
            raise AssertionError(f"Runs not finished after {timeout}s: {stuck}"
                                 + pools.tails())
        time.sleep(0.2)


def completed_once(run_ids, step_names) -> None:
    """Every run completed, each step with one ``step_completed`` and no row left live."""
    statuses = Counter(WorkflowRun.objects.filter(pk__in=run_ids).values_list("status",
                                                                              flat=True))
    assert statuses == {"completed": len(run_ids)}, statuses
    completions = Counter(Event.objects.filter(run_id__in=run_ids, kind="step_completed")
                          .values_list("run_id", "step_name"))
    assert completions == {(run_id, name): 1 for run_id in run_ids for name in step_names}
    assert not StepRun.objects.filter(run_id__in=run_ids,
                                      status__in=("pending", "processing")).exists()


class Sampler(threading.Thread):
    """Calls ``sample()`` every 50 ms on a connection of its own until stopped; a sample
    that meets the PostgreSQL outage is skipped."""

    def __init__(self, sample) -> None:
        super().__init__(daemon=True)
        self.sample = sample
        self.halt = threading.Event()
        self.skipped = 0

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                try:
                    self.sample()
                except DatabaseError:
                    self.skipped += 1
                    connection.close()
                self.halt.wait(0.05)
        finally:
            connection.close()

    def stop(self) -> None:
        self.halt.set()
        self.join()


class Receiver:
    """A webhook endpoint in this process on a port of its own, down until :meth:`up`; with
    :attr:`hold` set, it holds the next request open for 1.5 s (under ``WEBHOOK_TIMEOUT``)
    and hands it to the test on :attr:`held`, which kills the process sending it."""

    HOLD_SECONDS = 1.5

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        self.seen: list[dict] = []
        self.hold = threading.Event()
        self.lock = threading.Lock()
        self.held: queue.Queue[dict] = queue.Queue()
        self.server: ThreadingHTTPServer | None = None

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                seen = {"id": self.headers["Queuety-Delivery"], "body": body,
                        "signature": self.headers[signing.HEADER],
                        "peer": self.client_address[1]}
                with receiver.lock:  # one request held per hold, however many arrive
                    seen["held"] = receiver.hold.is_set()
                    receiver.hold.clear()
                    receiver.seen.append(seen)
                if seen["held"]:
                    receiver.held.put(seen)
                    time.sleep(receiver.HOLD_SECONDS)
                try:
                    self.send_response(200)
                    self.end_headers()
                except OSError:
                    pass  # the sender was killed while the request was held

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def socket_owner(peer_port: int, pids: list[int]) -> int:
    """Which of ``pids`` holds the TCP connection from local port ``peer_port``."""
    with open("/proc/net/tcp") as table:
        inodes = {line.split()[9] for line in table.readlines()[1:]
                  if int(line.split()[1].split(":")[1], 16) == peer_port}
    for pid in pids:
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if {f"socket:[{inode}]" for inode in inodes} & links:
            return pid
    raise AssertionError(f"No process of {pids} holds the connection from port {peer_port}.")


