"""Moving live runs onto another definition of their workflow: ``queuety.migrate_runs()``.

Each run moves in a transaction of its own, under its row lock, at a step boundary (see
:mod:`queuety.core.moves` for what each kind of run does): at rest, it moves now; parked at a
signal wait, it keeps its wait if the mapped step is the same kind of wait; in the middle of a
step, its move is recorded on its row and made by the landing that ends the step. A run that
cannot move, or whose state function raises, is reported with the reason and left unchanged.
The dry run decides the same for every run, runs the state function on a copy, and changes
nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from queuety import exceptions, registry
from queuety.core import landing, moves
from queuety.core.definition import WaitStep, WorkflowSpec
from queuety.core.imports import dotted_path, import_path
from queuety.core.status import StepStatus
from queuety.models import Event, StepRun, WorkflowRun
from queuety.runtime import moves as run_moves
from queuety.runtime.landing import land
from queuety.store import rows
from queuety.store.definitions import definition_id, find_definition, load_spec

#: What happened to a run (in a dry run: what would).
MOVED, IN_PLACE, AT_BOUNDARY, SKIPPED, FAILED = (
    "moved", "moved_in_place", "at_boundary", "skipped", "failed")

StateFunction = Callable[[dict[str, Any], WorkflowRun], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class RunMove:
    """One run's part in a migration."""

    run_id: int
    status: str
    """Its status before the migration."""
    step: str | None
    """The step it stood at."""
    outcome: str
    """``moved`` (now), ``moved_in_place`` (a wait kept), ``at_boundary`` (when its current
    step ends), ``skipped`` (it cannot move: :attr:`reason`) or ``failed`` (its state function
    raised or returned no state); in a dry run, what would happen."""
    reason: str
    to_step: str | None = None
    state_diff: dict[str, Any] | None = None
    """What the state function changed (``added``, ``removed``, ``changed``)."""


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What ``migrate_runs()`` did (or, with ``dry_run``, would do) to each run."""

    workflow: str
    to_hash: str
    to_definition: int
    dry_run: bool
    runs: tuple[RunMove, ...] = field(default=())

    @property
    def counts(self) -> dict[str, int]:
        """How many runs had each outcome."""
        found = dict.fromkeys((MOVED, IN_PLACE, AT_BOUNDARY, SKIPPED, FAILED), 0)
        for run in self.runs:
            found[run.outcome] += 1
        return found

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape the CLI prints with ``--json``."""
        return {"workflow": self.workflow, "to_hash": self.to_hash,
                "to_definition": self.to_definition, "dry_run": self.dry_run,
                "counts": self.counts, "runs": [asdict(run) for run in self.runs]}


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """A migration's inputs, checked (:func:`plan_migration`)."""

    to_pk: int
    to: WorkflowSpec
    step_map: dict[str, str]
    state: StateFunction | None
    state_path: str | None
    """Where a worker imports the state function from (``None``: it cannot)."""
    by: str
    source_pk: int | None = None
    """Only runs of this definition move (``from_definition``)."""

    def pending(self) -> dict[str, Any]:
        """The move as a run row records it until its boundary (``WorkflowRun.migration``)."""
        return {"to": self.to_pk, "step_map": self.step_map, "state": self.state_path,
                "by": self.by}


