"""The admin's jobs list: Django tasks run by Queuety, on PostgreSQL and the session's real
worker, through Django's test client (filters, result and error columns, the link to the run
page, the retry and cancel actions, permissions and RUN_SCOPE)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.utils import timezone

import queuety
from queuety.models import Job, RunStatus, WorkflowRun
from tests import job_tasks, workflows
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.worker

JOBS = "/admin/queuety/job/"


def make_user(*perms: str, superuser: bool = False, last_name: str = "") -> User:
    user = User.objects.create_user(f"j{uuid.uuid4().hex[:10]}", password="pw", is_staff=True,
                                    is_superuser=superuser, last_name=last_name)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)  # fresh permission cache


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def first_argument_scope(user, runs):
    """A RUN_SCOPE for jobs: a user's tenant is their last name, a job's its first argument."""
    return runs.filter(state__args__0=user.last_name)


def listed(response) -> str:
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def run_later(task, *args, **kwargs) -> int:
    """A job due in an hour: it stays READY for the length of a test."""
    return int(task.using(run_after=timezone.now() + timedelta(hours=1))
               .enqueue(*args, **kwargs).id)


def test_the_jobs_list__shows_jobs_only_with_their_results_and_errors(worker, token):
    done = int(job_tasks.add.enqueue(token, 20, b=22).id)
    failed = int(job_tasks.fails.enqueue(token).id)
    waiting = run_later(job_tasks.add, token, 1, b=1)
    workflow_run = (queuety.workflow("not_a_job").then(workflows.step_a)
                    .dispatch({"token": token}))
    for run_id in (done, failed, workflow_run):
        wait_for(run_id, worker=worker)

    page = listed(client_for(make_user(superuser=True)).get(JOBS))

    for run_id in (done, failed, waiting):
        # Each row links to the run's page, the job's page.
        assert f'href="/admin/queuety/workflowrun/{run_id}/change/"' in page
    assert f'href="/admin/queuety/workflowrun/{workflow_run}/change/"' not in page
    assert "tests.job_tasks.add" in page and "tests.job_tasks.fails" in page
    assert "<code>42</code>" in page  # the return value
    assert f"ValueError: fails was told to fail ({token})" in page
    assert "SUCCESSFUL" in page and "FAILED (buried)" in page and "READY" in page
    assert set(Job.objects.values_list("name", flat=True)) <= {
        n for n in WorkflowRun.objects.values_list("name", flat=True) if n.startswith("task:")}
    queuety.cancel(waiting)


def test_filters__by_task_status_and_queue(worker, token):
    done = int(job_tasks.add.enqueue(token, 1, b=2).id)
    failed = int(job_tasks.fails.enqueue(token).id)
    for run_id in (done, failed):
        wait_for(run_id, worker=worker)
    ready = run_later(job_tasks.never_consumed, token)
    cancelled = run_later(job_tasks.add, token, 5, b=5)
    queuety.cancel(cancelled)
    client = client_for(make_user(superuser=True))

    def ids(**query) -> set[int]:
        page = listed(client.get(JOBS, query))
        return {pk for pk in (done, failed, ready, cancelled)
                if f"/admin/queuety/workflowrun/{pk}/change/" in page}

    assert ids(task="tests.job_tasks.fails") == {failed}
    assert ids(task_status="SUCCESSFUL") == {done}
    assert ids(task_status="FAILED") == {failed, cancelled}
    assert ids(task_status="buried") == {failed}
    assert ids(task_status="cancelled") == {cancelled}
    assert ids(task_status="READY") == {ready}
    assert ids(queue="unconsumed") == {ready}
    assert ids(queue="default") == {done, failed, cancelled}
    assert ids(q=str(failed)) == {failed}
    page = listed(client.get(JOBS))
    assert "unconsumed" in page and "tests.job_tasks.never_consumed" in page
    queuety.cancel(ready)


def test_a_jobs_page__is_its_runs_page(worker, token):
    job_id = run_later(job_tasks.add, token, 1, b=1)
    response = client_for(make_user(superuser=True)).get(f"{JOBS}{job_id}/change/")
    assert response.status_code == 302
    assert response["Location"] == f"/admin/queuety/workflowrun/{job_id}/change/"
    queuety.cancel(job_id)


def test_retry_selected__runs_a_buried_job_again(worker, token):
    job_id = int(job_tasks.fails.enqueue(token).id)
    wait_for(job_id, worker=worker)
    operator = make_user("view_workflowrun", "change_workflowrun")

    response = client_for(operator).post(JOBS, {
        "action": "retry_selected", "_selected_action": [job_id]}, follow=True)

    assert f"Job {job_id} was scheduled for retry." in listed(response)
    # It ran again on the worker, and failed again (the task always fails).
    assert wait_for(job_id, statuses=("failed",), worker=worker)
    assert len(workflows.marks(token)) == 2
    kinds = [e["kind"] for e in queuety.workflow_timeline(job_id)]
    assert kinds.count("workflow_failed") == 2


def test_cancel_selected__cancels_and_reports_what_it_could_not(worker, token):
    waiting = run_later(job_tasks.add, token, 1, b=1)
    done = int(job_tasks.add.enqueue(token, 1, b=1).id)
    wait_for(done, worker=worker)
    operator = make_user("view_workflowrun", "change_workflowrun")

    page = listed(client_for(operator).post(JOBS, {
        "action": "cancel_selected", "_selected_action": [waiting, done]}, follow=True))

    assert f"Job {waiting} was cancelled." in page
    assert "1 job was left as it was:" in page and str(done) in page
    assert WorkflowRun.objects.get(pk=waiting).status == RunStatus.CANCELLED
    assert WorkflowRun.objects.get(pk=done).status == RunStatus.COMPLETED


def test_permissions__are_the_runs(worker, token):
    job_id = run_later(job_tasks.add, token, 1, b=1)
    assert client_for(make_user()).get(JOBS).status_code == 403
    viewer = make_user("view_workflowrun")
    page = listed(client_for(viewer).get(JOBS))
    assert "retry_selected" not in page and "cancel_selected" not in page
    # Posting the action anyway is refused: the job is left as it was.
    client_for(viewer).post(JOBS, {"action": "cancel_selected",
                                   "_selected_action": [job_id]})
    assert WorkflowRun.objects.get(pk=job_id).status == RunStatus.RUNNING
    assert "cancel_selected" in listed(client_for(
        make_user("view_workflowrun", "change_workflowrun")).get(JOBS))
    queuety.cancel(job_id)


def test_run_scope__narrows_the_jobs_list_and_its_actions(worker, token):
    other = uuid.uuid4().hex[:12]
    mine = run_later(job_tasks.add, token, 1, b=1)
    theirs = run_later(job_tasks.add, other, 1, b=1)
    user = make_user("view_workflowrun", "change_workflowrun", last_name=token)
    scope = f"{__name__}.first_argument_scope"
    from django.conf import settings

    with override_settings(QUEUETY={**settings.QUEUETY, "RUN_SCOPE": scope}):
        client = client_for(user)
        page = listed(client.get(JOBS))
        assert f"/workflowrun/{mine}/change/" in page
        assert f"/workflowrun/{theirs}/change/" not in page
        client.post(JOBS, {"action": "cancel_selected", "_selected_action": [mine, theirs]})
    assert WorkflowRun.objects.get(pk=mine).status == RunStatus.CANCELLED
    assert WorkflowRun.objects.get(pk=theirs).status == RunStatus.RUNNING
    queuety.cancel(theirs)
