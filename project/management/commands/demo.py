"""``manage.py demo``: dispatch the example workflow, run it on a real Celery worker, print it."""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

import queuety
from project.workflows import DEMO_ORDER, order_fulfilment
from queuety.core.describe import format_status


class Command(BaseCommand):
    help = "Run the order workflow on a Celery worker started for the occasion, and print it."

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=90.0,
                            help="Seconds to wait for the run to finish (default 90).")

    def handle(self, *args, timeout, **options):
        database = settings.DATABASES["default"]
        self.stdout.write(f"Database: {database['ENGINE'].rsplit('.', 1)[-1]} "
                          f"({database['NAME']})")
        self.stdout.write(f"Broker:   {settings.CELERY_BROKER_URL.split('@')[-1]}")
        worker = self._start_worker()
        try:
            run_id = order_fulfilment().dispatch(DEMO_ORDER)
            self.stdout.write(f"Dispatched run #{run_id}; a Celery worker (pid {worker.pid}) "
                              "is executing it...")
            status = self._follow(run_id, worker, timeout)
        finally:
            self._stop_worker(worker)
        self.stdout.write("")
        self.stdout.write("\n".join(format_status(status)))
        if status.status != "completed":
            self.stderr.write(self.log_path.read_text()[-3000:])
            raise CommandError(f"Run #{run_id} ended {status.status!r}, not 'completed'.")

    def _start_worker(self):
        command = [sys.executable, "-m", "celery", "-A", "project", "worker", "-B",
                   "--pool", "prefork", "--concurrency", "2", "--loglevel", "WARNING",
                   "--without-gossip", "--without-mingle",
                   "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")]
        self.log_path = settings.VAR_DIR / "demo-worker.log"
        self.stdout.write(f"Worker:   celery -A project worker -B (log: {self.log_path})")
        with open(self.log_path, "w") as log:
            return subprocess.Popen(command, cwd=settings.BASE_DIR, env=os.environ.copy(),
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def _follow(self, run_id, worker, timeout):
        deadline = time.monotonic() + timeout
        seen = None
        while True:
            status = queuety.workflow_status(run_id)
            where = (status.status, status.current_step)
            if where != seen:
                seen = where
                step = status.current_step_name or "-"
                self.stdout.write(f"  {status.status:<10} step {status.current_step}/"
                                  f"{status.total_steps} {step}")
            if status.is_finished:
                return status
            if worker.poll() is not None:
                # What the worker said last is why it stopped: shown here, not left in its log.
                self.stderr.write(self.log_path.read_text()[-3000:])
                raise CommandError(f"The Celery worker exited with code {worker.returncode} "
                                   f"before run #{run_id} finished.")
            if time.monotonic() > deadline:
                raise CommandError(f"Run #{run_id} did not finish within {timeout:g}s; "
                                   f"it is {status.status!r} at step {status.current_step}.")
            time.sleep(0.1)

    def _stop_worker(self, worker):
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
