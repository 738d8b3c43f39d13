"""Reading runs: ``workflow_status()``, ``list_workflows()``, what a run waits for, and the
counts ``manage.py queuety status`` shows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from queuety import exceptions
from queuety.conf import settings
from queuety.core import agent_limits, resources, waits
from queuety.core import budget as budgets
from queuety.core.definition import ChildStep, WaitStep, WaitWorkflowsStep, WorkflowSpec
from queuety.core.dependencies import WaitWorkflowsSpec
from queuety.core.progress import progress_text
from queuety.core.status import FINISHED, WorkflowStatus
from queuety.models import RunStatus, Signal, StepRun, StepStatus, WorkflowDefinition, WorkflowRun
from queuety.runtime import artifacts
from queuety.runtime.landing import workflow_wait
from queuety.store import groups as group_rows
from queuety.store import leases, rows
from queuety.store.definitions import (
    definition_hash,
    effective_policy,
    find_definition,
    load_spec,
    wait_kinds,
)
from queuety.store.tags import tagged


def wait_info(run: WorkflowRun, spec: WorkflowSpec) -> dict[str, Any]:
    """Return ``wait_type``, ``waiting_for``, ``wait_mode`` and ``wait_details`` of a run."""
    empty = {"wait_type": None, "waiting_for": None, "wait_mode": None, "wait_details": None}
    if run.status not in (RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS) or \
            run.current_step >= len(spec.steps):
        return empty
    step = spec.steps[run.current_step]
    if isinstance(step, ChildStep) and run.status == RunStatus.WAITING_FOR_WORKFLOWS:
        child = (WorkflowRun.objects.filter(parent_id=run.pk, parent_step=run.current_step)
                 .order_by("-pk").values_list("pk", "status").first())
        ids = [str(child[0])] if child else []
        done = child is not None and child[1] in FINISHED
        return {"wait_type": "workflow", "waiting_for": ids, "wait_mode": "all",
                "wait_details": {"step_name": step.name, "matched": ids if done else [],
                                 "remaining": [] if done else ids, "wait_mode": "all"}}
    if isinstance(step, WaitWorkflowsStep) and run.status == RunStatus.WAITING_FOR_WORKFLOWS:
        wait_on = step.workflows
        try:
            ids_found, result = workflow_wait(spec, run.pk, run.current_step, run.state,
                                              run.groups, lock=False)
        except exceptions.InvalidStepOutput:
            ids_found, result = [], None
        details = {"step_name": step.name, "wait_mode": wait_on.mode, "quorum": wait_on.quorum,
                   "group_key": wait_on.group, "state_key": wait_on.state_key,
                   "result_key": wait_on.result_key,
                   **({} if result is None else {k: [str(i) for i in v]
                                                 for k, v in result.details.items()}),
                   **_timing_details(run, wait_on)}
        return {"wait_type": "workflow", "waiting_for": [str(i) for i in ids_found],
                "wait_mode": wait_on.mode,
                "wait_details": {k: v for k, v in details.items() if v is not None}}
    if not isinstance(step, WaitStep):
        return empty
    wait = step.wait
    stored = list(Signal.objects.filter(
        run_id=run.pk, consumed_at__isnull=True, name__in=wait.signals,
    ).order_by("pk").values_list("pk", "name", "payload"))
    progress = waits.evaluate(wait, stored, run.state)
    signal_details: dict[str, Any] = {
        "step_name": step.name, "result_key": wait.result_key, "human_wait": wait.human,
        "match_payload": wait.match_payload or {}, "matched": progress.matched,
        "remaining": progress.remaining, "correlation_key": wait.correlation_key,
        "correlation_value": run.state.get(wait.correlation_key)
        if wait.correlation_key else None,
        "wait_mode": wait.mode, "schema": wait.schema, **_timing_details(run, wait),
    }
    return {"wait_type": "signal", "waiting_for": list(wait.signals), "wait_mode": wait.mode,
            "wait_details": {k: v for k, v in signal_details.items() if v is not None}}


def _timing_details(run: WorkflowRun, wait: waits.WaitSpec | WaitWorkflowsSpec
                    ) -> dict[str, Any]:
    """A wait's timeout (its expiry, as the run row holds it) and reminders (the next one
    due and how many were sent), for the options it has."""
    details: dict[str, Any] = {}
    if wait.timeout is not None:
        details.update(expires_at=None if run.wait_expires_at is None
                       else run.wait_expires_at.isoformat(),
                       timeout_seconds=wait.timeout, on_timeout=wait.on_timeout)
    if waits.first_reminder(wait.remind_after, wait.remind_every) is not None:
        details.update(remind_at=None if run.remind_at is None else run.remind_at.isoformat(),
                       reminders_sent=run.reminders)
    return details


def step_progress(run: WorkflowRun) -> dict[str, Any] | None:
    """The progress the run's running step last reported (``context.heartbeat(progress=)``):
    of its branch or item that reported last, for a fan-out step. ``None`` when no step of
    the run is running or none reported progress."""
    if run.status != RunStatus.RUNNING:
        return None
    row = (StepRun.objects.filter(run_id=run.pk, kind="step", status=StepStatus.PROCESSING,
                                  step_index=run.current_step, progress__isnull=False)
           .order_by("-heartbeat_at").values("step_name", "branch", "progress",
                                             "heartbeat_at").first())
    if row is None:
        return None
    reported = row["heartbeat_at"]
    return {"step_name": row["step_name"], "branch": row["branch"], "data": row["progress"],
            "text": progress_text(row["progress"]),
            "reported_at": None if reported is None else reported.isoformat()}


def status_of(run: WorkflowRun) -> WorkflowStatus:
    """The :class:`WorkflowStatus` of a run row (its definition read from the cache)."""
    try:
        spec = load_spec(run.definition_id)
    except exceptions.WorkflowDefinitionError:
        return _status_unloadable(run)
    finished = run.current_step >= len(spec.steps)
    keys = artifacts.summary(run.pk)
    return WorkflowStatus(
        id=run.pk, name=run.name, status=run.status, current_step=run.current_step,
        total_steps=run.total_steps,
        current_step_name=None if finished else spec.steps[run.current_step].name,
        state=run.state, error=run.error, definition_hash=spec.definition_hash,
        definition_version=spec.version, idempotency_key=run.idempotency_key,
        budget=budgets.summary(spec.budget, budgets.Usage(
            run.transitions, run.cost_units, run.started_workflows,
            budgets.state_bytes(run.state))),
        retry_policy=None if finished or spec.steps[run.current_step].kind != "task"
        else effective_policy(spec, run.current_step).describe(),
        **wait_info(run, spec), progress=step_progress(run),
        artifact_count=len(keys), artifact_keys=keys,
        throttled_by=None if finished else throttled_by(run, spec), tags=run.tags,
        created_at=run.created_at, updated_at=run.updated_at, finished_at=run.finished_at,
    )


def throttled_by(run: WorkflowRun, spec: WorkflowSpec) -> dict[str, Any] | None:
    """Why the run's current step waits for resources (its row's ``throttled_by``: a
    concurrency group's throttle, or a worker's memory deferral), or None. Read for a running
    run at a step workers run (the worker's settings, not the reader's, decided it)."""
    if run.status != RunStatus.RUNNING or \
            spec.steps[run.current_step].kind not in ("task", "parallel", "for_each"):
        return None
    record: dict[str, Any] | None = (
        StepRun.objects.filter(run_id=run.pk, kind="step", step_index=run.current_step,
                               status__in=(StepStatus.THROTTLED, StepStatus.PENDING),
                               throttled_by__isnull=False)
        .order_by("-pk").values_list("throttled_by", flat=True).first())
    return record


def resource_groups(now: Any = None) -> list[dict[str, Any]]:
    """Every concurrency group with a step in flight, woken or waiting: ``group``,
    ``in_flight``, ``limit``, ``waiting``, ``woken``, ``running_cost``, ``cost_budget``,
    ``rate_limit`` (``[starts, seconds]`` or None) and ``recent_starts`` in its window.

    Limits are the site's settings, else those of the step a live row of the group runs.
    """
    now = now or timezone.now()
    found = []
    for row in group_rows.overview():
        limits = _group_limits(row["group"])
        rate = None if limits is None else limits.rate
        found.append({
            "group": row["group"], "in_flight": row["in_flight"],
            "limit": None if limits is None else limits.concurrency,
            "waiting": row["waiting"], "woken": row["woken"], "running_cost": row["cost"],
            "cost_budget": None if limits is None else limits.group_cost,
            "rate_limit": None if rate is None else [rate[0], rate[1]],
            "recent_starts": None if rate is None
            else group_rows.recent_starts(row["group"], resources.rate_window(rate[1]), now),
        })
    found.extend(_lease_groups(now))
    return sorted(found, key=lambda row: row["group"])


def _lease_groups(now: Any) -> list[dict[str, Any]]:
    """The groups whose slots running steps hold for part of their body (an agent's model
    requests, ``queuety.store.leases``), with the limits of ``QUEUETY["AGENT_LIMITS"]``."""
    found = []
    for group, held in sorted(leases.holding().items()):
        limit = agent_limits.limit_for(settings.AGENT_LIMITS,
                                       group.removeprefix(agent_limits.GROUP_PREFIX))
        rate = limit.rate
        found.append({
            "group": group, "in_flight": held, "limit": limit.concurrency, "waiting": 0,
            "woken": 0, "running_cost": 0, "cost_budget": None,
            "rate_limit": None if rate is None else [rate[0], rate[1]],
            "recent_starts": None if rate is None
            else group_rows.recent_starts(group, resources.rate_window(rate[1]), now)})
    return found


def queue_budgets() -> list[dict[str, Any]]:
    """Every queue with a cost budget (``QUEUETY["QUEUE_COST_BUDGETS"]``), and any other with a
    step still holding or waiting for one: ``queue``, ``budget`` (None once the setting is
    gone), ``running`` (steps admitted or woken), ``running_cost`` and ``waiting``, by name."""
    live = group_rows.queue_overview()
    budgets = settings.QUEUE_COST_BUDGETS
    return [{"queue": name, "budget": budgets.get(name),
             **live.get(name, {"running": 0, "running_cost": 0, "waiting": 0})}
            for name in sorted(set(budgets) | set(live))]


def _group_limits(group: str) -> resources.Limits | None:
    sample = (StepRun.objects.filter(concurrency_group=group)
              .exclude(status__in=(StepStatus.COMPLETED, StepStatus.FAILED,
                                   StepStatus.CANCELLED))
              .values_list("run__definition_id", "step_index").first())
    if sample is None:
        return None
    try:
        step = load_spec(sample[0]).steps[sample[1]]
    except exceptions.WorkflowDefinitionError:
        return None
    return resources.limits_for(
        group=group, step_limit=step.concurrency_limit, step_rate=step.rate_limit,
        cost=step.cost_units, queue=None,
        tables={key: getattr(settings, key) for key in (
            "CONCURRENCY_LIMITS", "RATE_LIMITS", "GROUP_COST_BUDGETS", "QUEUE_COST_BUDGETS")})


def _status_unloadable(run: WorkflowRun) -> WorkflowStatus:
    """The status of a run whose definition this process cannot load (a deploy removed a
    class its retry policies name, say): what the rows say, without step details."""
    stored = WorkflowDefinition.objects.values("definition", "definition_hash").get(
        pk=run.definition_id)
    steps = stored["definition"].get("steps") or []
    return WorkflowStatus(
        id=run.pk, name=run.name, status=run.status, current_step=run.current_step,
        total_steps=run.total_steps,
        current_step_name=steps[run.current_step].get("name")
        if run.current_step < len(steps) else None,
        state=run.state, error=run.error, definition_hash=stored["definition_hash"],
        definition_version=stored["definition"].get("version"),
        idempotency_key=run.idempotency_key, budget=None, retry_policy=None,
        wait_type=None, waiting_for=None, wait_mode=None, wait_details=None,
        artifact_count=len(keys := artifacts.summary(run.pk)), artifact_keys=keys,
        tags=run.tags, created_at=run.created_at, updated_at=run.updated_at,
        finished_at=run.finished_at)


def workflow_status(run_id: int) -> WorkflowStatus:
    """Return the status of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
    """
    return status_of(rows.get_run(run_id))


def list_workflows(status: str | None = None, limit: int = 50,
                   among: QuerySet[WorkflowRun] | None = None,
                   tags: Mapping[str, str] | None = None) -> list[WorkflowStatus]:
    """Return the newest runs first, optionally only those with ``status`` and carrying
    every one of ``tags``; only runs of ``among`` when given (a user's scope,
    ``queuety.scope``).

    Raises:
        ValueError: ``status`` is not a run status, a tag is invalid, or ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1 (got {limit}).")
    runs = (WorkflowRun.objects.all() if among is None else among).order_by("-pk")
    if status is not None:
        if status not in tuple(RunStatus):
            raise ValueError(
                f"Unknown status {status!r}; use one of {', '.join(RunStatus)}."
            )
        runs = runs.filter(status=status)
    return [status_of(run) for run in runs.filter(tagged(tags or {}))[:limit]]


