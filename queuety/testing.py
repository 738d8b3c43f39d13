"""Run workflows to their end inside a test: no broker, no worker, the test database.

Each step runs in the test's own process through the very code a worker runs
(``queuety.runtime.attempt.execute_step``: the claim, the handler, the one-transaction
outcome, inline continuation), so a test sees what production would record. Retries' back-offs
and ``delay()`` steps are not waited for: a pending row is made due, then executed. Messages
and wake-ups that would go to Celery are kept in-process instead (``queuety.publish``'s seams).

With pytest-django::

    from queuety.testing import run_workflow

    def test_order_is_charged(db):
        run = run_workflow("order_fulfilment", {"order_id": 7, "items": [...]})
        run.assert_status("completed")
        assert run.state["charge_id"] == "ch_7_2500"

    def test_refund_needs_approval(db):
        run = run_workflow("refund", {"order_id": 7})
        run.assert_status("waiting_for_signal")
        run.approve({"by": "ada"})          # answered, then driven on to the end
        run.assert_status("completed")
        run.assert_events("workflow_started", "signal_received", "workflow_completed")

What runs: every step row of this run and of the runs it starts (child runs, started
workflows), and runs woken because a run they wait for finished. What does not: the sweeper's
own phases (a lost worker, ``must_complete_within`` deadlines, purges).

Tasks of Django's tasks framework on ``queuety.tasks_backend.QueuetyBackend`` run the same
way: :func:`run_task` enqueues a task's job and runs it to its end, returning the framework's
``TaskResult``; :func:`run_jobs` runs the jobs the code under test enqueued::

    from queuety.testing import no_broker, run_jobs, run_task

    def test_receipt(db):
        result = run_task(send_receipt, 42)
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "sent"

    def test_checkout_sends_a_receipt(db):
        with no_broker():
            checkout(order)                 # calls send_receipt.enqueue(order.pk)
        [receipt] = run_jobs()
        assert receipt.return_value == "sent"
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import Q
from django.utils import timezone

from queuety import dispatch, inbox, publish, queries, registry, signals
from queuety import timeline as timelines
from queuety.core.builder import WorkflowBuilder
from queuety.core.status import RunStatus, StepStatus, WorkflowStatus
from queuety.models import StepRun, WorkflowRun
from queuety.runtime import attempt, expiry, settle

#: Step attempts one drive may run before it gives up (a loop that never ends).
MAX_STEPS = 1000


class WorkflowDidNotSettle(AssertionError):
    """The run still had work after ``max_steps`` step attempts (a repeat that never ends?)."""


class TestRun:
    """A run started by :func:`run_workflow`: its status, state and timeline, and the
    signals and replies a test sends it (each followed by driving the run on)."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, run_id: int, max_steps: int = MAX_STEPS) -> None:
        self.id = run_id
        self.max_steps = max_steps

    @property
    def info(self) -> WorkflowStatus:
        """The run's status, read now (``queuety.workflow_status``)."""
        return queries.workflow_status(self.id)

    @property
    def status(self) -> str:
        """``completed``, ``failed``, ``waiting_for_signal``, ..."""
        return str(self.info.status)

    @property
    def state(self) -> dict[str, Any]:
        """The run's public state."""
        return self.info.state

    @property
    def error(self) -> dict[str, Any] | None:
        """The error that failed the run, if it failed."""
        return self.info.error

    def timeline(self) -> list[dict[str, Any]]:
        """Every event of the run, oldest first (``queuety.workflow_timeline``)."""
        return timelines.timeline(self.id, limit=10_000)

    def events(self) -> list[str]:
        """The kinds of the run's events, oldest first."""
        return [event["kind"] for event in self.timeline()]

    def assert_status(self, expected: str) -> None:
        """Fail the test, saying where the run stands and why, unless its status is
        ``expected``."""
        info = self.info
        if info.status != expected:
            raise AssertionError(
                f"Run {self.id} of workflow {info.name!r} is {info.status!r} at step "
                f"{info.current_step} ({info.current_step_name!r}), not {expected!r}. "
                f"Error: {info.error!r}. Events: {', '.join(self.events())}.")

    def assert_events(self, *kinds: str) -> None:
        """Fail the test unless the run's timeline holds these event kinds in this order
        (other events may come between them)."""
        seen = self.events()
        remaining = iter(seen)
        missing = [kind for kind in kinds if kind not in remaining]
        if missing:
            raise AssertionError(
                f"Run {self.id}'s timeline has no {missing[0]!r} after the events before it "
                f"in {list(kinds)!r}; its events are: {', '.join(seen)}.")

    def expire_wait(self) -> TestRun:
        """Let the timeout of the wait the run is parked at pass, as the sweeper would once
        its ``expires_at`` came (the test helper runs no sweeper), then drive the run on.

        Raises:
            AssertionError: the run is not parked at a wait with a timeout.
        """
        expires_at = WorkflowRun.objects.values_list("wait_expires_at", flat=True).get(
            pk=self.id)
        if expires_at is None:
            raise AssertionError(f"Run {self.id} is {self.status!r}, not parked at a wait with "
                                 "a timeout; there is nothing to expire.")
        with _in_process():
            expiry.expire_wait(self.id, expires_at)
        return self.drive()

    def signal(self, name: str, data: Any = None) -> TestRun:
        """Send signal ``name`` (``queuety.signal``), then drive the run on."""
        with _in_process():
            inbox.send_signal(self.id, name, data, sent_by="queuety.testing")
        return self.drive()

    def approve(self, data: Any = None, *, signal: str | None = None) -> TestRun:
        """Approve the run's current approval or decision wait, then drive it on."""
        return self._reply("approve", {} if data is None else data, signal)

    def reject(self, data: Any = None, *, signal: str | None = None) -> TestRun:
        """Reject the run's current decision wait, then drive it on."""
        return self._reply("reject", {} if data is None else data, signal)

    def submit_input(self, data: Any = None, *, signal: str | None = None) -> TestRun:
        """Answer the run's current input wait, then drive it on."""
        return self._reply("input", data, signal)

    def _reply(self, kind: str, data: Any, signal: str | None) -> TestRun:
        with _in_process():
            inbox.reply(self.id, kind, data, signal=signal, sent_by="queuety.testing")
        return self.drive()

    def drive(self) -> TestRun:
        """Run every step that is pending (now or after a delay) until none is left."""
        drive(self.id, max_steps=self.max_steps)
        return self

    def __repr__(self) -> str:
        return f"<TestRun {self.id} {self.status}>"