def migrate_runs(workflow: str, to: str | int | WorkflowSpec = "latest", *,
                 from_definition: str | int | None = None,
                 step_map: Mapping[str, str] | None = None,
                 state: StateFunction | str | None = None,
                 runs: Iterable[int] | None = None, dry_run: bool = False,
                 actor: str = "") -> MigrationReport:
    """Move the live runs of ``workflow`` onto definition ``to``.

    Args:
        to: ``"latest"`` (the definition registered for ``workflow`` now), a definition's
            hash, hash prefix or id, or a ``WorkflowSpec`` of the workflow.
        from_definition: only the runs of this definition (hash, prefix or id).
        step_map: ``{old step name: new step name}`` where a name changed; other steps map
            by name.
        state: ``state(state, run) -> state``, called with a copy of each run's state and
            its ``WorkflowRun``; a callable or a dotted path. A run moved at its boundary
            runs it in the worker then, so it must be importable (a module-level function).
        runs: only these run ids.
        dry_run: decide and report, run the state function on a copy, change nothing.

    Raises:
        UnknownDefinition: ``to`` or ``from_definition`` names no definition of ``workflow``.
        UnknownWorkflow: ``to="latest"`` and nothing is registered as ``workflow``.
        InvalidMigration: ``step_map`` names a step that is in no definition of the runs, or
            one ``to`` lacks; or ``state`` does not import. Nothing was changed.
    """
    source_pk = None if from_definition is None else \
        find_definition(from_definition, name=workflow).pk
    plan = plan_migration(workflow, to, step_map, state, actor, source_pk)
    # Runs on ``to`` already are left alone, unless a move elsewhere is pending (cancelled).
    candidates = WorkflowRun.objects.filter(
        Q(name=workflow) & (~Q(definition_id=plan.to_pk) | Q(migration__isnull=False)))
    if source_pk is not None:
        candidates = candidates.filter(definition_id=source_pk)
    listed = None if runs is None else sorted(set(runs))
    if listed is None:
        candidates = candidates.filter(status__in=moves.MOVABLE)
    else:
        candidates = candidates.filter(pk__in=listed)
    found_rows = list(candidates.order_by("pk").values_list("pk", "definition_id"))
    ids = [pk for pk, _ in found_rows]
    sources = sorted({definition_pk for _, definition_pk in found_rows})
    moves.check_step_map([load_spec(pk) for pk in sources], plan.to, plan.step_map)
    found = [_unlisted(pk, workflow, plan) for pk in listed or () if pk not in set(ids)]
    if dry_run:
        with transaction.atomic():  # a state function that writes anyway writes nothing
            found += [_decide(WorkflowRun.objects.get(pk=pk), plan, dry_run=True)
                      for pk in ids]
            transaction.set_rollback(True)
    else:
        found += [move_run(pk, plan) for pk in ids]
    return MigrationReport(workflow, plan.to.definition_hash, plan.to_pk, dry_run,
                           tuple(sorted(found, key=lambda move: move.run_id)))


def plan_migration(workflow: str, to: str | int | WorkflowSpec,
                   step_map: Mapping[str, str] | None = None,
                   state: StateFunction | str | None = None, actor: str = "",
                   source_pk: int | None = None) -> MigrationPlan:
    """Check a migration's inputs once, for :func:`move_run` on each run (``migrate_runs``
    does both; see it for the arguments).

    Raises:
        UnknownDefinition, UnknownWorkflow, InvalidMigration: as ``migrate_runs``.
    """
    if isinstance(to, WorkflowSpec):
        if to.name != workflow:
            raise exceptions.InvalidMigration(
                f"to is a definition of workflow {to.name!r}; runs of {workflow!r} can only "
                f"move to a definition of {workflow!r}.")
        spec, pk = to, definition_id(to)
    elif to == "latest":
        spec = registry.get(workflow).spec
        pk = definition_id(spec)
    else:
        pk = find_definition(to, name=workflow).pk
        spec = load_spec(pk)
    if step_map is not None and not isinstance(step_map, Mapping):
        raise exceptions.InvalidMigration(
            f"step_map must be a dict of old step name to new step name (got "
            f"{type(step_map).__name__}).")
    function, path = _state_function(state)
    return MigrationPlan(pk, spec, dict(step_map or {}), function, path, actor, source_pk)


