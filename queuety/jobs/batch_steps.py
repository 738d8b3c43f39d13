"""The steps of a batch's run: start its jobs, wait until every one finished, then enqueue its
callbacks; and its ``on_cancel`` hook.

A batch is a run of the workflow ``batch:jobs`` (``queuety.jobs.batches``):

1. ``start_jobs`` enqueues one job per item, each under the dispatch key
   ``batch:<batch key>:<index>``, so a start step run again (a worker lost mid-step) finds the
   jobs it started and starts no others;
2. ``wait_for_jobs`` is a ``wait_for_workflows(mode="settled")``: parked, holding no worker,
   until the last job finished, either way;
3. ``settle`` records the outcome and enqueues ``then`` (every job succeeded), ``catch`` (a
   job failed, if the failure did not already enqueue it) and ``finally_``, each under its
   own dispatch key: once per batch.

``catch`` is enqueued at the first job that fails for good, by ``queuety.jobs.callbacks`` in
the transaction that fails it (``settle`` enqueues it too, which its key makes a no-op).
"""

from __future__ import annotations

from typing import Any

from queuety import exceptions, operations
from queuety.core.handlers import StepContext
from queuety.core.status import FINISHED
from queuety.jobs import callbacks
from queuety.models import DispatchKey, WorkflowRun

START = "queuety.jobs.batch_steps.start_jobs"
SETTLE = "queuety.jobs.batch_steps.settle"
ON_CANCEL = "queuety.jobs.batch_steps.on_cancel"


def start_jobs(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Enqueue the batch's jobs (each at most once) and record their ids."""
    batch = state["batch"]
    ids = [int(callbacks.enqueue_task(item["task"], item["args"], item["kwargs"],
                                      context.run_id, key=callbacks.job_key(batch["key"], index),
                                      batch={"id": context.run_id}).id)
           for index, item in enumerate(batch["items"])]
    return {"job_ids": ids}


def settle(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Every job finished: record how, and enqueue the callbacks that apply."""
    summary = {**callbacks.batch_summary(state), "cancelled": False}
    if summary["failed"] == 0:
        callbacks.enqueue_batch_callback(state, "then", context.run_id, summary)
    else:
        callbacks.enqueue_batch_callback(state, "catch", context.run_id, summary)
    callbacks.enqueue_batch_callback(state, "finally", context.run_id, summary)
    return {"summary": summary}


def on_cancel(state: dict[str, Any]) -> None:
    """The batch was cancelled: cancel its unfinished jobs, then enqueue ``finally_``."""
    batch = state["batch"]
    batch_id = DispatchKey.objects.values_list("run_id", flat=True).get(
        key=f"{callbacks.BATCH_PREFIX}{batch['key']}")
    # The start step may not have recorded its ids (cancelled while it ran): the keys have them.
    ids = callbacks.job_ids({"batch": batch})
    for job_id in WorkflowRun.objects.filter(pk__in=ids).exclude(
            status__in=FINISHED).values_list("pk", flat=True):
        try:
            operations.cancel(job_id, actor=f"batch {batch_id}")
        except exceptions.InvalidTransition:
            pass  # it finished in the meantime
    summary = callbacks.batch_summary({"batch": batch, "job_ids": ids})
    callbacks.enqueue_batch_callback(state, "finally", batch_id, {**summary, "cancelled": True})
