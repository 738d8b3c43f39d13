"""docs/deploy/embedding.md followed to the letter, as a new user would, on Django 5.2 (Python
3.11) and on Django 6.0 (Python 3.12).

Each case starts from nothing: a fresh virtualenv on that Python, the guide's
``pip install "Django>=5.2,<6.1"`` (which picks 5.2 on 3.11 and 6.0 on 3.12) and
``django-admin startproject mysite``; the wheel built from a copy of this repository; the
guide's settings, files and commands, read out of the guide (every code block carries an
``embedding-test`` comment naming it, and every block the guide has is either used here or
marked "not run"); a fresh PostgreSQL database, a real ``celery -A mysite worker -B`` and
``manage.py runserver`` on a free port. Three runs are dispatched and approved over HTTP: with
a token, with a session and its CSRF token, and through the approval link the worker mailed.

What the test changes, it changes openly: the names that must be its own (the database, the
broker's Redis database and a queue, the server's port, where mail goes), appended to
``settings.py`` after the guide's block (OVERRIDES), and ``runserver``'s address and
``--noreload``. The PostgreSQL server is the guide's (127.0.0.1:5432, user postgres).
"""

from __future__ import annotations

import contextlib
import email
import http.cookiejar
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

import queuety

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy" / "embedding.md"
#: The placeholder the guide uses for a clone of this repository.
CLONE = "/path/to/queuety-django"
#: The address the guide's server answers on (runserver's default).
ADDRESS = "127.0.0.1:8000"

OVERRIDES = '''
# --- tests/integration/test_embedding.py: names that must be the test's own ----------------
DATABASES["default"]["NAME"] = {database!r}
CELERY_BROKER_URL = {broker!r}
CELERY_TASK_DEFAULT_QUEUE = {queue!r}
EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = {mail!r}
'''

BLOCK = re.compile(r"^[ \t]*<!-- embedding-test: (?P<name>[^>]+?) -->[ \t]*\n"
                   r"(?P<indent>[ \t]*)```(?P<lang>\w*)\n(?P<body>.*?)\n[ \t]*```", re.M | re.S)
FENCE = re.compile(r"^[ \t]*```\w", re.M)


class Guide:
    """The guide's code blocks by name, with the test's substitutions; records which were used."""

    def __init__(self, text: str, port: int, clone: Path) -> None:
        self.blocks: dict[str, str] = {}
        self.skipped: list[str] = []
        for found in BLOCK.finditer(text):
            name, indent = found["name"], found["indent"]
            body = "\n".join(line.removeprefix(indent) for line in found["body"].splitlines())
            if name.startswith("not run"):
                self.skipped.append(name)
                continue
            assert name not in self.blocks, f"two blocks named {name!r} in {GUIDE.name}"
            self.blocks[name] = body
        assert len(FENCE.findall(text)) == len(self.blocks) + len(self.skipped), (
            f"every code block of {GUIDE.name} needs an <!-- embedding-test: NAME --> comment "
            "(or 'not run (why)') on the line before it")
        self.port, self.clone = port, clone
        self.used: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.used.add(name)
        return (self.blocks[name].replace(CLONE, str(self.clone))
                .replace(ADDRESS, f"127.0.0.1:{self.port}"))

    def unused(self) -> set[str]:
        return set(self.blocks) - self.used


class Terminal:
    """A user's terminal: each block runs in bash, which keeps the working directory and the
    variables (``RUN=...``, an activated virtualenv) for the next block, as a shell would."""

    def __init__(self, cwd: Path, env: dict[str, str], scratch: Path) -> None:
        self.cwd, self.env, self.scratch = cwd, env, scratch
        self.processes: list[subprocess.Popen] = []

    def run(self, script: str, timeout: float = 240) -> str:
        state = self.scratch / "state"
        wrapped = (f"set -eo pipefail -a\ncd {shlex.quote(str(self.cwd))}\n{script}\n"
                   f"pwd > {shlex.quote(str(state))}.cwd\n"
                   f"env -0 > {shlex.quote(str(state))}.env\n")
        done = subprocess.run(["bash", "-c", wrapped], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"This block failed with {done.returncode}:\n{script}\n"
                                 f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n"
                                 f"{done.stderr[-4000:]}")
        self.cwd = Path(Path(f"{state}.cwd").read_text().strip())
        pairs = Path(f"{state}.env").read_text().split("\0")
        self.env = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
        return done.stdout

    def start(self, command: str, log: Path) -> subprocess.Popen:
        with open(log, "w") as out:
            process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.cwd,
                                       env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        # SIGTERM to each main process only: a worker then stops its embedded beat itself,
        # which saves beat's run counts (a signal to the whole group raced that save).
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):  # anything left behind
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@dataclass
class Case:
    python: str
    django: str
    timings: dict[str, float] = field(default_factory=dict)


