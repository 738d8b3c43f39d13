"""The API's ``jobs/`` endpoints (DRF) on real jobs: PostgreSQL and the session's worker."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from rest_framework.test import APIClient

import queuety
from queuety.models import Event
from tests import job_tasks, workflows
from tests.integration.conftest import wait_for
from tests.settings import QUEUETY as TEST_QUEUETY
from tests.workflows import marks

pytestmark = pytest.mark.worker

API = "/queuety/api"


def make_user(*perms: str, last_name: str = "") -> User:
    user = User.objects.create_user(f"j{uuid.uuid4().hex[:10]}", last_name=last_name)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)  # fresh permission cache


def client_of(*perms: str, last_name: str = "") -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user(*perms, last_name=last_name))
    return client


@pytest.fixture
def operator():
    return client_of("view_workflowrun", "change_workflowrun")


def job_scope(user, runs):
    """A QUEUETY["RUN_SCOPE"] for jobs: a user reaches the jobs whose first argument (the
    test's token) is their last name."""
    return runs.filter(state__args__0=user.last_name)


def done(result, worker, statuses=("completed", "failed", "cancelled")):
    return wait_for(int(result.id), statuses=statuses, worker=worker)


def test_get_job__its_result_fields_and_links(operator, worker, token):
    ok = job_tasks.add.enqueue(token, 2, b=3)
    done(ok, worker)

    response = operator.get(f"{API}/jobs/{ok.id}/")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == int(ok.id) and body["task"] == "tests.job_tasks.add"
    assert (body["backend"], body["queue_name"], body["priority"]) == ("default", "default", 0)
    assert (body["status"], body["buried"], body["run_status"]) == (
        "SUCCESSFUL", False, "completed")
    assert (body["args"], body["kwargs"], body["return_value"]) == ([token, 2], {"b": 3}, 5)
    assert body["errors"] == [] and body["attempts"] == 1 and len(body["worker_ids"]) == 1
    assert None not in (body["enqueued_at"], body["started_at"], body["last_attempted_at"],
                        body["finished_at"])
    assert body["url"] == f"http://testserver{API}/jobs/{ok.id}/"
    assert body["run_url"] == f"http://testserver{API}/runs/{ok.id}/"
    assert operator.get(body["run_url"]).json()["name"] == "task:tests.job_tasks.add"


def test_get_job__a_failed_job_has_its_errors_and_no_return_value(operator, worker, token):
    bad = job_tasks.fails.enqueue(token)
    done(bad, worker)

    body = operator.get(f"{API}/jobs/{bad.id}/").json()

    assert (body["status"], body["buried"]) == ("FAILED", True) and "return_value" not in body
    [error] = body["errors"]
    assert error["exception_class_path"] == "builtins.ValueError"
    assert f"fails was told to fail ({token})" in error["traceback"]


def test_get_job__a_workflow_run_or_unknown_id_is_a_404_naming_it(operator, worker, token):
    run_id = queuety.workflow("jobs_api_not_a_job").then(workflows.step_a).dispatch(
        {"token": token})

    for job_id in (run_id, 987654321):
        response = operator.get(f"{API}/jobs/{job_id}/")
        assert response.status_code == 404
        assert response.json()["code"] == "job_not_found"
        assert response.json()["detail"].startswith(
            f"Job {job_id} does not exist: no run with that id is a task's job.")
    assert operator.get(f"{API}/jobs/abc/").json()["code"] == "not_found"


def test_list_jobs__filters_newest_first_and_pages(operator, worker, token):
    ok = job_tasks.add.enqueue(token, 1, b=1)
    bad = job_tasks.fails.enqueue(token)
    waiting = job_tasks.never_consumed.enqueue(token)
    workflow_run = queuety.workflow("jobs_api_not_a_job").then(workflows.step_a).dispatch(
        {"token": token})
    done(ok, worker), done(bad, worker)

    def ids(**params):
        response = operator.get(f"{API}/jobs/", {"page_size": 200, **params})
        assert response.status_code == 200, response.json()
        return [job["id"] for job in response.json()["results"] if job["args"][:1] == [token]]

    assert ids() == [int(waiting.id), int(bad.id), int(ok.id)]
    assert workflow_run not in [job["id"] for job in operator.get(
        f"{API}/jobs/", {"page_size": 200}).json()["results"]]
    assert ids(task="tests.job_tasks.add") == [int(ok.id)]
    assert ids(status="buried") == [int(bad.id)] and ids(status="FAILED") == [int(bad.id)]
    assert ids(status="SUCCESSFUL") == [int(ok.id)]
    assert ids(status="READY", queue_name="unconsumed") == [int(waiting.id)]
    first = operator.get(f"{API}/jobs/", {"page_size": 1}).json()
    assert len(first["results"]) == 1 and first["next"]
    second = operator.get(first["next"]).json()
    assert second["results"][0]["id"] < first["results"][0]["id"]

    response = operator.get(f"{API}/jobs/", {"status": "done"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_filter"
    assert "Unknown job status 'done'" in response.json()["detail"]
    operator.post(f"{API}/jobs/{waiting.id}/cancel/")


def test_retry__a_buried_job_runs_again_and_a_finished_one_is_a_409(operator, worker, token):
    job = job_tasks.attempts.enqueue(token, fail_times=1)
    done(job, worker)

    response = operator.post(f"{API}/jobs/{job.id}/retry/")

    assert response.status_code == 200
    assert response.json()["buried"] is False
    assert response.json()["status"] in ("READY", "RUNNING", "SUCCESSFUL")
    done(job, worker, statuses=("completed",))
    body = operator.get(f"{API}/jobs/{job.id}/").json()
    assert (body["status"], body["attempts"], body["return_value"]["attempt"]) == (
        "SUCCESSFUL", 2, 2)
    [retried] = Event.objects.filter(run_id=int(job.id), kind="workflow_retried")
    assert retried.data["by"].startswith("api:user:")
    again = operator.post(f"{API}/jobs/{job.id}/retry/")
    assert again.status_code == 409 and again.json()["code"] == "invalid_transition"
    assert again.json()["detail"].startswith(f"Cannot retry job {job.id}: it is SUCCESSFUL")
    assert len(marks(token)) == 2


def test_cancel__an_unfinished_job_and_a_second_cancel_is_a_409(operator, worker, token):
    waiting = job_tasks.never_consumed.enqueue(token)

    response = operator.post(f"{API}/jobs/{waiting.id}/cancel/", HTTP_IDEMPOTENCY_KEY=token)
    replay = operator.post(f"{API}/jobs/{waiting.id}/cancel/", HTTP_IDEMPOTENCY_KEY=token)

    assert response.status_code == 200
    assert (response.json()["status"], response.json()["run_status"]) == ("FAILED", "cancelled")
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    second = operator.post(f"{API}/jobs/{waiting.id}/cancel/")
    assert second.status_code == 409
    assert second.json()["detail"] == (f"Cannot cancel job {waiting.id}: it is already "
                                       "cancelled. Purge it to delete it.")
    run_id = queuety.workflow("jobs_api_not_a_job").then(workflows.step_a).dispatch(
        {"token": token})
    not_a_job = operator.post(f"{API}/jobs/{run_id}/cancel/")
    assert not_a_job.status_code == 404 and not_a_job.json()["code"] == "job_not_found"
    assert queuety.workflow_status(run_id).status != "cancelled"


def test_permissions__model_permissions_run_scope_and_run_access(worker, token):
    mine = job_tasks.never_consumed.enqueue(token)
    theirs = job_tasks.never_consumed.enqueue(f"{token}-other")
    anonymous, viewer = APIClient(), client_of("view_workflowrun")

    assert anonymous.get(f"{API}/jobs/").status_code == 403
    assert anonymous.get(f"{API}/jobs/{mine.id}/").status_code == 403
    assert viewer.get(f"{API}/jobs/{mine.id}/").status_code == 200
    for action in ("retry", "cancel"):
        assert viewer.post(f"{API}/jobs/{mine.id}/{action}/").status_code == 403
    assert client_of().get(f"{API}/jobs/").status_code == 403  # no view permission

    scoped = {**TEST_QUEUETY, "RUN_SCOPE": "tests.integration.test_jobs_api.job_scope"}
    tenant = client_of("view_workflowrun", "change_workflowrun", last_name=token)
    with override_settings(QUEUETY=scoped):
        listed = tenant.get(f"{API}/jobs/", {"page_size": 200}).json()["results"]
        assert [job["id"] for job in listed] == [int(mine.id)]
        hidden = tenant.get(f"{API}/jobs/{theirs.id}/")
        assert hidden.status_code == 404 and hidden.json()["code"] == "job_not_found"
        assert tenant.post(f"{API}/jobs/{theirs.id}/cancel/").status_code == 404
    with override_settings(QUEUETY={**scoped, "RUN_ACCESS": "tests.workflows.deny_all"}):
        assert tenant.get(f"{API}/jobs/{mine.id}/").status_code == 403
        assert tenant.post(f"{API}/jobs/{mine.id}/cancel/").status_code == 403
        assert tenant.get(f"{API}/jobs/").json()["results"] == []
    assert queuety.workflow_status(int(theirs.id)).status == "running"
    assert queuety.workflow_status(int(mine.id)).status == "running"
    for job in (mine, theirs):
        client_of("view_workflowrun", "change_workflowrun").post(
            f"{API}/jobs/{job.id}/cancel/")


def test_openapi_schema__describes_the_job_endpoints(operator):
    schema = operator.get(f"{API}/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    paths = schema.json()["paths"]
    assert {"/queuety/api/jobs/", "/queuety/api/jobs/{id}/", "/queuety/api/jobs/{id}/retry/",
            "/queuety/api/jobs/{id}/cancel/"} <= set(paths)
    assert paths["/queuety/api/jobs/"]["get"]["operationId"] == "jobs_list"
    job = schema.json()["components"]["schemas"]["Job"]
    assert {"id", "task", "status", "buried", "errors", "worker_ids", "run_url"} <= \
        set(job["properties"])