def run_workflow(workflow: str | WorkflowBuilder, payload: dict[str, Any] | None = None, *,
                 idempotency_key: str | None = None, max_steps: int = MAX_STEPS) -> TestRun:
    """Start a run of ``workflow`` (a registered name or a builder) and run it in-process
    until it finishes or waits for something only the test can send; return it.

    Raises:
        UnknownWorkflow, InvalidPayload, BudgetExceeded: as ``queuety.start()``.
        WorkflowDidNotSettle: work was still left after ``max_steps`` step attempts.
    """
    with _in_process():
        if isinstance(workflow, WorkflowBuilder):
            run_id = dispatch.dispatch(workflow.build(), payload,
                                       idempotency_key=idempotency_key)
        else:
            run_id = registry.start_run(workflow, payload, idempotency_key=idempotency_key)[0]
    return TestRun(run_id, max_steps).drive()


def drive(run_id: int, *, max_steps: int = MAX_STEPS) -> int:
    """Run the pending step rows of run ``run_id`` and of its family (the child runs it
    started, and theirs, with ``run_workflow`` or ``start_workflows``) in this process, until
    none is left; return how many attempts ran. Other runs the test dispatched are left as
    they are.

    Raises:
        WorkflowDidNotSettle: work was still left after ``max_steps`` attempts.
    """
    ran = 0
    woken: list[int] = []
    unclaimable: set[int] = set()
    with _in_process(woken):
        while True:
            if woken:
                for waiting in sorted(set(woken)):
                    settle.resume_waiting(waiting)
                woken.clear()
                continue
            # The rows a worker could claim: a running run's steps, or any run's clean-up.
            family = _family(run_id)
            row = (StepRun.objects.filter(Q(run__status=RunStatus.RUNNING) | ~Q(kind="step"),
                                          run_id__in=family, status=StepStatus.PENDING)
                   .exclude(pk__in=unclaimable).order_by("available_at", "id").values_list("pk", "available_at").first())
            if row is None:
                if not _wake_waiting_runs(family, woken):
                    return ran
                continue
            if ran >= max_steps:
                raise WorkflowDidNotSettle(
                    f"Run {run_id} still had work after {max_steps} step attempts; a repeat "
                    "or retry loop that never ends? Pass max_steps= to allow more.")
            pk, due = row
            now = timezone.now()
            if due > now:  # a retry's back-off or a delay() step: not waited for in a test
                StepRun.objects.filter(pk=pk, status=StepStatus.PENDING).update(
                    available_at=now)
            if not attempt.execute_step(pk).claimed:
                unclaimable.add(pk)
            ran += 1


