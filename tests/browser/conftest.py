"""Browser tests: headless Chromium (Debian's ``chromium`` package) driven by Playwright.

They run in a world of their own: a database created and dropped here, their own Celery worker
on their own queue, and ``manage.py runserver``. So they never share rows, messages or workers
with the integration tests' session database, and the server process really is another process.
Nothing here skips: a missing browser or library fails with the command that installs it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.servers import require_servers

# PostgreSQL and a real broker, or the run stops here (this suite creates its own PostgreSQL
# database and runs its own worker).
require_servers()

from tests.integration.conftest import Worker  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--headless=new",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
# docs/guide/admin.md's screenshots are refreshed only on request (QUEUETY_SCREENSHOTS=docs), so an
# ordinary test run leaves the working tree clean.
SCREENSHOTS = (ROOT / "docs" / "screenshots" if os.environ.get("QUEUETY_SCREENSHOTS") == "docs"
               else ROOT / "var" / "screenshots")


def require_browser() -> None:
    """Fail (never skip) when Chromium or Playwright is missing, saying how to install them."""
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"Debian's Chromium at {CHROMIUM} (install it with "
                       "'apt-get update && apt-get install -y chromium')")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright for Python (install it with \"pip install -e '.[test]'\"; "
                       "do not run 'playwright install': the tests use Debian's Chromium)")
    if missing:
        pytest.fail("The browser tests need " + " and ".join(missing) + ".", pytrace=False)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _admin_connection():
    import psycopg

    return psycopg.connect(os.environ["DATABASE_URL"], dbname="postgres", autocommit=True)


@dataclass
class Site:
    """The browser world: its server's URL, its environment and what the seed made."""

    base_url: str
    env: dict[str, str]
    runs: dict = field(default_factory=dict)

    def url(self, path: str) -> str:
        return self.base_url + path

    def shell(self, code: str) -> str:
        """Run Python inside the project, against this world's database; return its output."""
        done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py shell failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout


@pytest.fixture(scope="package")
def site(tmp_path_factory):
    """A migrated database of its own, a worker, a seeded set of runs and a running server.

    One for tests/browser, not one per module: the modules after test_admin_browser.py start
    runs of their own and read only those (and the world is dropped when the package ends).
    """
    require_browser()
    name = f"test_queuety_browser_{uuid.uuid4().hex[:8]}"
    with _admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlsplit(os.environ["DATABASE_URL"])
    queue = f"queuety-browser-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DATABASE_URL": urlunsplit(url._replace(path="/" + name)),
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "CELERY_TASK_DEFAULT_QUEUE": queue}
    logs = tmp_path_factory.mktemp("browser")
    worker = server = None
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT,
                       env=env, check=True, timeout=300)
        worker = Worker(logs, queue=queue, beat=False, concurrency=2)
        worker.env.update(env)
        worker.start()
        port = _free_port()
        with open(logs / "server.log", "w") as log:
            server = subprocess.Popen(
                [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        made = Site(f"http://127.0.0.1:{port}", env)
        made.runs = json.loads(made.shell(
            "from tests.browser.seed import main; main()").strip().splitlines()[-1])
        _wait_for_server(made.url("/admin/login/"), server, logs / "server.log")
        yield made
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        if worker is not None:
            worker.stop()
        with _admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _wait_for_server(url: str, server: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"runserver exited with {server.returncode}:\n"
                               + log.read_text()[-3000:])
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"runserver did not answer {url} within {timeout}s:\n"
                       + log.read_text()[-3000:])


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium, driven by Playwright (no browser download).

    Module-scoped, never session-scoped: Playwright's sync API keeps an event loop running in
    the main thread while it is open, and Django refuses database calls from a thread with a
    running loop (SynchronousOnlyOperation), which would break every later database test.
    """
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1920, "height": 940},
                                  device_scale_factor=1)
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    yield tab
    context.close()