def _state_function(state: StateFunction | str | None
                    ) -> tuple[StateFunction | None, str | None]:
    """The state function and the path a worker imports it from (``None``: it cannot)."""
    if state is None:
        return None, None
    if isinstance(state, str):
        try:
            function = import_path(state)
        except ImportError as error:
            raise exceptions.InvalidMigration(
                f"The state function {state!r} does not import: {error}. Give the dotted path "
                "of a module-level function, such as 'myapp.migrations_state.v2_to_v3'.") from None
        if not inspect.isfunction(function):
            raise exceptions.InvalidMigration(
                f"The state function {state!r} is a {type(function).__name__}, not a function "
                "state(state, run) -> state defined in a module.")
        return function, state
    if not callable(state):
        raise exceptions.InvalidMigration(
            f"state must be a function state(state, run) -> state, or its dotted path "
            f"(got {type(state).__name__}).")
    path = dotted_path(state) if inspect.isfunction(state) else None
    try:
        importable = path is not None and "<locals>" not in path and \
            import_path(path) is state
    except ImportError:
        importable = False
    return state, path if importable else None


def _unlisted(run_id: int, workflow: str, plan: MigrationPlan) -> RunMove:
    found = WorkflowRun.objects.filter(pk=run_id).values_list("name", "status",
                                                              "definition_id").first()
    if found is None:
        return RunMove(run_id, "", None, SKIPPED, f"Run {run_id} does not exist.")
    name, status, definition_pk = found
    why = f"Run {run_id} is already on that definition." if definition_pk == plan.to_pk \
        else f"Run {run_id} is a run of {name!r}, not of {workflow!r}."
    return RunMove(run_id, status, None, SKIPPED, why)


def _settled(run: WorkflowRun, plan: MigrationPlan, *, dry_run: bool) -> RunMove | None:
    """The answer for a run whose move is settled before any decision (as locked): on ``to``
    already (a move elsewhere still pending is cancelled), moved off ``from_definition``
    meanwhile, or with this very move pending."""
    if run.definition_id == plan.to_pk:
        if not run.migration:
            return RunMove(run.pk, run.status, None, SKIPPED,
                           f"Run {run.pk} is already on that definition.")
        if not dry_run:
            WorkflowRun.objects.filter(pk=run.pk).update(migration=None,
                                                         revision=F("revision") + 1)
            Event.objects.create(run_id=run.pk, kind="run_migration_cancelled", data={
                "by": plan.by, "to_definition": run.migration.get("to")})
        return RunMove(run.pk, run.status, None, SKIPPED, (
            f"Run {run.pk} is on that definition; the move elsewhere it had pending "
            f"{'would be' if dry_run else 'was'} cancelled."))
    if plan.source_pk is not None and run.definition_id != plan.source_pk:
        return RunMove(run.pk, run.status, None, SKIPPED,
                       f"Run {run.pk} is no longer on definition {plan.source_pk}.")
    asked = plan.pending()
    if run.migration and all(run.migration.get(key) == asked[key]
                             for key in ("to", "step_map", "state")):
        return RunMove(run.pk, run.status, None, AT_BOUNDARY,
                       "This move is already pending: it is made at the run's next boundary.")
    return None


def _decide(run: WorkflowRun, plan: MigrationPlan, *, dry_run: bool) -> RunMove:
    """Decide (and unless ``dry_run``, make) the move of one run."""
    settled = _settled(run, plan, dry_run=dry_run)
    if settled is not None:
        return settled
    run_id = run.pk
    spec = load_spec(run.definition_id)
    verdict = _verdict(run, spec, plan)
    step = spec.steps[run.current_step].name if run.current_step < len(spec.steps) else None
    if not verdict.moves:
        return RunMove(run_id, run.status, step, SKIPPED, verdict.reason)
    if verdict.action == moves.AT_BOUNDARY:
        return _at_boundary(run, step, verdict, plan, dry_run=dry_run)
    try:
        after = run_moves.new_state(plan.state, run.state, run)
    except exceptions.InvalidMigration as error:
        return RunMove(run_id, run.status, step, FAILED, str(error))
    target = plan.to.steps[verdict.target or 0].name
    outcome = IN_PLACE if verdict.action == moves.IN_PLACE else MOVED
    diff = moves.state_diff(run.state, after)
    if not dry_run:
        _apply(run, spec, verdict, plan, after)
    return RunMove(run_id, run.status, step, outcome, verdict.reason, target, diff)


