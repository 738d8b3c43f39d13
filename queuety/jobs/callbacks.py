"""The callbacks of chains and batches, and the sink of ``queuety.signals`` that enqueues the
``catch`` callbacks in the transaction that fails a run: a callback is enqueued exactly when
that transaction commits.

A batch's jobs carry ``{"batch": {"id": <its run id>}}`` in their state, so a job that fails
finds its batch. A batch's callbacks are enqueued under dispatch keys of their own
(``batch:<batch key>:then``, ``:catch``, ``:finally``), so however many jobs fail at once, and
however often a step that enqueues one is run again, each is one job.

Registered by ``queuety.apps`` whether or not the tasks framework is installed: nothing here
imports it until a chain's run or a job fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction

logger = logging.getLogger("queuety")

#: What a chain's workflow name starts with.
CHAIN_PREFIX = "chain:"
#: What a batch's workflow name, and its dispatch keys, start with.
BATCH_PREFIX = "batch:"
#: What a job's workflow name starts with (``queuety.jobs.specs.PREFIX``).
JOB_PREFIX = "task:"


def wants(name: str) -> bool:
    """The sink's filter: only a failed run can fail a chain or a batch."""
    return name == "run_failed"


def write(name: str, arguments: dict[str, Any]) -> None:
    """In the transaction that fails a run: a chain's run enqueues its ``catch``; a job that a
    batch waits for enqueues the batch's ``catch`` (once per batch)."""
    workflow = str(arguments.get("workflow", ""))
    if not workflow.startswith((CHAIN_PREFIX, JOB_PREFIX)):
        return
    try:
        # A savepoint: a callback that cannot be enqueued must not undo the run's failure.
        with transaction.atomic():
            if workflow.startswith(CHAIN_PREFIX):
                _chain_failed(arguments["run_id"], arguments.get("error") or {})
            else:
                _job_failed(arguments["run_id"])
    except Exception:  # noqa: BLE001 - logged; the failure is recorded all the same
        logger.exception("The catch callback of run id=%s (%s) could not be enqueued; the "
                         "run's failure is recorded all the same. Enqueue the callback by "
                         "hand once its cause is fixed.", arguments["run_id"], workflow)


def enqueue_task(recorded: dict[str, Any], args: list[Any], kwargs: dict[str, Any],
                 owner: int, key: str | None = None, batch: dict[str, Any] | None = None
                 ) -> Any:
    """Enqueue the task a chain's or batch's state records (``owner``: that run's id, named in
    errors); with ``key``, at most once per key; ``batch`` goes in the job's state. Return
    its ``TaskResult``."""
    from queuety.jobs import enqueue, results  # import the framework: only when used

    task = results.task_of({"task": recorded}, owner)
    return enqueue.enqueue(task.get_backend(), task, args, kwargs, key=key, batch=batch)


def job_key(batch_key: str, index: int) -> str:
    """The dispatch key of a batch's ``index``-th job."""
    return f"{BATCH_PREFIX}{batch_key}:{index}"


def job_ids(state: dict[str, Any]) -> list[int]:
    """The ids of a batch's jobs: as its start step recorded them, else (the step has not
    finished) those its jobs' dispatch keys hold so far."""
    recorded = state.get("job_ids")
    if recorded is not None:
        return list(recorded)
    from queuety.models import DispatchKey

    batch = state["batch"]
    keys = [job_key(batch["key"], index) for index in range(len(batch["items"]))]
    return sorted(DispatchKey.objects.filter(key__in=keys).values_list("run_id", flat=True))


def batch_summary(state: dict[str, Any]) -> dict[str, Any]:
    """How a batch's jobs stand: ``total``, ``done`` (completed), ``failed`` (failed, cancelled
    or gone), ``pending`` and ``failed_job_ids``, from their runs' rows."""
    from queuety.core.status import RunStatus
    from queuety.models import WorkflowRun

    total = len(state["batch"]["items"])
    ids = job_ids(state)
    statuses = dict(WorkflowRun.objects.filter(pk__in=ids).values_list("pk", "status"))
    done = [i for i in ids if statuses.get(i) == RunStatus.COMPLETED]
    failed = [i for i in ids if statuses.get(i, RunStatus.FAILED)
              in (RunStatus.FAILED, RunStatus.CANCELLED)]
    return {"total": total, "done": len(done), "failed": len(failed),
            "pending": total - len(done) - len(failed), "failed_job_ids": failed}


def enqueue_batch_callback(state: dict[str, Any], which: str, batch_id: int,
                           summary: dict[str, Any]) -> None:
    """Enqueue the batch's ``which`` callback (``then``, ``catch``, ``finally``), if it has
    one, with ``(batch id, summary)``: once per batch, under its own dispatch key."""
    recorded = state["batch"].get(which)
    if recorded is not None:
        enqueue_task(recorded, [str(batch_id), summary], {}, batch_id,
                     key=f"{BATCH_PREFIX}{state['batch']['key']}:{which}")


def _chain_failed(run_id: int, error: dict[str, Any]) -> None:
    from queuety.models import WorkflowRun

    state = WorkflowRun.objects.values_list("state", flat=True).get(pk=run_id)
    catch = (state.get("chain") or {}).get("catch")
    if catch is not None:
        enqueue_task(catch, [str(run_id), {key: error.get(key)
                                           for key in ("type", "message", "step")}], {}, run_id)


def _job_failed(job_id: int) -> None:
    """A failed job: if a batch's, that batch enqueues its ``catch`` (once per batch; not
    after the batch was cancelled)."""
    from queuety.core.status import RunStatus
    from queuety.models import WorkflowRun

    job_state = WorkflowRun.objects.values_list("state", flat=True).get(pk=job_id)
    batch = job_state.get("batch") if isinstance(job_state, dict) else None
    if not isinstance(batch, dict):
        return
    found = WorkflowRun.objects.filter(pk=batch["id"]).values_list("status", "state").first()
    if found is None or found[0] == RunStatus.CANCELLED:
        return
    state = found[1]
    if state["batch"].get("catch") is not None:
        enqueue_batch_callback(state, "catch", batch["id"],
                               {**batch_summary(state), "cancelled": False})


def status_of(run_id: str, noun: str, belongs: Callable[[str], bool],
              not_found: type[Exception]) -> Any:
    """The ``WorkflowStatus`` of the chain or batch (``noun``) ``run_id``.

    Raises:
        not_found: ``run_id`` is no run id, no run has it, or its workflow (``belongs``
            answers for its name) is not a ``noun``'s.
    """
    from queuety import exceptions, queries

    try:
        status = queries.workflow_status(int(run_id))
    except (TypeError, ValueError):
        raise not_found(f"{run_id!r} is not a {noun}'s id (a run id, such as '42').") from None
    except exceptions.RunNotFound:
        raise not_found(f"No {noun} has id {run_id!r}: no run has it.") from None
    if not belongs(status.name):
        raise not_found(f"Run {run_id} is not a {noun} (it is a run of {status.name!r}); "
                        "read it with queuety.workflow_status().")
    return status
