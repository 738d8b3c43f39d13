"""Integration fixtures: the PostgreSQL test database and a REAL Celery worker subprocess.

The worker is started once per session with the test database's name, the prefork pool and an
embedded beat (for schedules). Every worker, this one and any a test starts, takes its turn at
sweeping (queuety.runtime.sweep_tick): one sweep a second in all, however many run. Tests do not run inside transactions: the
worker must see what they write, and each test works on its own runs.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

import queuety
from tests.pythons import SUPPORTED, venv_python
from tests.servers import require_servers

# PostgreSQL and a real broker, or the run stops here (tests.settings alone would fall back to
# the demo's SQLite and filesystem broker).
require_servers()

ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config):
    # QUEUETY_CHARACTERISE=<file.json>: record every run the suite makes (tests/characterise.py).
    if os.environ.get("QUEUETY_CHARACTERISE"):
        config.pluginmanager.import_plugin("tests.characterise")


@pytest.fixture
def no_sweeps():
    """The site's sweep lease, held by the test while it runs: no worker sweeps meanwhile.

    For tests that arrange throttled rows or hold locks in this process: the session worker's
    sweep (one a second) would otherwise wake a step, or wait for a lock, under them."""
    from queuety.store import sweeps

    deadline = time.monotonic() + 30
    while not isinstance(lease := sweeps.claim("tests (no_sweeps)", interval=0, lease=120),
                         sweeps.Lease):
        assert time.monotonic() < deadline, f"The sweep lease stayed with {lease.holder} for 30 s."
        time.sleep(0.05)
    yield
    sweeps.release(lease.token)


@pytest.fixture
def name():
    """A fresh schedule name; the schedule (its PeriodicTask row) is removed after the test."""
    from django_celery_beat.models import PeriodicTask

    from queuety import schedules

    chosen = f"sched-{uuid.uuid4().hex[:8]}"
    yield chosen
    PeriodicTask.objects.filter(name=schedules.TASK_PREFIX + chosen).delete()


@pytest.fixture(scope="session", autouse=True)
def _database(db_session):
    """Every integration test has the session's database (``db_session``, tests/conftest.py)."""
    yield