def overview() -> dict[str, Any]:
    """Counts of runs per status and the age of the oldest due pending step (``status``)."""
    counts = dict(WorkflowRun.objects.values_list("status").annotate(n=Count("pk"))
                  .values_list("status", "n"))
    oldest = StepRun.objects.filter(status=StepStatus.PENDING,
                                    available_at__lte=timezone.now()).aggregate(
        oldest=Min("available_at"))["oldest"]
    age = None if oldest is None else round((timezone.now() - oldest).total_seconds(), 3)
    return {"runs": {status.value: counts.get(status, 0) for status in RunStatus},
            "oldest_pending_step_age_seconds": age}


def waiting_on(kinds: Iterable[str]) -> Q:
    """Return a filter for runs parked at a wait of one of ``kinds`` (``approval``,
    ``decision``, ``input``, ``signal``).

    It is expressed on the run row alone (status, definition, current step), so it uses the
    ``(status, -id)`` index and needs no join.
    """
    kinds = set(kinds)
    where = Q(pk__in=[])  # matches nothing; OR-ed away as soon as one definition matches
    for definition_pk, steps in sorted(wait_kinds().items()):
        indices = sorted(index for index, kind in steps.items() if kind in kinds)
        if indices:
            where |= Q(definition_id=definition_pk, current_step__in=indices)
    return Q(status=RunStatus.WAITING_FOR_SIGNAL) & where


