"""The words Queuety describes steps and runs with: one vocabulary for every surface.

The admin, the ``manage.py queuety`` CLI and the API all tell a person what a step does, what a
run waits for, how long something took and where a run stands. They take those words from
here, so a run reads the same wherever it is looked at:

- :func:`human_duration`: a duration as a person reads it (``3 min 2 s``);
- :func:`describe_step`: what one step does, in one line (the run page's definition table);
- :func:`waiting_label`: what a run waits for, in a few words (the runs changelist);
- :func:`format_status`: the lines of ``workflow status`` text output, labelled as in
  ``wp queuety workflow status``.

Pure: stdlib and the core only (no Django, Celery or DRF), so it is unit-tested without a
database and any surface can import it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from queuety.core.definition import (
    ChildStep,
    DelayStep,
    ForEachStep,
    ParallelStep,
    RepeatStep,
    StartStep,
    StepSpec,
    WaitStep,
    WaitWorkflowsStep,
    WorkflowSpec,
)
from queuety.core.status import RunStatus, WorkflowStatus


def human_duration(seconds: float) -> str:
    """Return a duration as a person reads it: ``0.4 s``, ``3 min 2 s``, ``2 d 5 h``.

    Below 10 s one decimal is kept; then whole seconds, minutes, hours (below 48 h) and days,
    each with the next smaller unit. Negative durations (clock skew) read ``0.0 s``.
    """
    if seconds < 10:
        return f"{max(seconds, 0):.1f} s"
    if seconds < 60:
        return f"{int(seconds)} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def waiting_label(status: str, current_step: int, spec: WorkflowSpec) -> str:
    """Return what a run waits for, in a few words (``""`` when it is not waiting).

    ``status`` and ``current_step`` are the run's; ``spec`` is its definition. A run waits for
    child workflows, a delay (while it sleeps at a ``delay`` step), a person (a human wait)
    or signals (``signal: a, b``, with ``(any)`` when one of several is enough).
    """
    if status == RunStatus.WAITING_FOR_WORKFLOWS:
        return "child workflows"
    if current_step >= len(spec.steps):
        return ""
    step = spec.steps[current_step]
    if status == RunStatus.RUNNING and isinstance(step, DelayStep):
        return f"a delay of {human_duration(step.delay_seconds)}"
    wait = step.wait
    if status != RunStatus.WAITING_FOR_SIGNAL or wait is None:
        return ""
    if wait.human:
        return f"{wait.human} (a person)"
    names = ", ".join(wait.signals)
    return f"signal: {names}" + (" (any)" if wait.mode == "any" and len(wait.signals) > 1
                                 else "")


def describe_step(step: StepSpec, shown: Callable[[str], str] = str) -> str:
    """Return what a step does, in one line (the run page's definition table).

    Task steps read as their handler's dotted path, followed by their fan-out or routes;
    the other kinds say what they do (``sleep 5 min 0 s``, ``signals: paid``, ...). Each
    handler path is written as ``shown(path)`` (the admin: ``old → new`` when aliased).
    """
    match step:
        case WaitStep(wait=wait):
            who = f"{wait.human} from a person: " if wait.human else "signals: "
            return who + ", ".join(wait.signals) + (
                " (any)" if wait.mode == "any" and len(wait.signals) > 1 else "")
        case DelayStep():
            return f"sleep {human_duration(step.delay_seconds)}"
        case RepeatStep(repeat=loop):
            test = shown(loop["condition"]) if loop.get("condition") else \
                f"state[{loop.get('state_key')!r}] == " \
                f"{json.dumps(loop.get('expected'))}"
            limit = (f", at most {loop['max_iterations']} times" if loop.get("max_iterations")
                     else "")
            return f"back to {loop.get('target')} {loop.get('mode')} {test}{limit}"
        case ChildStep():
            restart = f"; restarted by {step.retry.describe()}" if step.retry else ""
            return f"child workflow {step.name} ({len(step.child['steps'])} steps){restart}"
        case StartStep(start=start, child=child):
            group = f", group {start.group!r}" if start.group else ""
            return (f"start a {child['name']} run per item of state[{start.items_key!r}]"
                    f" → state[{start.result_key!r}]{group}")
        case WaitWorkflowsStep(workflows=on):
            which = (f"runs {', '.join(map(str, on.ids))}" if on.ids is not None else
                     f"group {on.group!r}" if on.group else
                     f"the runs in state[{on.state_key!r}]")
            quorum = f" {on.quorum}" if on.quorum else ""
            return f"wait for {which}: {on.mode}{quorum}"
    limit = (f", at most {step.fanout.max_concurrency} at once"
             if step.fanout is not None and step.fanout.max_concurrency else "")
    if isinstance(step, ParallelStep):
        return "in parallel: " + ", ".join(map(shown, step.fanout.branches)) + limit
    text = shown(step.handler)
    if isinstance(step, ForEachStep):
        quorum = f" {step.fanout.quorum}" if step.fanout.quorum else ""
        text += (f" for each item of state[{step.fanout.items_key!r}], join "
                 f"{step.fanout.mode}{quorum}{limit}")
    if step.routes is not None:
        routes = [f"{label} → {target}" for label, target in step.routes.items()]
        if step.default_route:
            routes.append(f"otherwise → {step.default_route}")
        text += "; routes " + ", ".join(routes)
    return text


def tags_text(tags: dict[str, str]) -> str:
    """A run's tags in one line, by key: ``customer=42, plan=pro`` (``-`` for none)."""
    return ", ".join(f"{key}={value}" for key, value in sorted(tags.items())) or "-"


def format_status(status: WorkflowStatus) -> list[str]:
    """Return the lines of ``workflow status`` text output (labels as in ``wp queuety``).

    One ``Label:   value`` line per field that is set; the public state, if any, comes last as
    indented JSON under ``State:``. The admin's run page shows the same lines (without the
    state, which it shows on its own).
    """
    lines = [
        f"Workflow: {status.name} (#{status.id})",
        f"Status:   {status.status}",
        f"Step:     {status.current_step}/{status.total_steps}",
    ]
    if status.current_step_name is not None:
        lines.append(f"StepName: {status.current_step_name}")
    if status.definition_version is not None:
        lines.append(f"Version:  {status.definition_version}")
    lines.append(f"Hash:     {status.definition_hash}")
    if status.idempotency_key is not None:
        lines.append(f"Key:      {status.idempotency_key}")
    lines += [f"Tags:     {tags_text(status.tags)}"] if status.tags else []
    if status.wait_type is not None and status.waiting_for:
        lines.append(f"Waiting:  {status.wait_type} => {', '.join(status.waiting_for)}")
    if status.wait_mode is not None:
        lines.append(f"WaitMode: {status.wait_mode}")
    if status.wait_details is not None:
        if status.wait_details.get("expires_at"):
            lines.append(f"Expires:  {status.wait_details['expires_at']} (on timeout: "
                         f"{status.wait_details.get('on_timeout')})")
        lines.append(f"WaitInfo: {json.dumps(status.wait_details, separators=(',', ':'))}")
    if status.progress is not None:
        branch = f" [item {status.progress['branch']}]" if status.progress.get("branch") else ""
        lines.append(f"Progress: {status.progress['text'] or '-'}{branch} "
                     f"(step {status.progress['step_name']!r}, "
                     f"at {status.progress['reported_at']})")
    if status.throttled_by is not None:
        lines.append(f"Throttled: {throttle_words(status.throttled_by)}")
    if status.budget is not None:
        lines.append(f"Budget:   {json.dumps(status.budget, separators=(',', ':'))}")
    if status.retry_policy is not None and status.status not in ("completed", "cancelled"):
        lines.append(f"Retry:    {status.retry_policy}")
    if status.error:
        error = status.error
        where = f" (step {error.get('step')!r}, attempt {error.get('attempt')}" \
                f"/{error.get('max_attempts')})" if error.get("step") else ""
        lines.append(f"Error:    {error.get('type')}: {error.get('message')}{where}")
    if status.artifact_count:  # the original prints "Artifacts: 0" too; here, only when some
        lines.append(f"Artifacts: {status.artifact_count}")
        lines.append(f"ArtifactKeys: {', '.join(status.artifact_keys)}")
    if status.state:
        lines.append("State:")
        lines.append(_json(status.state))
    return lines


def _json(value: Any) -> str:
    # As the CLI prints JSON (``manage.py queuety ... --format json``): 4-space indent, UTF-8.
    return json.dumps(value, indent=4, ensure_ascii=False, default=str)


def throttle_words(record: dict[str, Any]) -> str:
    """One line saying why a step waits for resources (its ``throttled_by``), as the CLI and
    the admin show it: ``group 'openai': concurrency 8/8 in flight``."""
    reason = record.get("reason")
    where = (f"group {record.get('group')!r}" if record.get("group")
             else f"queue {record.get('queue')!r}" if reason == "queue_cost" else "worker")
    if reason == "concurrency":
        detail = f"concurrency {record.get('in_flight')}/{record.get('limit')} in flight"
    elif reason == "rate":
        detail = (f"rate {record.get('starts')}/{record.get('limit')} starts in "
                  f"{record.get('per_seconds'):g} s")
    elif reason in ("group_cost", "queue_cost"):
        budget = f"queue {record.get('queue')!r} " if reason == "queue_cost" and \
            record.get("group") else ""
        detail = (f"{budget}cost budget {record.get('running_cost')} running + "
                  f"{record.get('cost')} > {record.get('budget')}")
    elif reason == "memory":
        detail = f"deferred: {record.get('detail')}"
    else:
        detail = str(reason)
    return f"{where}: {detail}"
