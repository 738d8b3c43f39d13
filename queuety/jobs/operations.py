"""Seeing and steering jobs: list, inspect, retry, cancel, bury and purge them.

The service layer under ``manage.py queuety job ...`` and the API's ``jobs/`` endpoints. A job
is a run (``queuety.jobs.specs``), so each operation is the run's own (``queuety.operations``)
with a job's words and rules on top; bury fails the run through the engine's one fail path
(``queuety.runtime.finish.fail_run``), so it sends ``run_failed`` like any failure.

Statuses are the framework's: ``READY``, ``RUNNING``, ``SUCCESSFUL``, ``FAILED`` (a cancelled
job too); and ``buried``, a job whose run is ``failed`` (its attempts exhausted, or buried by
an operator), which ``retry`` runs again.

Tenancy: every function takes ``user``, as the run endpoints and ``--as-user`` do
(``queuety.scope``): ``None`` is an operator with full access; for a user, a job outside their
``QUEUETY["RUN_SCOPE"]`` does not exist, and ``QUEUETY["RUN_ACCESS"]`` decides each one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from queuety import exceptions, operations, scope
from queuety.core import flow
from queuety.core.status import FINISHED, UNFINISHED, RunStatus, StepStatus
from queuety.jobs.specs import PREFIX, is_job
from queuety.models import Event, StepRun, WorkflowRun
from queuety.runtime.finish import fail_run
from queuety.store import rows
from queuety.store.definitions import load_spec
from queuety.timeline import event_dict

#: A buried job: its run is ``failed``, and stays so until ``retry`` runs it again.
BURIED = "buried"
#: The statuses a job filter takes: the framework's, and ``buried``.
STATUSES = ("READY", "RUNNING", "SUCCESSFUL", "FAILED", BURIED)
#: The statuses of finished jobs, which purge deletes.
FINISHED_STATUSES = ("SUCCESSFUL", "FAILED", BURIED)
#: Runs deleted per statement by :func:`purge`.
PURGE_BATCH = 500


class JobNotFound(exceptions.RunNotFound):
    """No job has the id: no run has it, the run is a workflow's (not a task's job), or it is
    outside the user's ``QUEUETY["RUN_SCOPE"]`` (the same answer, so an id is never
    confirmed)."""

    def __init__(self, run_id: int) -> None:
        super().__init__(run_id)
        self.args = (f"Job {run_id} does not exist: no run with that id is a task's job. "
                     "`manage.py queuety job list` (or GET jobs/) lists the jobs; a "
                     "workflow's run is shown by `manage.py queuety workflow status`.",)


class JobAccessDenied(exceptions.QueuetyError):
    """``QUEUETY["RUN_ACCESS"]`` does not let the user act on the job; nothing was done."""


class InvalidJobFilter(exceptions.QueuetyError, ValueError):
    """A job filter or purge option is not one the jobs take; nothing was read or deleted."""


class JobBuried(exceptions.QueuetyError):
    """The error of a job an operator buried (``WorkflowRun.error``, ``type``)."""


@dataclass(frozen=True)
class RetryReport:
    """What :func:`retry_buried` did: the jobs it scheduled for retry, and the ones it could
    not, with why (another operator got there first, say)."""

    retried: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"retried": self.retried,
                "failed": [{"id": pk, "error": why} for pk, why in self.failed]}


def status_word(text: str) -> str:
    """The job status ``text`` names (``ready`` is ``READY``; ``BURIED`` is ``buried``).

    Raises:
        InvalidJobFilter: it names none.
    """
    for word in STATUSES:
        if text.strip().lower() == word.lower():
            return word
    raise InvalidJobFilter(
        f"Unknown job status {text!r}; the statuses are READY, RUNNING, SUCCESSFUL, FAILED "
        "(cancelled jobs too) and buried (failed for good, until retried).")


def jobs_matching(*, task: str | None = None, queue_name: str | None = None,
                  status: str | None = None, user: Any = None) -> QuerySet[WorkflowRun]:
    """The jobs ``user`` may reach (every job: ``None``), newest first, of the task with module
    path ``task``, on ``queue_name`` and with ``status`` (see :data:`STATUSES`), as SQL.

    Raises:
        InvalidJobFilter: a blank filter, or an unknown status.
    """
    runs = WorkflowRun.objects.filter(name__startswith=PREFIX, state__has_key="task")
    if task is not None:
        runs = runs.filter(name=PREFIX + _given(task, "task"))
    if queue_name is not None:
        runs = runs.filter(state__task__queue_name=_given(queue_name, "queue_name"))
    if status is not None:
        runs = runs.filter(_status_filter(status_word(status)))
    return scope.scoped_runs(user, runs).order_by("-pk")


def _given(value: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidJobFilter(f"The {name} filter is blank; give a {name} (such as "
                               + ("'shop.tasks.send_receipt'" if name == "task" else "'default'")
                               + ") or leave the filter out.")
    if "\x00" in value:  # PostgreSQL text cannot hold it: no job could match
        raise InvalidJobFilter(f"The {name} filter contains a NUL character, which no "
                               f"{name} has; remove it.")
    return value.strip()


def _status_filter(word: str) -> Q:
    attempt_running = Exists(StepRun.objects.filter(run_id=OuterRef("pk"), kind="step",
                                                    status=StepStatus.PROCESSING))
    if word == "SUCCESSFUL":
        return Q(status=RunStatus.COMPLETED)
    if word == "FAILED":
        return Q(status__in=(RunStatus.FAILED, RunStatus.CANCELLED))
    if word == BURIED:
        return Q(status=RunStatus.FAILED)
    unfinished = Q(status__in=UNFINISHED)
    return unfinished & (Q(attempt_running) if word == "RUNNING" else ~Q(attempt_running))


def list_jobs(*, task: str | None = None, queue_name: str | None = None,
              status: str | None = None, limit: int = 50, offset: int = 0,
              user: Any = None) -> list[dict[str, Any]]:
    """The jobs :func:`jobs_matching` finds, newest first, from ``offset``, at most ``limit``,
    each as :func:`describe` gives it; with ``RUN_ACCESS``, only those it lets ``user`` act
    on.

    Raises:
        InvalidJobFilter: a bad filter, or ``limit`` below 1 or ``offset`` below 0.
    """
    if limit < 1 or offset < 0:
        raise InvalidJobFilter(f"limit must be at least 1 and offset at least 0 (got "
                               f"limit={limit}, offset={offset}).")
    runs = jobs_matching(task=task, queue_name=queue_name, status=status, user=user)
    return [describe(run) for run in runs[offset:offset + limit]
            if scope.may_access(user, run)]


def describe(run: WorkflowRun) -> dict[str, Any]:
    """Job ``run`` as JSON-ready data: its ``TaskResult``'s fields (``status`` in the
    framework's words, ``return_value`` only once it succeeded), ``buried``, and the run's
    own ``run_status`` and ``run_error`` (why it failed, or who buried it)."""
    recorded = run.state["task"]
    data: dict[str, Any] = {
        "id": run.pk, "task": recorded.get("path"), "backend": recorded.get("backend"),
        "queue_name": recorded.get("queue_name"), "priority": recorded.get("priority"),
        "buried": run.status == RunStatus.FAILED, "run_status": str(run.status),
        "run_error": run.error,
    }
    # Imported here: a site without the tasks framework (Django 5.2, no backport) still loads
    # the CLI, the API and the admin, which import this module; it has no jobs to describe.
    from queuety.jobs import framework, results

    try:
        result = results.read(str(run.pk), str(recorded.get("backend")))
    except framework.TaskResultDoesNotExist as error:  # its task no longer imports
        return {**data, **_from_row(run), "unreadable": str(error)}
    data.update(
        status=str(result.status.value), args=result.args, kwargs=result.kwargs,
        errors=[{"exception_class_path": each.exception_class_path,
                 "traceback": each.traceback} for each in result.errors],
        worker_ids=list(result.worker_ids), attempts=result.attempts,
        enqueued_at=result.enqueued_at, started_at=result.started_at,
        last_attempted_at=result.last_attempted_at, finished_at=result.finished_at)
    if result.status == framework.TaskResultStatus.SUCCESSFUL:
        data["return_value"] = result.return_value
    return data


def _from_row(run: WorkflowRun) -> dict[str, Any]:
    """What the run's row alone says of a job whose task cannot be read as a TaskResult."""
    word = {RunStatus.COMPLETED: "SUCCESSFUL", RunStatus.FAILED: "FAILED",
            RunStatus.CANCELLED: "FAILED"}.get(RunStatus(run.status), "READY")
    return {"status": word, "args": run.state.get("args", []),
            "kwargs": run.state.get("kwargs", {}), "errors": [], "worker_ids": [],
            "attempts": 0, "enqueued_at": run.created_at, "started_at": None,
            "last_attempted_at": None, "finished_at": run.finished_at}