#: What ``runs_matching(waiting=...)`` accepts, besides true and false.
WAIT_KINDS = ("approval", "decision", "input", "signal", "workflows")
#: The waits a person answers (``waiting=person``: any of them, the admin's "a person").
PERSON_WAITS = ("approval", "decision", "input")
WAITING = (RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS)


def runs_matching(*, status: str | None = None, workflow: str | None = None,
                  version: str | None = None, waiting: str | None = None,
                  definition: str | int | None = None, older_than: timedelta | None = None,
                  error_type: str | None = None, as_of: datetime | None = None,
                  tags: Mapping[str, str] | None = None) -> QuerySet[WorkflowRun]:
    """Runs newest first, filtered on the run row only, so the ``(status, -id)``, name and
    definition indexes serve them (``GET runs/``).

    ``version`` is a definition's ``.version()`` label (of ``workflow`` if given);
    ``waiting`` is ``true``/``false`` (waiting for anything, or not) or a kind of wait:
    ``approval``, ``decision``, ``input``, ``person`` (any of those three), ``signal`` (any
    signal wait) or ``workflows``;
    ``tags``: runs carrying every one of these tags (the GIN index ``queuety_run_tags``).
    ``definition`` a stored definition's id, hash or hash prefix (of ``workflow`` if given:
    what ``GET runs/`` answers as ``definition_hash``); ``older_than`` runs created more than
    this long before ``as_of`` (default now); ``error_type`` runs whose recorded error (a
    failed run's ``error``) is of this exception type, as it is stored: ``ValueError`` for a
    builtin, ``module.Class`` otherwise.

    Raises:
        ValueError: an unknown status or kind of wait, or a negative ``older_than``, saying
            which values are allowed.
        UnknownDefinition: ``definition`` names no stored definition (of ``workflow``).
    """
    for what, value in (("status", status), ("workflow", workflow), ("version", version),
                        ("waiting", waiting), ("definition", definition),
                        ("error_type", error_type)):
        if isinstance(value, str) and "\x00" in value:  # PostgreSQL text holds no NUL character
            raise ValueError(f"The {what} filter contains a NUL character; no run has one.")
    # A page of summaries needs none of the big JSON columns (the state above all).
    runs = WorkflowRun.objects.order_by("-pk").defer("state", "state_writes", "error",
                                                     "cleanup", "groups", "loops")
    if status is not None:
        if status not in tuple(RunStatus):
            raise ValueError(f"Unknown status {status!r}; use one of {', '.join(RunStatus)}.")
        runs = runs.filter(status=status)
    if workflow is not None:
        runs = runs.filter(name=workflow)
    if version is not None:
        definitions = WorkflowDefinition.objects.filter(definition__version=version)
        if workflow is not None:
            definitions = definitions.filter(name=workflow)
        runs = runs.filter(definition_id__in=list(definitions.values_list("pk", flat=True)))
    runs = _narrowed(runs, workflow, definition, older_than, error_type, as_of)
    if waiting is not None:
        runs = _waiting(runs, waiting)
    return runs.filter(tagged(tags or {}))