class Worker:
    """A ``celery -A project worker`` subprocess bound to the test database."""

    def __init__(self, log_dir: Path, python: str = sys.executable, queue: str | None = None,
                 beat: bool = True, concurrency: int = 4, pool: str = "prefork") -> None:
        self.pool = pool
        self.log_dir = log_dir
        self.python = python
        self.queue = queue or settings.CELERY_TASK_DEFAULT_QUEUE
        self.beat = beat
        self.concurrency = concurrency
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        #: The tree the worker runs: another commit's (tests/reliability/test_upgrades.py).
        self.cwd = ROOT
        url = urlsplit(os.environ["DATABASE_URL"])
        self.env = {
            **os.environ,
            "DATABASE_URL": urlunsplit(url._replace(path="/" + connection.settings_dict["NAME"])),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
        }

    #: Prefix of the node name, and extra ``celery worker`` options (subclasses change them).
    node_prefix = "test"
    options: tuple[str, ...] = ()

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"worker-{self.starts}.log"

    @property
    def schedule_path(self) -> Path:
        return self.log_dir / "celerybeat-schedule"

    def control_app(self):
        """The Celery app this test process pings and inspects the worker through."""
        from project.celery import app

        return app

    def start(self) -> None:
        self.launch()
        self._wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it to answer (``start`` waits too)."""
        self.starts += 1
        self.nodename = f"{self.node_prefix}-{uuid.uuid4().hex[:8]}@localhost"
        command = [
            self.python, "-m", "celery", "-A", "project", "worker",
            "--pool", self.pool, "--concurrency", str(self.concurrency), "--loglevel", "INFO",
            "-Q", self.queue, "-n", self.nodename, "--without-gossip", "--without-mingle",
            *self.options,
        ]
        if self.beat:
            command += ["-B", "--schedule", str(self.schedule_path)]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(command, cwd=self.cwd, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"The Celery worker exited with {self.proc.returncode}:\n"
                                   + self.log_path.read_text()[-4000:])
            try:
                if self.control_app().control.ping(destination=[self.nodename], timeout=0.5):
                    return
            except Exception:  # noqa: BLE001 - the broker may be coming back
                time.sleep(0.2)
        raise RuntimeError("The Celery worker did not answer a ping within "
                           f"{timeout}s:\n" + self.log_path.read_text()[-4000:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop the worker (SIGTERM: warm shutdown; SIGKILL: the whole process group dies)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def log(self) -> str:
        return self.log_path.read_text()

    def pool_pids(self) -> list[int]:
        stats = self.control_app().control.inspect([self.nodename], timeout=2).stats() or {}
        return list(stats.get(self.nodename, {}).get("pool", {}).get("processes", []))


#: The per-Python workers started so far (``pyworker``), by version.
_PYWORKERS: dict[str, Worker] = {}


@pytest.fixture(scope="session", params=SUPPORTED, ids=lambda v: f"py{v}")
def _pyworker(request, db_session, worker, tmp_path_factory):
    version = request.param
    handle = Worker(tmp_path_factory.mktemp(f"py{version}"), python=venv_python(version),
                    queue=f"timeouts-{version}-{uuid.uuid4().hex[:6]}", beat=False,
                    concurrency=8)
    handle.version = version
    _PYWORKERS[version] = handle
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture
def pyworker(_pyworker):
    """A worker on one Python version, consuming a queue of its own (8 pool processes).

    Its process is session-scoped, so pytest runs every test of one version (test_fanout.py's,
    test_timeout_outcome.py's and test_timeouts.py's) on one worker before the next version's
    starts: three worker starts in the suite, not three per module, and never two at once.
    """
    if _pyworker.proc.poll() is not None:  # stopped when the tests that use one were over
        _pyworker.start()
    return _pyworker


def pytest_runtest_teardown(item, nextitem):
    # pytest keeps the last version's worker to the end of the session: stop it as soon as
    # the next test needs none (pyworker starts it again for a test that comes later).
    if nextitem is None or "pyworker" not in getattr(nextitem, "fixturenames", ()):
        for handle in _PYWORKERS.values():
            handle.stop()


def start_together(*workers: Worker) -> None:
    """Start the workers' processes at once, then wait until each answers a ping (their
    start-ups overlap instead of queueing one behind the other)."""
    for handle in workers:
        handle.launch()
    for handle in workers:
        handle._wait_ready()


def stop_together(workers, **options) -> None:
    """``stop(**options)`` every worker at the same time (each warm shutdown takes a while)."""
    workers = list(workers)
    with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
        for done in [pool.submit(handle.stop, **options) for handle in workers]:
            done.result()


def wait_for(run_id: int, statuses=("completed", "failed", "cancelled"), timeout: float = 30,
             worker: Worker | None = None):
    """Poll the run until its status is one of ``statuses``; return its status object."""
    deadline = time.monotonic() + timeout
    while True:
        status = queuety.workflow_status(run_id)
        if status.status in statuses:
            return status
        if time.monotonic() > deadline:
            tail = worker.log()[-3000:] if worker else ""
            raise AssertionError(f"Run {run_id} is still {status.status!r} at step "
                                 f"{status.current_step} after {timeout}s.\n{tail}")
        time.sleep(0.05)


# -- a site deployed from a folder of its own (the deploy tests) -------------------------------

@pytest.fixture
def admin_client():
    """A browser signed in as a fresh superuser (pytest-django's own needs its per-test
    database transaction, which the session's worker could not see)."""
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_superuser(f"w{uuid.uuid4().hex[:10]}", password="pw")
    browser = Client()
    browser.force_login(user)
    return browser


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory):
    """A folder for the site's handler modules, on this process's ``sys.path``."""
    folder = tmp_path_factory.mktemp("deployed")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def deployed(db_session, code_dir, tmp_path_factory):
    """A worker of the module's own queue that imports from ``code_dir`` too."""
    handle = Worker(tmp_path_factory.mktemp("deploy-worker"),
                    queue=f"deploy-{uuid.uuid4().hex[:6]}", beat=False, concurrency=2)
    handle.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(code_dir)])
    handle.env["PYTHONDONTWRITEBYTECODE"] = "1"
    handle.start()
    yield handle
    handle.stop()


def write(code_dir: Path, name: str, text: str) -> None:
    """Put ``text`` on disk as module ``name``, as a deploy does, and let this process see it."""
    (code_dir / f"{name}.py").write_text(text)
    shutil.rmtree(code_dir / "__pycache__", ignore_errors=True)
    forget(name)


def forget(name: str) -> None:
    """Make this process import module ``name`` afresh (and every handler path again)."""
    from queuety.core import imports

    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    imports.forget_imports()
