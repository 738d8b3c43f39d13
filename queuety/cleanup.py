"""Compensations and hooks: durable "cleanup" rows run by workers one after the other.

When a run is cancelled, misses its deadline, or fails with ``compensate_on_failure``, the
compensations of its completed steps (newest first) and its ``on_cancel`` / ``on_deadline``
hook are queued in the run's ``cleanup`` field. Each runs as a ``StepRun`` of kind
``compensation`` or ``hook``, with its own retries and timeline events; a failed one is
recorded and skipped, and the next one starts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queuety import exceptions, publish, timeline
from queuety.conf import settings
from queuety.core.definition import WorkflowSpec
from queuety.core.handlers import StepOptions, step_options
from queuety.core.imports import import_path
from queuety.core.retry import RetryPolicy
from queuety.models import Event, StepRun, WorkflowRun
from queuety.store import rows


def start_cleanup(run: WorkflowRun, spec: WorkflowSpec, cause: str, now: datetime) -> None:
    """Queue the compensations of completed steps (newest first) and the run's hook."""
    if run.cleanup:
        return  # at most once per run
    after = timeline.states_after_steps(run.pk)
    completions = (Event.objects.filter(run_id=run.pk, kind__in=timeline.MERGES)
                   .order_by("-pk").values_list("step_index", flat=True))
    queue: list[dict[str, Any]] = []
    if cause == "cancel" or spec.compensate_on_failure:
        # Newest completion first, each step at most once (a loop completes a step again).
        for index in dict.fromkeys(completions):
            if index is None:  # a merge always names its step
                continue
            step = spec.steps[index]
            if step.compensation:
                queue.append({"kind": "compensation", "step_index": index,
                              "step_name": f"compensate:{step.name}",
                              "handler": step.compensation, "state": after.get(index, {})})
    hook = spec.on_cancel if cause == "cancel" else spec.on_deadline if cause == "deadline" \
        else None
    if hook:
        queue.append({"kind": "hook", "step_index": run.current_step,
                      "step_name": f"on_{cause}", "handler": hook, "state": run.state})
    if not queue:
        return
    WorkflowRun.objects.filter(pk=run.pk).update(cleanup={"cause": cause, "queue": queue,
                                                          "next": 1})
    _cleanup_row(run.pk, spec, queue, 0, now)


def _cleanup_row(run_id: int, spec: WorkflowSpec, queue: list[dict[str, Any]], position: int,
                 now: datetime) -> None:
    item = queue[position]
    options = cleanup_options(spec, item["handler"])
    row = StepRun.objects.create(
        run_id=run_id, kind=item["kind"], seq=position, step_index=item["step_index"],
        step_name=item["step_name"], handler=item["handler"], input=item["state"],
        max_attempts=cleanup_policy(spec, item["handler"]).max_attempts,
        timeout=options.timeout, available_at=now, published_at=now)
    publish.publish_on_commit([publish.Message(row.pk, None, options.timeout, spec.queue)])


def cleanup_options(spec: WorkflowSpec, handler: str) -> StepOptions:
    """How a compensation or hook runs: its class's ``retry`` and ``timeout``, as for any
    step (:func:`queuety.core.handlers.step_options`). A handler that no longer imports, or
    whose class declares options that no longer check, runs with none: its failure is then
    recorded like any other."""
    try:
        return step_options(handler, import_path(handler))
    except (ImportError, exceptions.WorkflowDefinitionError):
        return StepOptions(None, None, 0)


def cleanup_policy(spec: WorkflowSpec, handler: str) -> RetryPolicy:
    """Retry policy of a compensation or hook: the handler class's, the workflow's, the
    global default."""
    policy: RetryPolicy = (cleanup_options(spec, handler).retry or spec.retry
                           or settings.DEFAULT_RETRY)
    return policy


def cleanup_done(run_id: int, spec: WorkflowSpec, now: datetime) -> None:
    """Called in the transaction that finished a cleanup row: start the next one, if any."""
    run = rows.lock_run(run_id, fields=("cleanup",))
    plan = run.cleanup or {}
    position = plan.get("next", 0)
    if position >= len(plan.get("queue", [])):
        Event.objects.create(run_id=run_id, kind="cleanup_finished",
                             data={"cause": plan.get("cause")})
        return
    WorkflowRun.objects.filter(pk=run_id).update(cleanup={**plan, "next": position + 1})
    _cleanup_row(run_id, spec, plan["queue"], position, now)