def find_job(job_id: int, user: Any = None) -> WorkflowRun:
    """Job ``job_id``'s run, if ``user`` may reach it and act on it.

    Raises:
        JobNotFound: no job has that id inside the user's scope.
        JobAccessDenied: ``RUN_ACCESS`` refuses the user this job.
    """
    run = scope.find_run(user, job_id)
    if run is None or not is_job(run.name) or not isinstance((run.state or {}).get("task"),
                                                              dict):
        raise JobNotFound(job_id)
    if not scope.may_access(user, run):
        raise JobAccessDenied(
            f"User {user.get_username()!r} may not act on job {job_id}: "
            "QUEUETY['RUN_ACCESS'] refuses it. Act as a user it allows.")
    return run


def inspect(job_id: int, *, user: Any = None, events: int = 200) -> dict[str, Any]:
    """Job ``job_id`` in full: :func:`describe`'s fields, and its run's timeline (its first
    ``events`` events, oldest first: each attempt, retry and failure, and who operated it).

    Raises:
        JobNotFound, JobAccessDenied: as :func:`find_job`.
    """
    run = find_job(job_id, user)
    timeline = Event.objects.filter(run_id=run.pk).order_by("pk")[:events]
    return {**describe(run), "timeline": [event_dict(event) for event in timeline]}


