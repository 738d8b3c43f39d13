"""Queue operations (issue #32 part 3): pause, resume and drain a Celery queue; its numbers;
the REST endpoints, the CLI and the admin page. On PostgreSQL with real worker processes."""

from __future__ import annotations

import json
import threading
import time
import uuid
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

import queuety
from queuety import queues
from queuety.models import QueuePause, StepRun
from queuety.runtime import paused
from queuety.store import pauses
from tests import workflows
from tests.integration.conftest import Worker, wait_for

pytestmark = pytest.mark.worker

API = "/queuety/api"
PAGE = "/admin/queuety/queuepause/"
#: One queue per test, all consumed by the module's worker node (``-Q a,b,...``).
QUEUES = {key: f"q{key}-{uuid.uuid4().hex[:8]}" for key in
          ("held", "other", "late", "inline", "drain", "rest", "cli", "admin", "group",
           "fanout")}


@pytest.fixture(scope="module")
def node(worker, tmp_path_factory):
    """A worker node (``-c 2``) consuming this module's queues."""
    handle = Worker(tmp_path_factory.mktemp("queues"), queue=",".join(QUEUES.values()),
                    beat=False, concurrency=2)
    handle.start()
    yield handle
    handle.stop()
    QueuePause.objects.filter(queue__in=QUEUES.values()).delete()


def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {timeout}s waiting for {what}.")
        time.sleep(0.05)


def _held(run_id: int) -> bool:
    return (queuety.workflow_status(run_id).throttled_by or {}).get("reason") == "queue paused"


def _stats(name: str) -> queues.QueueStats:
    return queues.queue_stats([name])[0]


def test_a_paused_queue_holds_its_steps_without_attempts_and_resume_starts_them(node, token):
    held, other = QUEUES["held"], QUEUES["other"]
    queuety.pause_queue(held, actor="test", reason="maintenance")
    flow = queuety.workflow("q_held").on_queue(held).then(workflows.step_a).then(
        workflows.step_b)
    run_ids = [flow.dispatch({"token": f"{token}-{i}"}) for i in range(3)]
    for run_id in run_ids:
        _until(lambda run_id=run_id: _held(run_id), 20, f"run {run_id} to be held")
    # Another queue is not affected.
    elsewhere = (queuety.workflow("q_other").on_queue(other).then(workflows.step_a)
                 .dispatch({"token": f"{token}-other"}))
    assert wait_for(elsewhere, timeout=20, worker=node).status == "completed"

    status = queuety.workflow_status(run_ids[0])
    assert status.status == "running"
    assert status.throttled_by["queue"] == held and status.throttled_by["group"] is None
    rows = StepRun.objects.filter(run_id__in=run_ids)
    assert [(row.status, row.attempt) for row in rows] == [("throttled", 0)] * 3
    assert all(workflows.marks(f"{token}-{i}-a") == [] for i in range(3))
    stats = _stats(held)
    assert (stats.paused, stats.reason, stats.paused_by) == (True, "maintenance", "test")
    assert (stats.waiting, stats.running, stats.finished) == (3, 0, 0)
    assert stats.oldest_wait is not None and stats.oldest_wait > 0

    assert queuety.resume_queue(held) == 3
    for run_id in run_ids:
        assert wait_for(run_id, timeout=30, worker=node).status == "completed"
    assert all(row.attempt == 1 for row in StepRun.objects.filter(run_id__in=run_ids))
    stats = _stats(held)
    # Two steps finished per run in the last 5 minutes: 6, that is 1.2 a minute.
    assert (stats.paused, stats.waiting, stats.running) == (False, 0, 0)
    assert (stats.finished, stats.throughput) == (6, 1.2)
    assert queuety.resume_queue(held) == 0  # safe to repeat