def _verdict(run: WorkflowRun, spec: WorkflowSpec, plan: MigrationPlan) -> moves.Verdict:
    processing = StepRun.objects.filter(run_id=run.pk, kind="step",
                                        status=StepStatus.PROCESSING).exists()
    return moves.decide(spec, plan.to, status=run.status, current_step=run.current_step,
                        step_map=plan.step_map, processing=processing)


def _at_boundary(run: WorkflowRun, step: str | None, verdict: moves.Verdict,
                 plan: MigrationPlan, *,
                 dry_run: bool) -> RunMove:
    if plan.state is not None and plan.state_path is None:
        return RunMove(run.pk, run.status, step, SKIPPED, (
            f"{verdict.reason[:-1]}, but the state function is not importable by a worker "
            "(a lambda or a function defined inside another); give a module-level function "
            "or its dotted path."))
    if not dry_run:
        WorkflowRun.objects.filter(pk=run.pk).update(
            migration={**plan.pending(), "requested_at": timezone.now().isoformat()},
            revision=F("revision") + 1, updated_at=timezone.now())
        Event.objects.create(run_id=run.pk, kind="run_migration_pending", data={
            "by": plan.by, "to_hash": plan.to.definition_hash, "step_map": plan.step_map,
            "reason": verdict.reason})
    target = None if verdict.target is None else plan.to.steps[verdict.target].name
    return RunMove(run.pk, run.status, step, AT_BOUNDARY, verdict.reason, target)


def move_run(run_id: int, plan: MigrationPlan) -> RunMove:
    """Move one run, in a transaction of its own, holding its lock: decided again as locked,
    so a run another migration moved meanwhile is not moved twice."""
    try:
        with transaction.atomic():
            return _decide(rows.lock_run(run_id, steps_first=True), plan, dry_run=False)
    except exceptions.RunNotFound:
        return RunMove(run_id, "", None, SKIPPED, f"Run {run_id} no longer exists.")


def _apply(run: WorkflowRun, spec: WorkflowSpec, verdict: moves.Verdict, plan: MigrationPlan,
           after: dict[str, Any]) -> None:
    """Make a move now (``NOW`` or ``IN_PLACE``), the run locked by this transaction."""
    now = timezone.now()
    target = verdict.target or 0
    loops = run_moves.remap_loops(dict(run.loops or {}), spec, plan.to, plan.step_map)
    in_place = verdict.action == moves.IN_PLACE
    # An in-place move keeps the wait, and the count of transitions that approval links
    # name with its position (``timeline.moved_position`` follows it to the new one).
    event = run_moves.migrated_event(run.pk, spec, plan.to, step=run.current_step,
                                     target=target, before=run.state, after=after,
                                     step_map=plan.step_map, by=plan.by,
                                     **({"in_place": True, "transitions": run.transitions}
                                        if in_place else {}))
    if in_place:
        run_moves.switch(run.pk, plan.to_pk, plan.to, state=after, current_step=target,
                         loops=loops, revision=F("revision") + 1, updated_at=now,
                         wait_expires_at=_expiry(run, plan.to.step_of(target, WaitStep), now))
        event.save()
        return
    rows.stop_live_steps(run.pk, now)
    # A count of its own, as a rewind: the new step's row must not share the cancelled one's.
    run_moves.switch(run.pk, plan.to_pk, plan.to, state=after, loops=loops,
                     transitions=F("transitions") + 1, revision=F("revision") + 1,
                     updated_at=now, wait_expires_at=None)
    moved = rows.lock_run(run.pk, fields=rows.RUN_VIEW_FIELDS)
    land(plan.to, rows.run_view(moved, now), target, [event], landing.mode_of(moved.status))


def _expiry(run: WorkflowRun, wait: WaitStep, now: datetime) -> datetime | None:
    """When the kept wait times out: as before if the new wait has a timeout too, from now if
    only the new one has, never if the new one has none."""
    if wait.wait.timeout is None:
        return None
    return run.wait_expires_at or now + timedelta(seconds=wait.wait.timeout)