def _word(run: WorkflowRun) -> str:
    """How a refusal names a job's status."""
    if run.status == RunStatus.FAILED:
        return "buried (failed for good)"
    if run.status == RunStatus.CANCELLED:
        return "cancelled"
    if run.status == RunStatus.COMPLETED:
        return "SUCCESSFUL (it completed)"
    return f"unfinished ({run.status})"


def retry(job_id: int, *, actor: str, user: Any = None) -> None:
    """Run buried job ``job_id`` again: its step gets a fresh attempt budget
    (``queuety.operations.retry``), and it is ``READY`` until a worker claims it.

    Raises:
        JobNotFound, JobAccessDenied: as :func:`find_job`.
        InvalidTransition: the job is not buried (unfinished, successful or cancelled).
    """
    run = find_job(job_id, user)
    if run.status != RunStatus.FAILED:
        advice = ("enqueue its task again for a new job" if run.status in FINISHED
                  else "it is still to run; bury or cancel it first to stop it")
        raise exceptions.InvalidTransition(
            job_id, f"Cannot retry job {job_id}: it is {_word(run)}, and only a buried job "
                    f"runs again; {advice}.")
    operations.retry(job_id, actor=actor)


def retry_buried(*, task: str | None = None, actor: str, user: Any = None) -> RetryReport:
    """Retry every buried job (of the task with module path ``task``) ``user`` may act on,
    oldest first; a job another operator changed meanwhile is reported, not retried.

    Raises:
        InvalidJobFilter: a blank ``task``.
    """
    report = RetryReport()
    # Read first, then retried one by one: no cursor stays open across their transactions
    # (a server-side one would not survive a transaction pooler).
    for run in list(jobs_matching(task=task, status=BURIED, user=user).order_by("pk")):
        if not scope.may_access(user, run):
            continue
        try:
            operations.retry(run.pk, actor=actor)
        except exceptions.QueuetyError as error:
            report.failed.append((run.pk, str(error)))
        else:
            report.retried.append(run.pk)
    return report