def find_python(version: str) -> str:
    """The interpreter for ``version``, found as ./dev finds it (PATH, then pyenv)."""
    candidates = [shutil.which(f"python{version}")] + sorted(
        (Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions").glob(
            f"{version}*/bin/python{version}"), reverse=True)
    for candidate in candidates:
        if candidate and subprocess.run([str(candidate), "-c", "import sys"],
                                        capture_output=True).returncode == 0:
            return str(candidate)
    raise RuntimeError(f"Python {version} is needed by this test; install it (pyenv install "
                       f"{version}) or put python{version} on the PATH.")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def admin_connection():
    return psycopg.connect(os.environ["DATABASE_URL"], dbname="postgres", autocommit=True)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A copy of the repository as a clone has it: tracked files and new, unignored ones."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    target = tmp_path_factory.mktemp("clone") / "queuety-django"
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def wait_until(what: str, probe, timeout: float, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log and log.exists() else ""
            raise AssertionError(f"{what} did not happen within {timeout}s.\n{tail}")
        time.sleep(0.2)


def answered(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def mailed_link(folder: Path, run_id: int) -> str | None:
    """The approval link in the mail about run ``run_id`` (the file backend's messages)."""
    for path in sorted(folder.glob("*.log")):
        for part in path.read_text().split("\n" + "-" * 79 + "\n"):
            message = email.message_from_string(part.strip())
            if message["Subject"] and message["Subject"].startswith(f"Run {run_id}:"):
                body = message.get_payload(decode=True).decode()
                return re.search(r"https?://\S+", body)[0]
    return None


def approve_through_the_page(link: str) -> str:
    """What the editor does: open the link, press Approve (a real browser's cookies and form)."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with browser.open(link, timeout=10) as page:
        html = page.read().decode()
    assert 'value="approve"' in html and "publish_article" in html
    csrf = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "action": "approve",
                                   "note": "Fine by me."}).encode()
    request = urllib.request.Request(link, data=form, headers={"Referer": link})
    with browser.open(request, timeout=10) as done:
        return done.read().decode()


@pytest.mark.parametrize("case", [Case("3.11", "5.2"), Case("3.12", "6.0")],
                         ids=lambda case: f"django{case.django}-py{case.python}")
def test_the_embedding_guide_works_in_a_fresh_startproject(case, clone, tmp_path):
    started = time.monotonic()
    port = free_port()
    guide = Guide(GUIDE.read_text(), port, clone)
    work, mail = tmp_path / "work", tmp_path / "mail"
    work.mkdir()
    mail.mkdir()
    # The user's `python` is the Python of this case; nothing of this test process leaks in
    # (no DJANGO_SETTINGS_MODULE, PYTHONPATH, VIRTUAL_ENV or DATABASE_URL).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(find_python(case.python))
    env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()),
           "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    terminal = Terminal(work, env, tmp_path)
    database = f"test_queuety_embedding_{uuid.uuid4().hex[:8]}"
    try:
        # The site, and step 1: the package.
        terminal.run(guide["site"])
        site = terminal.cwd
        assert site == work / "mysite" and (site / "manage.py").exists()
        version = terminal.run('python -c "import django; print(django.get_version())"')
        assert version.startswith(case.django + "."), version
        case.timings["site"] = time.monotonic() - started
        terminal.run(guide["install"])
        case.timings["install"] = time.monotonic() - started
        check_the_wheel(clone, terminal)
        # Installing Queuety left the site's Django as it was.
        assert terminal.run('python -c "import django; print(django.get_version())"') == version

        # Steps 2 to 6: settings, the Celery app, URLs, the database, a workflow.
        package = site / "mysite"
        broker = os.environ["CELERY_BROKER_URL"]
        with open(package / "settings.py", "a") as settings:
            settings.write("\n" + guide["settings"] + "\n")
            settings.write(OVERRIDES.format(database=database, broker=broker,
                                            queue=f"embedding-{uuid.uuid4().hex[:12]}",
                                            mail=str(mail)))
        (package / "celery.py").write_text(guide["celery.py"] + "\n")
        with open(package / "__init__.py", "a") as init:
            init.write(guide["__init__.py"] + "\n")
        (package / "urls.py").write_text(guide["urls.py"] + "\n")
        (package / "workflows.py").write_text(guide["workflows.py"] + "\n")
        createdb = guide["createdb"]
        assert createdb.endswith(" mysite"), createdb
        terminal.run(createdb.removesuffix(" mysite") + f" {database}")
        checked = terminal.run(guide["migrate"])
        assert "System check identified no issues" in checked, checked
        deploy = terminal.run("python manage.py check --deploy 2>&1")
        assert "drf_spectacular" not in deploy and "queuety." not in deploy, deploy
        case.timings["migrate"] = time.monotonic() - started

        # Step 7: a worker and the server.
        worker_line, server_line = guide["run"].splitlines()
        assert worker_line.startswith("celery -A mysite worker")
        assert server_line == "python manage.py runserver"
        worker_log, server_log = tmp_path / "worker.log", tmp_path / "server.log"
        worker = terminal.start(worker_line, worker_log)
        terminal.start(f"{server_line} 127.0.0.1:{port} --noreload", server_log)
        wait_until("The worker's start", lambda: worker.poll() is None and " ready." in
                   worker_log.read_text(), 60, worker_log)
        worker_ready = time.monotonic()
        wait_until("The server's start", lambda: answered(
            f"http://127.0.0.1:{port}/admin/login/"), 60, server_log)

        # Step 8: the API's users.
        terminal.run(guide["operators"])
        terminal.run(guide["token"])
        assert re.fullmatch(r"[0-9a-f]{40}", terminal.env["TOKEN"]), terminal.env["TOKEN"]

        def status(expected: str) -> dict:
            return wait_until(f"Run {terminal.env['RUN']} {expected}", lambda: (
                body if (body := json.loads(terminal.run(guide["basic"])))["status"] == expected
                else None), 60, worker_log)

        # Step 9: a run approved with a token; anonymous calls refused with 401.
        terminal.run(guide["dispatch"])
        waiting = status("waiting_for_signal")
        assert waiting["waiting_for"] == ["approval"] and waiting["state"]["title"] == "Article 7"
        anonymous = terminal.run(guide["anonymous"])
        assert anonymous.startswith("HTTP/1.1 401") and "WWW-Authenticate: Token" in anonymous
        receipt = json.loads(terminal.run(guide["token-approve"]))
        assert receipt["settled"] is True and receipt["name"] == "approval", receipt
        assert status("completed")["state"]["published_url"] == "/articles/7/"

        # ... a second one with a session and its CSRF token.
        terminal.run(guide["dispatch"])
        status("waiting_for_signal")
        receipt = json.loads(terminal.run(guide["session-approve"]))
        assert receipt["settled"] is True, receipt
        status("completed")

        # Step 10: a third through the link the worker mailed, absolute on BASE_URL.
        terminal.run(guide["dispatch"])
        status("waiting_for_signal")
        run_id = int(terminal.env["RUN"])
        link = wait_until("The approval mail", lambda: mailed_link(mail, run_id), 60,
                          worker_log)
        assert link.startswith(f"http://127.0.0.1:{port}/queuety/api/approvals/"), link
        assert "was recorded" in approve_through_the_page(link)
        completed = status("completed")
        assert completed["state"]["approval"]["note"] == "Fine by me."

        # The schema, with the guide's settings (no DEFAULT_SCHEMA_CLASS anywhere).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/queuety/api/schema/?format=json",
                                    timeout=10) as answer:
            schema = json.loads(answer.read())
        assert schema["info"] == {**schema["info"], "title": "Queuety API",
                                  "version": queuety.__version__}
        assert guide.unused() == set(), f"blocks of the guide this test did not use: {guide.unused()}"

        # The LOGGING of step 2: at -l info the worker logged no task and no sweep, though
        # beat had sent the sweeper a few times (its count is saved when it stops).
        wait_until("Two sweeps", lambda: time.monotonic() - worker_ready > 11, 15)
        terminal.stop()
        log = worker_log.read_text()
        assert " Task " not in log and "Sending due task" not in log, log[-3000:]
        with psycopg.connect(os.environ["DATABASE_URL"], dbname=database) as db:
            sweeps = db.execute("SELECT total_run_count FROM django_celery_beat_periodictask "
                                "WHERE task = 'queuety.sweep'").fetchone()[0]
        assert sweeps >= 2, log[-3000:]
        case.timings["total"] = time.monotonic() - started
        print(f"\nembedding guide, Django {case.django} / Python {case.python}: "
              + ", ".join(f"{name} at {seconds:.0f}s" for name, seconds in case.timings.items())
              + f"; {len(guide.blocks)} blocks run, {len(guide.skipped)} not run")
    finally:
        terminal.stop()
        with admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def check_the_wheel(clone: Path, terminal: Terminal) -> None:
    """The wheel holds queuety only, with its templates, migrations, typing marker and licence,
    and the version of ``queuety.__version__``."""
    wheels = list((clone / "dist").glob("queuety_django-*.whl"))
    assert [wheel.name for wheel in wheels] == [
        f"queuety_django-{queuety.__version__}-py3-none-any.whl"]
    names = zipfile.ZipFile(wheels[0]).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"queuety", f"queuety_django-{queuety.__version__}.dist-info"}, tops
    assert {"queuety/py.typed", "queuety/templates/queuety/approval.html",
            "queuety/templates/admin/queuety/workflowrun/run.html",
            "queuety/migrations/0001_initial.py",
            f"queuety_django-{queuety.__version__}.dist-info/licenses/LICENSE"} <= set(names)
    metadata = zipfile.ZipFile(wheels[0]).read(
        f"queuety_django-{queuety.__version__}.dist-info/METADATA").decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert "Requires-Dist: Django<6.1,>=5.2" in requires or \
        "Requires-Dist: django<6.1,>=5.2" in requires, requires
    assert all("dj-database-url" not in line or "extra ==" in line for line in requires)
    assert "Classifier: Framework :: Django :: 6.0" in metadata
    # No demo project: `startproject project`, or a site package named project, is not shadowed.
    missing = terminal.run('python -c "import importlib.util as u; '
                           'print(u.find_spec(\'project\'))"')
    assert missing.strip() == "None"