def _family(run_id: int) -> list[int]:
    """Run ``run_id`` and every run it started, directly or through its children."""
    family, frontier = [run_id], [run_id]
    while frontier:
        frontier = list(WorkflowRun.objects.filter(
            Q(parent_id__in=frontier) | Q(started_by_id__in=frontier)
        ).exclude(pk__in=family).values_list("pk", flat=True))
        family += frontier
    return family


def _wake_waiting_runs(family: list[int], woken: list[int]) -> bool:
    """Move on the runs of ``family`` that wait for runs which have all finished; return
    whether any moved."""
    moved = False
    for waiting in (WorkflowRun.objects.filter(pk__in=family,
                                               status=RunStatus.WAITING_FOR_WORKFLOWS)
                    .values_list("pk", flat=True)):
        if settle.resume_waiting(waiting) != RunStatus.WAITING_FOR_WORKFLOWS:
            moved = True
    return moved or bool(woken)


@contextmanager
def _in_process(woken: list[int] | None = None) -> Iterator[None]:
    """Keep step messages and wake-ups away from Celery: the drive loop reads the step rows
    themselves, and moves woken runs on itself."""
    sink: list[int] = woken if woken is not None else []
    with publish.redirected(lambda messages: None), publish.wake_ups_redirected(sink.extend):
        yield


# -- jobs: Django's tasks on Queuety ----------------------------------------------------------

def run_task(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Enqueue ``task``'s job with ``args`` and ``kwargs`` (on the task's backend, which must
    be a ``QueuetyBackend``) and run it in-process to its end, its retries included (their
    back-offs and a ``run_after`` are not waited for); return its ``TaskResult`` as
    ``get_result()`` reads it then.

    Raises:
        TypeError: the task's backend is not Queuety's; nothing is enqueued.
        InvalidTask, InvalidTaskArguments: as ``task.enqueue()``; nothing is enqueued.
        WorkflowDidNotSettle: the job still had work after :data:`MAX_STEPS` attempts.
    """
    # Imported here: the tasks framework is optional on Django 5.2 (the django-tasks extra), and
    # a site without it still tests its workflows with this module.
    from queuety.tasks_backend import QueuetyBackend

    backend = task.get_backend()
    if not isinstance(backend, QueuetyBackend):
        raise TypeError(
            f"run_task() runs Queuety jobs, but task {task.module_path} is on the tasks "
            f"backend {task.backend!r} ({type(backend).__name__}); point TASKS"
            f"[{task.backend!r}]['BACKEND'] at 'queuety.tasks_backend.QueuetyBackend' in the "
            "test settings, or call the task's function directly (task.call()).")
    with _in_process():
        enqueued = task.enqueue(*args, **kwargs)
    drive(int(enqueued.id))
    return backend.get_result(enqueued.id)


def run_jobs(*, max_steps: int = MAX_STEPS) -> list[Any]:
    """Run in-process, to their end, every job that has work to do (the jobs code under test
    enqueued), oldest first; return their ``TaskResult`` objects in that order.

    Raises:
        WorkflowDidNotSettle: a job still had work after ``max_steps`` attempts.
    """
    from queuety.jobs import results  # the optional framework, as in run_task()

    pending = list(WorkflowRun.objects.filter(
        name__startswith=signals.JOB_PREFIX, status=RunStatus.RUNNING,
        steps__status=StepStatus.PENDING).order_by("pk").values_list(
        "pk", flat=True).distinct())
    found = []
    for run_id in pending:
        drive(run_id, max_steps=max_steps)
        state = WorkflowRun.objects.values_list("state", flat=True).get(pk=run_id)
        found.append(results.read(str(run_id), state["task"]["backend"]))
    return found


@contextmanager
def no_broker() -> Iterator[None]:
    """Keep what the enclosed code enqueues or dispatches away from Celery (its jobs and
    runs wait for :func:`run_jobs` or :func:`drive`): for a test whose transactions commit
    (pytest-django's ``transactional_db``), where the messages would otherwise be sent."""
    with _in_process():
        yield