def _waiting(runs: QuerySet[WorkflowRun], waiting: str) -> QuerySet[WorkflowRun]:
    """``runs_matching``'s ``waiting`` filter (see it)."""
    wanted = waiting.lower()
    if wanted in ("true", "1", "yes"):
        return runs.filter(status__in=WAITING)
    if wanted in ("false", "0", "no"):
        return runs.filter(status__in=[each for each in RunStatus if each not in WAITING])
    if wanted == "workflows":
        return runs.filter(status=RunStatus.WAITING_FOR_WORKFLOWS)
    if wanted == "signal":
        return runs.filter(status=RunStatus.WAITING_FOR_SIGNAL)
    if wanted in WAIT_KINDS:
        return runs.filter(waiting_on([wanted]))
    if wanted == "person":
        return runs.filter(waiting_on(PERSON_WAITS))
    raise ValueError(f"Unknown waiting filter {waiting!r}; use true, false, person or "
                     f"one of {', '.join(WAIT_KINDS)}.")


def _narrowed(runs: QuerySet[WorkflowRun], workflow: str | None,
              definition: str | int | None, older_than: timedelta | None,
              error_type: str | None, as_of: datetime | None) -> QuerySet[WorkflowRun]:
    """``runs_matching``'s definition, age and error-type filters (see it)."""
    if definition is not None:
        runs = runs.filter(definition_id=find_definition(definition, name=workflow).pk)
    if older_than is not None:
        if older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative (got {older_than}).")
        runs = runs.filter(created_at__lt=(as_of or timezone.now()) - older_than)
    if error_type is not None:
        # The run's error is a JSON record ({"type": ..., "message": ...}); narrowed by the
        # status index first wherever the caller gives a status, so no index of its own.
        runs = runs.filter(error__type=error_type)
    return runs


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """An ``older_than`` as the API and the CLI take it: a number of seconds, or a number
    followed by ``s``, ``m``, ``h``, ``d`` or ``w`` (``7d``, ``12h``, ``90m``).

    Raises:
        ValueError: any other text, saying what is accepted.
    """
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in _UNITS else "s"
    number = value[:-1] if value[-1:] in _UNITS else value
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if not number or amount < 0 or amount != amount or amount == float("inf"):
        raise ValueError(f"older_than {text!r} is not an age; give a number of seconds or a "
                         "number with a unit s, m, h, d or w (such as 7d or 12h).")
    return timedelta(seconds=amount * _UNITS[unit])


def run_summary(run: WorkflowRun) -> dict[str, Any]:
    """A run as a list shows it: its row and its definition's hash and version, without its
    state (one row read; the definition comes from the cache)."""
    try:
        spec: WorkflowSpec | None = load_spec(run.definition_id)
    except exceptions.WorkflowDefinitionError:
        spec = None
    finished = spec is None or run.current_step >= len(spec.steps)
    return {
        "id": run.pk, "name": run.name, "status": run.status,
        "current_step": run.current_step, "total_steps": run.total_steps,
        "current_step_name": None if finished or spec is None
        else spec.steps[run.current_step].name,
        "definition_hash": definition_hash(run.definition_id),
        "definition_version": spec.version if spec is not None else None,
        "idempotency_key": run.idempotency_key, "parent_id": run.parent_id,
        "tags": run.tags, "created_at": run.created_at, "updated_at": run.updated_at,
        "finished_at": run.finished_at,
    }