def test_a_step_published_before_the_pause_does_not_start_and_burns_no_attempt(node, token):
    late = QUEUES["late"]
    policy = queuety.RetryPolicy(max_attempts=3, initial_delay=2, jitter=0,
                                 retry_on=[ValueError])
    run_id = (queuety.workflow("q_late").on_queue(late).then(workflows.flaky, retry=policy)
              .dispatch({"token": token, "raise": "builtins.ValueError", "fail_times": 1}))
    _until(lambda: len(workflows.marks(f"{token}-flaky")) == 1, 20, "the first attempt")
    # Its retry is due in 2 s, already on its way; the queue is paused meanwhile.
    queuety.pause_queue(late)
    _until(lambda: _held(run_id), 20, "the retry to be held")
    row = StepRun.objects.get(run_id=run_id)
    assert (row.status, row.attempt) == ("throttled", 1)
    time.sleep(1)
    assert len(workflows.marks(f"{token}-flaky")) == 1

    queuety.resume_queue(late)
    assert wait_for(run_id, timeout=30, worker=node).status == "completed"
    assert StepRun.objects.get(run_id=run_id).attempt == 2
    assert len(workflows.marks(f"{token}-flaky")) == 2


def test_a_step_the_worker_would_continue_inline_is_held_too(node, token):
    inline = QUEUES["inline"]
    # The slow step ends within INLINE_SECONDS of its start: its worker would run the next
    # step (same queue) in the same process, with no message and no claim of its own.
    flow = queuety.workflow("q_inline").on_queue(inline).then(workflows.slow).then(
        workflows.step_a)
    # Unpaused, the next step does run inline: in the slow step's process (the marks' pids).
    control = flow.dispatch({"token": f"{token}-c", "sleep": 0.6})
    assert wait_for(control, timeout=20, worker=node).status == "completed"
    assert (workflows.marks(f"{token}-c-slow")[0].split()[0]
            == workflows.marks(f"{token}-c-a")[0].split()[0])
    run_id = flow.dispatch({"token": token, "sleep": 0.6})
    _until(lambda: workflows.marks(f"{token}-slow"), 20, "the slow step to start")
    queuety.pause_queue(inline)
    _until(lambda: _held(run_id), 20, "the next step to be held")
    time.sleep(0.5)
    assert workflows.marks(f"{token}-a") == []
    row = StepRun.objects.get(run_id=run_id, step_name="step_a")
    assert (row.status, row.attempt) == ("throttled", 0)
    queuety.resume_queue(inline)
    assert wait_for(run_id, timeout=20, worker=node).status == "completed"
    assert len(workflows.marks(f"{token}-a")) == 1


def test_drain_pauses_and_returns_when_the_running_steps_end(node, token):
    drain = QUEUES["drain"]
    run_id = (queuety.workflow("q_drain").on_queue(drain).then(workflows.slow)
              .dispatch({"token": token, "sleep": 2}))
    _until(lambda: _stats(drain).running == 1, 20, "the slow step to run")
    assert queues.drain_queue(drain, timeout=0.2, poll=0.05) is False
    assert _stats(drain).paused
    started = time.monotonic()
    assert queues.drain_queue(drain, timeout=30, poll=0.05) is True
    assert time.monotonic() - started < 5
    assert queuety.workflow_status(run_id).status == "completed"
    assert _stats(drain).running == 0
    queuety.resume_queue(drain)


def _user(*perms: str, staff: bool = False) -> User:
    user = User.objects.create_user(f"u{uuid.uuid4().hex[:10]}", password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename,
                                                         content_type__app_label="queuety"))
    return User.objects.get(pk=user.pk)


