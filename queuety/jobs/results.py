"""A job read back as the framework's ``TaskResult``.

The run and its step row are the job's truth: the run's status and timestamps, the step's
attempts, and the failure events of the attempts before the last (each names its worker and
its error). Nothing is kept twice, so a result read at any moment agrees with the admin, the
CLI and ``workflow_status()``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils.module_loading import import_string

from queuety.core.status import FINISHED, RunStatus, StepStatus
from queuety.jobs import framework
from queuety.jobs.specs import is_job
from queuety.models import Event, StepRun, WorkflowRun

#: The events that close a failed attempt (a retry scheduled, or the job failed for good).
FAILED_ATTEMPTS = ("step_retried", "step_failed")


def task_of(state: dict[str, Any], run_id: int) -> Any:
    """The framework ``Task`` a job ran: its module-level object, with the queue, priority,
    ``run_after`` and backend it was enqueued with."""
    recorded = state["task"]
    path = recorded["path"]
    try:
        found = import_string(path)
    except ImportError as error:
        raise framework.TaskResultDoesNotExist(
            f"Job {run_id} ran task {path!r}, which no longer imports ({error}); the result "
            "cannot be read as a TaskResult, but the run is still shown by "
            f"`manage.py queuety workflow status {run_id}`.") from None
    if not isinstance(found, framework.Task):
        raise framework.TaskResultDoesNotExist(
            f"Job {run_id} ran task {path!r}, which is no longer a task (it imports as "
            f"{type(found).__name__}); decorate it with @task again to read its results.")
    run_after = recorded.get("run_after")
    return found.using(priority=recorded["priority"], queue_name=recorded["queue_name"],
                       backend=recorded["backend"],
                       run_after=None if run_after is None
                       else datetime.fromisoformat(run_after))


def read(result_id: str, alias: str) -> Any:
    """The ``TaskResult`` of job ``result_id`` (``alias``: the backend asking, named in errors;
    the result's ``backend`` is the one the job was enqueued on).

    Raises:
        TaskResultDoesNotExist: no job has that id (or the run with that id is a workflow's).
    """
    run_id = _run_id(result_id)
    run = WorkflowRun.objects.filter(pk=run_id).only(
        "name", "status", "state", "created_at", "finished_at").first()
    if run is None or not is_job(run.name) or not isinstance(run.state.get("task"), dict):
        raise framework.TaskResultDoesNotExist(
            f"No job has result id {result_id!r} on the tasks backend {alias!r}.")
    step = StepRun.objects.filter(run_id=run_id, kind="step").order_by("-seq").only(
        "status", "attempt", "claimed_at", "claimed_by", "finished_at").first()
    failures = list(Event.objects.filter(run_id=run_id, kind__in=FAILED_ATTEMPTS)
                    .order_by("id").values_list("data", "created_at", "duration_ms"))
    result = framework.TaskResult(
        task=task_of(run.state, run_id), id=str(run_id), status=_status(run, step),
        enqueued_at=_enqueued(run), started_at=_started(step, failures),
        finished_at=run.finished_at if run.status in FINISHED else None,
        last_attempted_at=None if step is None else step.claimed_at,
        args=run.state.get("args", []), kwargs=run.state.get("kwargs", {}),
        backend=run.state["task"].get("backend", alias),
        errors=[task_error(data["error"]) for data, _, _ in failures if "error" in data],
        worker_ids=_workers(step, failures))
    if run.status == RunStatus.COMPLETED:
        framework.set_field(result, "_return_value", run.state.get("return_value"))
    return result


def _run_id(result_id: str) -> int:
    try:
        run_id = int(result_id)
    except (TypeError, ValueError):
        raise framework.TaskResultDoesNotExist(
            f"{result_id!r} is not a Queuety job's result id (a run id, such as '42')."
        ) from None
    if run_id <= 0:
        raise framework.TaskResultDoesNotExist(f"No job has result id {result_id!r}.")
    return run_id


def _status(run: WorkflowRun, step: StepRun | None) -> Any:
    if run.status == RunStatus.COMPLETED:
        return framework.TaskResultStatus.SUCCESSFUL
    if run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        return framework.TaskResultStatus.FAILED
    if step is not None and step.status == StepStatus.PROCESSING:
        return framework.TaskResultStatus.RUNNING
    # Enqueued, waiting for its run_after or a retry, throttled, or paused by an operator.
    return framework.TaskResultStatus.READY


def _started(step: StepRun | None, failures: list[tuple[dict[str, Any], datetime,
                                                          float | None]]) -> datetime | None:
    """When the first attempt started: the first failed attempt's end less its duration, or
    the only attempt's claim."""
    if failures:
        data, ended, duration_ms = failures[0]
        return ended - timedelta(milliseconds=duration_ms or 0)
    return None if step is None else step.claimed_at


def _workers(step: StepRun | None, failures: list[tuple[dict[str, Any], datetime,
                                                          float | None]]) -> list[str]:
    """The worker of each attempt, in order: the failed ones', then the last one's while it
    runs or once it succeeded."""
    workers = [str(data.get("worker", "")) for data, _, _ in failures]
    if step is not None and step.status in (StepStatus.PROCESSING, StepStatus.COMPLETED) \
            and step.claimed_by:
        workers.append(step.claimed_by)
    return workers


def task_error(record: dict[str, Any]) -> Any:
    """The framework's ``TaskError`` of a recorded error (its type is importable: builtins
    get their module back)."""
    path = record.get("type", "Exception")
    if "." not in path:
        path = f"builtins.{path}"
    return framework.TaskError(exception_class_path=path,
                               traceback=record.get("traceback") or record.get("message", ""))


def _enqueued(run: WorkflowRun) -> datetime:
    """When the job was enqueued: the instant enqueue() reported (the run's creation is a
    moment later)."""
    recorded = run.state["task"].get("enqueued_at")
    return run.created_at if recorded is None else datetime.fromisoformat(recorded)
