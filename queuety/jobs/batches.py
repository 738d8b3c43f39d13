"""Batches: jobs enqueued together and followed as one, with callbacks.

``queuety.batch([(import_chunk, [1]), (import_chunk, [2])], then=report, catch=alert,
finally_=cleanup).enqueue()`` enqueues both jobs and returns a ``BatchResult``: the batch's
progress (done, failed, total) read from its jobs' runs. ``then`` runs when every job
succeeded, ``catch`` at the first job that failed for good, ``finally_`` when every job
finished either way (or the batch was cancelled); each exactly once, called with
``(batch id, summary)``. A batch is one run of the workflow ``batch:jobs``
(``queuety.jobs.batch_steps``): it starts the jobs, waits for them with the engine's
``wait_for_workflows(mode="settled")`` and enqueues the callbacks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.utils import timezone

from queuety import dispatch, exceptions, operations
from queuety.core.builder import workflow
from queuety.core.definition import WorkflowSpec
from queuety.core.status import FINISHED, RunStatus
from queuety.jobs import batch_steps, callbacks, framework
from queuety.jobs import enqueue as enqueueing

#: The batch's workflow: one definition for every batch.
NAME = f"{callbacks.BATCH_PREFIX}jobs"


class BatchNotFound(exceptions.QueuetyError, LookupError):
    """No batch has the given id (no run has it, or the run is not a batch's)."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A batch as it stands: its run's status and its jobs' progress."""

    id: str
    """The batch's run id, as a string."""
    status: str
    """The batch run's status: ``running`` (starting its jobs), ``waiting_for_workflows``,
    ``completed`` (every job finished, whatever its outcome), ``cancelled``."""
    total: int
    done: int
    """Jobs that succeeded."""
    failed: int
    """Jobs that failed for good, or were cancelled."""
    job_ids: list[str]
    """The jobs' result ids, in the order given (those started so far while the batch starts
    them)."""
    failed_job_ids: list[str]

    @property
    def pending(self) -> int:
        """Jobs not finished yet."""
        return self.total - self.done - self.failed

    @property
    def progress(self) -> int:
        """Percent of the jobs finished, 0 to 100."""
        return (100 * (self.done + self.failed)) // self.total

    @property
    def is_finished(self) -> bool:
        """Whether the batch settled (its callbacks are enqueued) or was cancelled."""
        return self.status in FINISHED

    @property
    def cancelled(self) -> bool:
        return self.status == RunStatus.CANCELLED

    def refresh(self) -> BatchResult:
        """The batch read again."""
        return Batch.get_result(self.id)

    def cancel(self) -> None:
        """Cancel the batch: its unfinished jobs are cancelled and ``finally_`` is enqueued
        (durably, by the run's ``on_cancel`` hook); ``then`` and ``catch`` do not run after.

        Raises:
            InvalidTransition: the batch already completed or was cancelled.
        """
        operations.cancel(int(self.id))


class Batch:
    """Jobs to enqueue together (build it with :func:`batch`)."""

    def __init__(self, items: list[tuple[Any, list[Any], dict[str, Any]]],
                 callbacks: dict[str, Any]) -> None:
        self.items = items
        self.callbacks = callbacks

    def enqueue(self) -> BatchResult:
        """Start the batch (one statement; its jobs are enqueued by its first step).

        Raises:
            InvalidTask: a task its backend cannot run; nothing is enqueued.
            InvalidTaskArguments: an argument is not JSON; nothing is enqueued.
        """
        items = [{"task": _recorded(task), **enqueueing.arguments_of(task, args, kwargs)}
                 for task, args, kwargs in self.items]
        key = uuid.uuid4().hex
        state: dict[str, Any] = {"key": key, "items": items,
                                 "enqueued_at": timezone.now().isoformat()}
        for which, task in self.callbacks.items():
            state[which] = None if task is None else _recorded(task)
        run_id = dispatch.dispatch_run(_spec(), {"batch": state},
                                       idempotency_key=f"{callbacks.BATCH_PREFIX}{key}").run_id
        return BatchResult(id=str(run_id), status=RunStatus.RUNNING, total=len(items), done=0,
                           failed=0, job_ids=[], failed_job_ids=[])

    @staticmethod
    def get_result(batch_id: str) -> BatchResult:
        """The batch ``batch_id`` as it stands.

        Raises:
            BatchNotFound: no run has that id, or it is not a batch's.
        """
        status = callbacks.status_of(batch_id, "batch", NAME.__eq__, BatchNotFound)
        ids = callbacks.job_ids(status.state)
        summary = callbacks.batch_summary({**status.state, "job_ids": ids})
        return BatchResult(
            id=str(status.id), status=status.status, total=summary["total"],
            done=summary["done"], failed=summary["failed"], job_ids=[str(i) for i in ids],
            failed_job_ids=[str(i) for i in summary["failed_job_ids"]])


def batch(items: list[Any], *, then: Any = None, catch: Any = None,
          finally_: Any = None) -> Batch:
    """Jobs to enqueue together and follow as one::

        queuety.batch([(import_chunk, [1]), (import_chunk, [2], {"dry_run": True}), cleanup],
                      then=report, catch=alert, finally_=release).enqueue()

    An item is a task (called with no arguments), ``(task, args)`` or ``(task, args,
    kwargs)``; each runs as a job with its backend's and its own job options. The callbacks
    are tasks, called with ``(batch id, summary)``; the summary is ``{"total", "done",
    "failed", "pending", "failed_job_ids", "cancelled"}``.

    Raises:
        TypeError: no items, an item of another shape, or something that is not a task.
    """
    if not isinstance(items, list | tuple) or not items:
        raise TypeError(f"queuety.batch() needs a non-empty list of jobs (got {items!r}).")
    parsed = [_item(index, item) for index, item in enumerate(items)]
    named = {"then": then, "catch": catch, "finally": finally_}
    for which, task in named.items():
        if task is not None:
            _check_task(task, f"queuety.batch()'s {which if which != 'finally' else 'finally_'}")
    return Batch(parsed, named)


def _item(index: int, item: Any) -> tuple[Any, list[Any], dict[str, Any]]:
    kwargs: Any
    if isinstance(item, framework.Task):
        task, args, kwargs = item, [], {}
    elif isinstance(item, tuple | list) and len(item) in (2, 3):
        task, args, kwargs = item[0], item[1], item[2] if len(item) == 3 else {}
        if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
            raise TypeError(
                f"Item {index} of queuety.batch() has arguments of the wrong shape: give "
                f"(task, [args...], {{kwargs...}}) (got {item!r}).")
    else:
        raise TypeError(f"Item {index} of queuety.batch() is {item!r}; give a task, "
                        "(task, args) or (task, args, kwargs).")
    _check_task(task, f"Item {index} of queuety.batch()")
    return task, list(args), dict(kwargs)


def _check_task(task: Any, where: str) -> None:
    if not isinstance(task, framework.Task):
        raise TypeError(f"{where} is not a task (decorated with @task): {task!r}.")
    backend = task.get_backend()
    if not hasattr(backend, "job_options"):
        raise framework.InvalidTask(
            f"{where}: task {task.module_path} is on the tasks backend {backend.alias!r}, "
            "which is not Queuety's; a batch runs on QueuetyBackend backends only.")
    backend.validate_task(task)


def _recorded(task: Any) -> dict[str, Any]:
    """A task as a batch's state records it (``results.task_of`` reads it back)."""
    return {"path": task.module_path, "backend": task.backend, "queue_name": task.queue_name,
            "priority": task.priority, "run_after": None}


@lru_cache(maxsize=1)
def _spec() -> WorkflowSpec:
    return (workflow(NAME)
            .then(batch_steps.START, name="start_jobs")
            .wait_for_workflows("job_ids", mode="settled", name="wait_for_jobs")
            .then(batch_steps.SETTLE, name="settle")
            .on_cancel(batch_steps.ON_CANCEL)
            .build())