def _client(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_rest_lists_queues_and_pausing_needs_the_change_permission(node, token):
    name = QUEUES["rest"]
    viewer = _client(_user("view_workflowrun"))
    operator = _client(_user("view_workflowrun", "change_workflowrun"))
    assert APIClient().get(f"{API}/queues/").status_code == 403
    refused = viewer.post(f"{API}/queues/{name}/pause/")
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    assert not QueuePause.objects.filter(queue=name).exists()

    paused = operator.post(f"{API}/queues/{name}/pause/")
    assert paused.status_code == 200
    assert paused.json()["queue"]["paused"] is True and paused.json()["released"] == 0
    run_id = (queuety.workflow("q_rest").on_queue(name).then(workflows.step_a)
              .dispatch({"token": token}))
    _until(lambda: _held(run_id), 20, "the step to be held")
    listed = {item["name"]: item for item in viewer.get(f"{API}/queues/").json()}
    assert listed[name]["paused"] is True and listed[name]["waiting"] == 1
    assert viewer.post(f"{API}/queues/{name}/resume/").status_code == 403
    resumed = operator.post(f"{API}/queues/{name}/resume/")
    assert resumed.status_code == 200 and resumed.json()["released"] == 1
    assert resumed.json()["queue"]["paused"] is False
    assert wait_for(run_id, timeout=20, worker=node).status == "completed"
    too_long = operator.post(f"{API}/queues/{'x' * 256}/pause/")
    assert too_long.status_code == 400 and "255" in too_long.json()["detail"]


def _cli(*args: str) -> str:
    out = StringIO()
    call_command("queuety", "queue", *args, stdout=out)
    return out.getvalue()


def test_cli_pauses_lists_drains_and_resumes(node, token):
    name = QUEUES["cli"]
    assert "is paused (0 waiting, 0 running)" in _cli("pause", name, "--reason", "deploy")
    run_id = (queuety.workflow("q_cli").on_queue(name).then(workflows.step_a)
              .dispatch({"token": token}))
    _until(lambda: _held(run_id), 20, "the step to be held")
    listed = {item["name"]: item for item in json.loads(_cli("list", "--format", "json"))}
    assert listed[name]["paused"] and listed[name]["reason"] == "deploy"
    assert listed[name]["waiting"] == 1
    table = _cli("stats")
    assert "OLDEST WAIT" in table and any(
        line.split()[:4] == [name, "paused", "1", "0"] for line in table.splitlines())
    assert "is drained" in _cli("drain", name, "--timeout", "5")
    assert "1 held step(s) released" in _cli("resume", name)
    assert wait_for(run_id, timeout=20, worker=node).status == "completed"
    with pytest.raises(CommandError, match="--timeout must be"):
        _cli("drain", name, "--timeout", "-1")


def test_the_admin_page_lists_queues_and_pauses_and_resumes_them(node, admin_client, token):
    name = QUEUES["admin"]
    index = admin_client.get("/admin/queuety/").content.decode()
    assert PAGE in index
    response = admin_client.post(PAGE, {"queue": name, "action": "pause", "reason": "audit"})
    assert response.status_code == 302
    assert QueuePause.objects.get(queue=name).reason == "audit"
    run_id = (queuety.workflow("q_admin").on_queue(name).then(workflows.step_a)
              .dispatch({"token": token}))
    _until(lambda: _held(run_id), 20, "the step to be held")
    page = admin_client.get(PAGE).content.decode()
    assert f"<code>{name}</code>" in page and 'value="resume"' in page and "audit" in page
    admin_client.post(PAGE, {"queue": name, "action": "resume"})
    assert not QueuePause.objects.filter(queue=name).exists()
    assert wait_for(run_id, timeout=20, worker=node).status == "completed"
    viewer = _user("view_workflowrun", staff=True)
    admin_client.force_login(viewer)
    assert admin_client.get(PAGE).status_code == 200
    assert admin_client.post(PAGE, {"queue": name, "action": "pause"}).status_code == 403


def test_a_grouped_step_handed_off_on_a_paused_queue_is_held_not_started(node, token):
    name, group = QUEUES["group"], f"qg-{uuid.uuid4().hex[:8]}"
    flow = queuety.workflow("q_group").on_queue(name).then(
        workflows.slow, concurrency_group=group, concurrency_limit=1)
    # Each ends within INLINE_SECONDS (1 s) of its start: the one running when the other
    # waits for the group's slot is handed that one (direct hand-off, the same process).
    tokens = {flow.dispatch({"token": f"{token}-{i}", "sleep": 0.7}): f"{token}-{i}"
              for i in (1, 2)}
    rows = StepRun.objects.filter(run_id__in=tokens)
    _until(lambda: rows.filter(status="throttled").exists(), 20, "a step to wait for the group")
    queuety.pause_queue(name)
    # The pause holds the handed-off step too, so the drain ends with it unstarted.
    assert queues.drain_queue(name, timeout=20, poll=0.05) is True
    _until(lambda: any(_held(run_id) for run_id in tokens), 20, "the handed-off step held")
    time.sleep(0.5)
    ran = [run_id for run_id, mark in tokens.items() if workflows.marks(f"{mark}-slow")]
    assert len(ran) == 1 and queuety.workflow_status(ran[0]).status == "completed"
    (waiting,) = set(tokens) - set(ran)
    assert _held(waiting) and StepRun.objects.get(run_id=waiting).attempt == 0
    assert queuety.resume_queue(name) == 1
    assert wait_for(waiting, timeout=20, worker=node).status == "completed"


def test_held_fan_out_items_keep_their_max_concurrency_slots(node, token):
    name = QUEUES["fanout"]
    tasks = [{"id": 0, "sleep": 0.8}, {"id": 1, "sleep": 2.5}] + [{"id": i} for i in range(2, 6)]
    run_id = (queuety.workflow("q_fanout").on_queue(name)
              .for_each("tasks", workflows.run_task, max_concurrency=2, name="fan")
              .dispatch({"token": token, "tasks": tasks}))
    _until(lambda: len(workflows.marks(f"{token}-item")) == 2, 20, "two items to start")
    queuety.pause_queue(name)
    items = StepRun.objects.filter(run_id=run_id)
    # Item 0 ends: item 2 takes its slot, and the pause holds it (throttled). Item 1 ends:
    # one slot is free, not two.
    _until(lambda: items.filter(status="completed").count() == 2
           and not items.filter(status__in=("pending", "processing")).exists(), 20,
           "the two items to end and the released ones to be held")
    time.sleep(0.3)
    assert sorted(items.exclude(status="completed").values_list("status", flat=True)) == \
        ["held", "held", "throttled", "throttled"]
    queuety.resume_queue(name)
    assert wait_for(run_id, timeout=30, worker=node).status == "completed"
    # The throughput counts the items' endings too: 6 items and the join's step.
    assert _stats(name).finished == 7


def _idle_row(token: str) -> tuple[str, int]:
    """A due pending step row on a queue no worker consumes, and that queue."""
    idle = f"qidle-{uuid.uuid4().hex[:8]}"
    run_id = (queuety.workflow("q_idle").on_queue(idle).then(workflows.step_a)
              .dispatch({"token": token}))
    return idle, StepRun.objects.get(run_id=run_id).pk


def test_a_resume_waits_for_a_hold_in_flight(no_sweeps, token):
    idle, pk = _idle_row(token)
    queuety.pause_queue(idle)
    holding, finish = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                assert pauses.hold_paused(pk, idle, timezone.now())
                holding.set()
                finish.wait(10)
        finally:
            connection.close()

    released: list[int] = []

    def resume():
        try:
            released.append(queuety.resume_queue(idle))
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    resumer = threading.Thread(target=resume)
    try:
        assert holding.wait(10)
        resumer.start()
        time.sleep(0.5)
        # The hold read the pause FOR KEY SHARE: the resume's delete waits for it to commit,
        # then finds the row it held (else it would release nothing, the row left held).
        assert resumer.is_alive() and released == []
    finally:
        finish.set()
        holder.join(10)
        if resumer.is_alive() or resumer.ident:
            resumer.join(10)
    assert released == [1]
    assert StepRun.objects.get(pk=pk).status == "pending"


def test_the_sweeper_releases_rows_whose_pause_is_gone(no_sweeps, token):
    idle, pk = _idle_row(token)
    other, kept = _idle_row(f"{token}-kept")
    queuety.pause_queue(idle)
    queuety.pause_queue(other)
    assert pauses.hold_paused(pk, idle, timezone.now())
    assert pauses.hold_paused(kept, other, timezone.now())
    # A resume killed after it deleted the pause: the row stays held, its queue active.
    QueuePause.objects.filter(queue=idle).delete()
    assert paused.release_orphans(timezone.now()) == 1
    row = StepRun.objects.get(pk=pk)
    assert (row.status, row.throttled_by, row.attempt) == ("pending", None, 0)
    assert StepRun.objects.get(pk=kept).status == "throttled"  # its queue is still paused
    assert paused.release_orphans(timezone.now()) == 0
    queuety.resume_queue(other)


def test_a_resume_publishes_rows_whose_definition_does_not_load(no_sweeps, token):
    from queuety import publish
    from queuety.models import WorkflowDefinition, WorkflowRun

    idle, pk = _idle_row(token)
    definition = StepRun.objects.get(pk=pk).run.definition
    # A definition that no longer loads here (a retry_on class a deploy removed).
    ghost = WorkflowDefinition.objects.create(
        name="q_ghost", definition_hash=uuid.uuid4().hex * 2,
        definition=dict(definition.definition, retry={
            "max_attempts": 1, "initial_delay": 1.0, "backoff_factor": 2.0, "max_delay": 60.0,
            "jitter": 0.0, "retry_on": ["gone.Module"]}))
    run = WorkflowRun.objects.create(definition=ghost, name="q_ghost", total_steps=1,
                                     state={"token": token})
    row = StepRun.objects.create(run=run, seq=0, step_index=0, step_name="step_a",
                                 status="pending", available_at=timezone.now())
    queuety.pause_queue(idle)
    assert pauses.hold_paused(row.pk, idle, timezone.now())
    assert pauses.hold_paused(pk, idle, timezone.now())
    sent: list[publish.Message] = []
    with publish.redirected(sent.extend):
        assert queuety.resume_queue(idle) == 2
    # Nothing blocks: the healthy row's message as usual, the ghost's on the queue its hold
    # recorded (its claim then fails it, as any claim of it would).
    assert sorted((m.step_run_id, m.queue) for m in sent) == sorted([(pk, idle), (row.pk, idle)])
    assert set(StepRun.objects.filter(pk__in=[pk, row.pk]).values_list("status", flat=True)) \
        == {"pending"}
    StepRun.objects.filter(run=run).delete()
    run.delete()
    ghost.delete()


def test_rest_warns_when_pausing_an_unknown_queue_and_hides_paused_by(node):
    operator = _client(_user("view_workflowrun", "change_workflowrun"))
    viewer = _client(_user("view_workflowrun"))
    unknown = f"qnew-{uuid.uuid4().hex[:8]}"
    try:
        answer = operator.post(f"{API}/queues/{unknown}/pause/").json()
        assert unknown in answer["warning"] and answer["queue"]["paused"] is True
        assert answer["queue"]["paused_by"].startswith("api:user:")
        again = operator.post(f"{API}/queues/{unknown}/pause/").json()
        assert again["warning"] == ""  # paused now: a known queue
        listed = {item["name"]: item for item in viewer.get(f"{API}/queues/").json()}
        assert listed[unknown]["paused"] is True and listed[unknown]["paused_by"] == ""
    finally:
        queuety.resume_queue(unknown)


def test_stats_leave_out_pending_steps_of_a_paused_run(no_sweeps, token):
    idle, pk = _idle_row(token)
    run_id = StepRun.objects.get(pk=pk).run_id
    assert _stats(idle).waiting == 1
    queuety.pause(run_id)
    # No claim takes a paused run's step: it is not waiting on its queue.
    assert (_stats(idle).waiting, _stats(idle).oldest_wait) == (0, None)
    queuety.cancel(run_id)