def cancel(job_id: int, *, actor: str, user: Any = None) -> None:
    """Cancel unfinished job ``job_id``: an attempt in flight is discarded, nothing runs
    again, and it reads as ``FAILED`` (``queuety.operations.cancel``).

    Raises:
        JobNotFound, JobAccessDenied: as :func:`find_job`.
        InvalidTransition: the job has already finished.
    """
    run = find_job(job_id, user)
    if run.status in FINISHED:
        raise exceptions.InvalidTransition(
            job_id, f"Cannot cancel job {job_id}: it is already {_word(run)}. Purge it to "
                    "delete it" + (", or retry it to run it again." if
                                   run.status == RunStatus.FAILED else "."))
    operations.cancel(job_id, actor=actor)


def bury(job_id: int, *, actor: str, user: Any = None) -> None:
    """Bury unfinished job ``job_id``: stop it (an attempt in flight is discarded) and fail
    its run with a :class:`JobBuried` error naming ``actor``, through the engine's fail path
    (its ``workflow_failed`` event and the ``run_failed`` signal, as any failure). It stays
    buried until :func:`retry`.

    Raises:
        JobNotFound, JobAccessDenied: as :func:`find_job`.
        InvalidTransition: the job has already finished.
    """
    find_job(job_id, user)
    now = timezone.now()
    with transaction.atomic():
        run = rows.lock_run(job_id, steps_first=True)
        if run.status in FINISHED:
            raise exceptions.InvalidTransition(
                job_id, f"Cannot bury job {job_id}: it is already {_word(run)}; only an "
                        "unfinished job is buried.")
        try:
            spec = load_spec(run.definition_id)
        except exceptions.WorkflowDefinitionError:
            spec = None  # fail_run fails it all the same: nothing of a job compensates
        step = StepRun.objects.filter(run_id=run.pk, kind="step").order_by("-pk").first()
        who = actor or "an operator"
        error = flow.failure_record(
            JobBuried(f"Job {job_id} (task {run.name.removeprefix(PREFIX)}) was buried by "
                      f"{who} while {run.status}."),
            step=None if step is None else step.step_name, step_index=0,
            attempt=None if step is None else step.attempt,
            max_attempts=None if step is None else step.max_attempts, buried_by=who)
        rows.stop_live_steps(run.pk, now)
        fail_run(spec, run.pk, error, now, events=[Event(
            run_id=run.pk, kind="job_buried", data={"by": who, "previous_status": run.status})])


def purge(*, status: str | None = None, older_than: timedelta | None = None,
          task: str | None = None, user: Any = None, now: datetime | None = None) -> int:
    """Delete finished jobs (with ``status``: ``SUCCESSFUL``, ``FAILED`` or ``buried``;
    without, every finished job) that finished more than ``older_than`` ago, of ``task``,
    among those ``user`` may act on; return how many. Their steps and timeline go with them;
    workflow runs are never touched, nor are unique jobs' dispatch keys.

    Raises:
        InvalidJobFilter: ``status`` is an unfinished one, ``older_than`` is negative, or a
            blank ``task``.
    """
    if status is not None and status_word(status) not in FINISHED_STATUSES:
        raise InvalidJobFilter(
            f"purge deletes finished jobs only, not {status_word(status)} ones; give "
            "SUCCESSFUL, FAILED or buried, or cancel or bury the jobs first.")
    if older_than is not None and older_than < timedelta(0):
        raise InvalidJobFilter(f"older_than must not be negative (got {older_than}).")
    runs = jobs_matching(task=task, status=status, user=user).filter(status__in=FINISHED)
    if older_than is not None:
        runs = runs.filter(finished_at__lt=(now or timezone.now()) - older_than)
    return _delete(runs.order_by("pk"), user)


def _delete(runs: QuerySet[WorkflowRun], user: Any) -> int:
    """Delete ``runs`` in batches, keeping those ``RUN_ACCESS`` refuses ``user``."""
    kept: set[int]
    deleted, kept = 0, set()
    while True:
        batch = list(runs.exclude(pk__in=kept)[:PURGE_BATCH])
        if not batch:
            return deleted
        allowed = _allowed(batch, user)
        kept.update(run.pk for run in batch if run.pk not in allowed)
        if allowed:
            WorkflowRun.objects.filter(pk__in=allowed).delete()
            deleted += len(allowed)


def _allowed(batch: Iterable[WorkflowRun], user: Any) -> set[int]:
    return {run.pk for run in batch if scope.may_access(user, run)}
