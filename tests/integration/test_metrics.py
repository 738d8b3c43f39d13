"""Prometheus metrics and ``manage.py queuety metrics``, on PostgreSQL and a real prefork
worker of two pool processes counting into one ``PROMETHEUS_MULTIPROC_DIR``."""

from __future__ import annotations

import io
import json
import os
import re
import uuid

# Imported before PROMETHEUS_MULTIPROC_DIR is set below: this process's own values stay
# in-memory ones, while the endpoint reads the worker's files from the directory.
import prometheus_client  # noqa: F401
import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import path

import queuety
from queuety import exposition
from tests import workflows
from tests.integration.conftest import Worker, wait_for

TOKEN = "scrape-" + uuid.uuid4().hex
urlpatterns = [path("metrics", exposition.metrics_view)]


@pytest.fixture(scope="module")
def counted(db_session, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prometheus")
    handle = Worker(tmp_path_factory.mktemp("counted"), queue=f"met-{uuid.uuid4().hex[:6]}",
                    concurrency=2, beat=False)
    handle.env["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    handle.start()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    yield handle
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    handle.stop()


def scrape(client: Client, **headers) -> tuple[int, str]:
    with override_settings(ROOT_URLCONF=__name__,
                           QUEUETY={**settings.QUEUETY, "METRICS_TOKEN": TOKEN}):
        response = client.get("/metrics", **headers)
    return response.status_code, response.content.decode()


def sample(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            return float(match.group(2))
    raise AssertionError(f"No sample {name}{{{wanted}}} in:\n{text}")


def test_counters__add_up_across_pool_processes(counted, token):
    workflow = f"counted_{token}"
    builder = queuety.workflow(workflow).on_queue(counted.queue).then(workflows.slow)
    ids = [builder.dispatch({"token": token, "sleep": 0.5}) for _ in range(6)]
    failing = (queuety.workflow(workflow + "_fails").on_queue(counted.queue)
               .then(workflows.boom, retry=queuety.RetryPolicy(max_attempts=2,
                                                               initial_delay=0.1))
               .dispatch({"token": token}))
    for run_id in [*ids, failing]:
        wait_for(run_id, worker=counted)
    # Both pool processes ran steps, each counting in its own file.
    pids = {line.split()[0] for line in workflows.marks(f"{token}-slow")}
    assert len(pids) == 2

    status, text = scrape(Client(), HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert status == 200
    assert sample(text, "queuety_steps_total", workflow=workflow, step="slow",
                  outcome="completed") == 6
    assert sample(text, "queuety_step_duration_seconds_count", workflow=workflow,
                  step="slow") == 6
    assert sample(text, "queuety_step_duration_seconds_sum", workflow=workflow,
                  step="slow") >= 6 * 0.5
    assert sample(text, "queuety_steps_total", workflow=workflow + "_fails", step="boom",
                  outcome="retried") == 1
    assert sample(text, "queuety_steps_total", workflow=workflow + "_fails", step="boom",
                  outcome="failed") == 1
    # What the database knows, the same whichever process serves it.
    assert sample(text, "queuety_runs", status="completed") >= 6
    assert sample(text, "queuety_runs", status="failed") >= 1
    assert sample(text, "queuety_waiting_runs", kind="signal") >= 0
    assert sample(text, "queuety_oldest_due_step_age_seconds") >= 0


def test_the_endpoint__needs_the_token_or_the_view_permission(counted):
    assert scrape(Client())[0] == 401
    assert scrape(Client(), HTTP_AUTHORIZATION="Bearer not-the-token")[0] == 403
    user = User.objects.create_user(f"viewer-{uuid.uuid4().hex[:6]}", password="pw")
    client = Client()
    client.force_login(user)
    assert scrape(client)[0] == 403
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))
    status, text = scrape(client)
    assert status == 200 and "queuety_runs{" in text


def test_the_metrics_command__prints_handler_stats_from_the_database(counted, token):
    workflow = f"stats_{token}"
    ok = queuety.workflow(workflow).on_queue(counted.queue).then(workflows.step_a)
    runs = [ok.dispatch({"token": token}) for _ in range(3)]
    runs.append(queuety.workflow(workflow).on_queue(counted.queue).then(workflows.boom)
                .dispatch({"token": token}))
    for run_id in runs:
        wait_for(run_id, worker=counted)
    out = io.StringIO()
    call_command("queuety", "metrics", "--minutes", "5", "--format", "json", stdout=out)
    rows = {(r["workflow"], r["step"]): r for r in json.loads(out.getvalue())}
    assert rows[(workflow, "step_a")]["completed"] == 3
    assert rows[(workflow, "step_a")]["failed"] == 0
    assert rows[(workflow, "step_a")]["p95_ms"] >= rows[(workflow, "step_a")]["avg_ms"] > 0
    assert rows[(workflow, "boom")]["error_rate"] == 1.0
    table = io.StringIO()
    call_command("queuety", "metrics", stdout=table)
    assert re.search(rf"{workflow}\s+step_a\s+3\s+0\s", table.getvalue())
    with pytest.raises(CommandError, match="not a whole number of minutes"):
        call_command("queuety", "metrics", "--minutes", "0")
