"""Workflow definitions: immutable specs, their canonical JSON and ``definition_hash``.

A definition is what the builder produces and what the database stores. Handlers are kept as
dotted import paths, so any worker that can import the project can run any step.

The hash is the sha256 of the canonical JSON: keys sorted, no whitespace, ASCII only, floats
written by ``repr`` (shortest round-trip form, identical on every CPython >= 3.1). It is therefore
the same across processes, machines and Python versions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from queuety import exceptions
from queuety.core.budget import Budget
from queuety.core.dependencies import StartSpec, WaitWorkflowsSpec
from queuety.core.fanout import FanOutSpec
from queuety.core.retry import RetryPolicy
from queuety.core.waits import WaitSpec

#: Bumped when the JSON shape of a definition changes incompatibly.
DEFINITION_FORMAT = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSpec:
    """One step of a workflow: what every kind has. A step is one of the classes below, one
    per :attr:`kind` (a tagged union: :meth:`from_dict` dispatches on the JSON's ``kind``).

    The fields of the other kinds read as ``None`` here (``handler`` as ``""``), so code that
    asks any step for its ``wait`` or its ``fanout`` keeps working; ``isinstance`` on the class
    gives the kind's own fields their non-optional types.
    """

    kind: ClassVar[str]
    """``task`` (a handler run by a worker), ``wait`` (parks the run until signals come),
    ``delay``, ``parallel``, ``for_each``, ``repeat``, ``child`` (``run_workflow()``),
    ``start`` (``start_workflows()``) or ``wait_workflows`` (``wait_for_workflows()``)."""
    name: str
    """Unique within the workflow; ``_next_step`` jumps resolve by it."""
    retry: RetryPolicy | None = None
    """The step's own policy; ``None`` falls back to the workflow's, then the global default."""
    timeout: float | None = None
    """Seconds an attempt may run before it is interrupted with :class:`~queuety.StepTimeout`."""
    cost_units: int = 1
    """Units added to the run's ``cost_units`` when the step completes (resolved at build)."""
    queue: str | None = None
    """The Celery queue its messages go to (``queue = "llm"`` on the class, or
    ``.then(..., queue=...)``); ``None``: the workflow's queue."""
    compensation: str | None = None
    """Dotted path of the handler that undoes this step (``compensate_with()``)."""
    concurrency_group: str | None = None
    """The group whose limits bound this step across all runs (``"openai"``), perhaps keyed
    by the run's state (``"tenant:{tenant_id}"``). See ``queuety.core.resources``."""
    concurrency_limit: int | None = None
    """Attempts of the group in flight at once, unless ``QUEUETY["CONCURRENCY_LIMITS"]``
    says otherwise."""
    rate_limit: tuple[int, float] | None = None
    """``(starts, seconds)``: at most that many starts in the group in any such period."""
    priority: str | None = None
    """``high``, ``normal`` or ``low`` (``None``: the workflow's, else normal)."""
    transactional: bool = False
    """Task steps only: the body runs inside the transaction that records its outcome, so its
    ORM writes, its output and the transition commit together or not at all."""

    def __post_init__(self) -> None:
        if getattr(type(self), "kind", None) is None:
            raise TypeError(f"{type(self).__name__} is a base of the step classes; build a "
                            "TaskStep, a WaitStep, ... (or use StepSpec.from_dict).")
        if self.transactional is not False and (
                self.kind != "task" or self.transactional is not True):
            raise exceptions.WorkflowDefinitionError(
                f"Step {self.name!r} sets transactional={self.transactional!r}; only a task "
                "step (one given to then() or route()) may be transactional, and the value "
                "is True or False.")

    # -- the fields of the other kinds, absent here ---------------------------------------

    @property
    def handler(self) -> str:
        """Dotted import path of a :class:`~queuety.Step` subclass or a function (``task``
        and ``for_each`` steps); ``""`` for the others."""
        return ""

    @property
    def wait(self) -> WaitSpec | None:
        """For ``wait`` steps: what they wait for."""
        return None

    @property
    def routes(self) -> dict[str, str] | None:
        """For route steps (tasks): label -> target step name (``route()``)."""
        return None

    @property
    def default_route(self) -> str | None:
        """For route steps: the target when the label matches none (``queuety.DEFAULT``)."""
        return None

    @property
    def delay_seconds(self) -> float | None:
        """For ``delay`` steps: how long the run sleeps (durably) there."""
        return None

    @property
    def until(self) -> str | None:
        """For ``delay_until()`` steps: the aware time (ISO 8601, in UTC) the run sleeps to."""
        return None

    @property
    def until_from(self) -> str | None:
        """For ``delay_until()`` steps: dotted path of the callable that returns, from the
        run's state, the aware time the run sleeps to."""
        return None

    @property
    def fanout(self) -> FanOutSpec | None:
        """For ``parallel`` and ``for_each`` steps: what they fan out to."""
        return None

    @property
    def child(self) -> dict[str, Any] | None:
        """For ``child`` and ``start`` steps: the child workflow's definition."""
        return None

    @property
    def start(self) -> StartSpec | None:
        """For ``start`` steps: which items start children, and what the step merges."""
        return None

    @property
    def workflows(self) -> WaitWorkflowsSpec | None:
        """For ``wait_workflows`` steps: which runs to wait for, and how."""
        return None

    @property
    def repeat(self) -> dict[str, Any] | None:
        """For ``repeat`` steps: ``{mode, target, state_key, expected, condition,
        max_iterations}``."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form: one shape for every kind (the absent fields omitted, or
        ``None``, as before there were classes), so stored hashes stay what they were."""
        return {
            "name": self.name,
            "kind": self.kind,
            "handler": self.handler,
            "retry": None if self.retry is None else self.retry.to_dict(),
            "timeout": self.timeout,
            "cost_units": self.cost_units,
            "wait": None if self.wait is None else self.wait.to_dict(),
            "compensation": self.compensation,
            # Only when set, so that definitions without it keep their hashes.
            **({} if self.queue is None else {"queue": self.queue}),
            **({} if self.routes is None else {"routes": self.routes,
                                                "default_route": self.default_route}),
            **({} if self.delay_seconds is None else {"delay_seconds": self.delay_seconds}),
            **{key: value for key, value in (("until", self.until),
                                             ("until_from", self.until_from))
               if value is not None},
            **({} if self.fanout is None else {"fanout": self.fanout.to_dict()}),
            **({} if self.repeat is None else {"repeat": self.repeat}),
            **({} if self.child is None else {"child": self.child}),
            **({} if self.start is None else {"start": self.start.to_dict()}),
            **({} if self.workflows is None else {"workflows": self.workflows.to_dict()}),
            # Stored only when set, so definitions without them keep their hash.
            **{key: value for key, value in (
                ("concurrency_group", self.concurrency_group),
                ("concurrency_limit", self.concurrency_limit),
                ("rate_limit", None if self.rate_limit is None else list(self.rate_limit)),
                ("priority", self.priority)) if value is not None},
            **({"transactional": True} if self.transactional else {}),
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StepSpec:
        """Rebuild a step from :meth:`to_dict` output, as the class its ``kind`` names.

        Raises:
            WorkflowDefinitionError: the kind is unknown, a field the kind needs is missing,
                or a field of another kind is set.
        """
        kind = data.get("kind", "task")
        cls = STEP_KINDS.get(kind)
        if cls is None:
            raise exceptions.WorkflowDefinitionError(
                f"Step {data.get('name')!r} has kind {kind!r}, which is none of "
                f"{', '.join(map(repr, STEP_KINDS))}.")
        own = {name: value for name, value in _kind_fields(data).items()
               if name in _OWN[kind]}
        stray = sorted(name for name, value in _kind_fields(data).items()
                       if name not in _OWN[kind] and value not in (None, ""))
        missing = sorted(name for name in _OWN[kind] - _OPTIONAL
                         if own.get(name) in (None, ""))
        if stray or missing:
            raise exceptions.WorkflowDefinitionError(
                f"Step {data.get('name')!r} of kind {kind!r} "
                + (f"sets {', '.join(stray)}, which it has not" if stray else "")
                + (" and " if stray and missing else "")
                + (f"lacks {', '.join(missing)}" if missing else "") + ".")
        retry = data.get("retry")
        return cls(
            name=data["name"],
            retry=None if retry is None else RetryPolicy.from_dict(retry),
            timeout=data.get("timeout"),
            cost_units=data.get("cost_units", 1),
            queue=data.get("queue"),
            compensation=data.get("compensation"),
            concurrency_group=data.get("concurrency_group"),
            concurrency_limit=data.get("concurrency_limit"),
            rate_limit=None if data.get("rate_limit") is None
            else (int(data["rate_limit"][0]), float(data["rate_limit"][1])),
            priority=data.get("priority"),
            transactional=data.get("transactional", False),
            **{name: value for name, value in own.items() if value is not None},
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStep(StepSpec):
    """A handler run by a worker; with :attr:`routes`, a route step (``route()``)."""

    kind: ClassVar[str] = "task"
    handler: str
    routes: dict[str, str] | None = None
    default_route: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitStep(StepSpec):
    """Parks the run until signals come (``wait_for_signal()`` and the like)."""

    kind: ClassVar[str] = "wait"
    wait: WaitSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class DelayStep(StepSpec):
    """The run sleeps (durably) ``delay_seconds`` here (``delay()``), or until the time
    :attr:`until` names or :attr:`until_from` returns (``delay_until()``)."""

    kind: ClassVar[str] = "delay"
    delay_seconds: float
    until: str | None = None
    until_from: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FanOutStep(StepSpec):
    """A step that fans out to rows of its own, one per branch or item, and joins them: a
    :class:`ParallelStep` or a :class:`ForEachStep` (no kind of its own)."""

    fanout: FanOutSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelStep(FanOutStep):
    """Its :attr:`fanout`'s branches run at once, each its own task (``parallel()``)."""

    kind: ClassVar[str] = "parallel"


@dataclass(frozen=True, slots=True, kw_only=True)
class ForEachStep(FanOutStep):
    """``handler`` runs once per item of a state key, each its own task (``for_each()``)."""

    kind: ClassVar[str] = "for_each"
    handler: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RepeatStep(StepSpec):
    """Goes back to an earlier step until (or while) a condition holds."""

    kind: ClassVar[str] = "repeat"
    repeat: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildStep(StepSpec):
    """Runs the workflow :attr:`child` as a child run and merges its state
    (``run_workflow()``)."""

    kind: ClassVar[str] = "child"
    child: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class StartStep(StepSpec):
    """Starts one run of :attr:`child` per item and goes on (``start_workflows()``)."""

    kind: ClassVar[str] = "start"
    child: dict[str, Any]
    start: StartSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitWorkflowsStep(StepSpec):
    """Parks the run until other runs finish (``wait_for_workflows()``)."""

    kind: ClassVar[str] = "wait_workflows"
    workflows: WaitWorkflowsSpec


S = TypeVar("S", bound=StepSpec)


def timing_of(step: StepSpec) -> WaitSpec | WaitWorkflowsSpec | None:
    """The options of a wait step that say when it times out and reminds (a signal wait's
    or a workflow wait's, which have the same ones); ``None`` for a step that is no wait."""
    if step.wait is not None:
        return step.wait
    return step.workflows

#: The class of each step kind.
STEP_KINDS: dict[str, type[StepSpec]] = {cls.kind: cls for cls in (
    TaskStep, WaitStep, DelayStep, ParallelStep, ForEachStep, RepeatStep, ChildStep, StartStep,
    WaitWorkflowsStep)}

#: The fields of each kind beyond the common ones (those :meth:`StepSpec.from_dict` checks).
_OWN: dict[str, frozenset[str]] = {
    kind: frozenset(f.name for f in fields(cls)) - {f.name for f in fields(StepSpec)}
    for kind, cls in STEP_KINDS.items()}
_OPTIONAL = frozenset({"routes", "default_route", "until", "until_from"})


def _kind_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The kind-specific fields of a step's JSON, decoded (absent ones as ``None``)."""
    wait, fanout_, start, workflows = (data.get(key) for key in (
        "wait", "fanout", "start", "workflows"))
    return {
        "handler": data.get("handler", ""),
        "wait": None if wait is None else WaitSpec.from_dict(wait),
        "routes": data.get("routes"),
        "default_route": data.get("default_route"),
        "delay_seconds": data.get("delay_seconds"),
        "until": data.get("until"),
        "until_from": data.get("until_from"),
        "fanout": FanOutSpec.from_dict(fanout_) if fanout_ else None,
        "repeat": data.get("repeat"),
        "child": data.get("child"),
        "start": StartSpec.from_dict(start) if start else None,
        "workflows": WaitWorkflowsSpec.from_dict(workflows) if workflows else None,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowSpec:
    """A whole workflow definition, as built and as stored."""

    name: str
    steps: tuple[StepSpec, ...]
    retry: RetryPolicy | None = None
    """Default policy for steps that set none."""
    queue: str | None = None
    """Celery queue of this workflow's step messages (``None``: ``QUEUETY["QUEUE"]``)."""
    version: str | None = None
    """The label given with ``.version()``, shown by status, admin and exports."""
    budget: Budget = field(default_factory=Budget)
    compensate_on_failure: bool = False
    """Run compensations when the run fails, not only when it is cancelled."""
    on_cancel: str | None = None
    """Dotted path of a handler called (durably) after a cancel's compensations."""
    deadline_seconds: float | None = None
    """The run fails if it has not completed this many seconds after dispatch."""
    on_deadline: str | None = None
    """Dotted path of a handler called (durably) when the deadline fails the run."""
    prune_state_after: int | None = None
    """Drop a state key this many transitions after the one that last wrote it (None: keep)."""
    priority: str | None = None
    """The priority of steps that set none (``with_priority()``): ``high``, ``normal``,
    ``low``."""
    tags: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """Tags of every run dispatched from it (``.with_tags()``; checked by
    ``queuety.core.tags``). No part of the definition: not in :meth:`to_dict`, so not in the
    hash nor stored; a run's tags live on its row."""
    machine: dict[str, Any] | None = None
    """The state machine table ``queuety.machine()`` compiled (``queuety.core.machine``)."""
    _index: dict[str, int] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise exceptions.WorkflowDefinitionError("A workflow needs a non-blank name.")
        if not self.steps:
            raise exceptions.WorkflowDefinitionError(
                f"Workflow {self.name!r} has no steps; add one with .then(step)."
            )
        for position, step in enumerate(self.steps):
            if step.name in self._index:
                raise exceptions.WorkflowDefinitionError(
                    f"Workflow {self.name!r} has two steps named {step.name!r} "
                    f"(positions {self._index[step.name]} and {position}); "
                    "step names must be unique: pass name='...' to tell them apart."
                )
            self._index[step.name] = position
        if self.prune_state_after is not None and (
                isinstance(self.prune_state_after, bool)
                or not isinstance(self.prune_state_after, int) or self.prune_state_after < 1):
            raise exceptions.WorkflowDefinitionError(
                f"prune_state_after of workflow {self.name!r} must be a whole number of steps, "
                f"at least 1 (got {self.prune_state_after!r}).")
        self._check_routes()

    def _check_routes(self) -> None:
        """Refuse route targets that name no step, and steps no path can reach."""
        for step in self.steps:
            timed = timing_of(step)
            target = None if timed is None else timed.timeout_target
            if target is not None and target not in self._index:
                raise exceptions.WorkflowDefinitionError(
                    f"Wait {step.name!r} of workflow {self.name!r} has on_timeout={target!r}, "
                    "which is neither 'fail', 'continue' nor the name of a step; its steps are "
                    f"{', '.join(repr(s.name) for s in self.steps)}.")
        for position, step in enumerate(self.steps):
            if step.repeat and self._index.get(step.repeat["target"], position) >= position:
                raise exceptions.WorkflowDefinitionError(
                    f"Repeat step {step.name!r} of workflow {self.name!r} targets "
                    f"{step.repeat['target']!r}, which must name an earlier step."
                )
        routed = [(step, step.routes) for step in self.steps if step.routes is not None]
        if not routed:
            return
        for step, routes in routed:
            targets = [*routes.values()] + ([step.default_route] if step.default_route
                                            else [])
            unknown = [t for t in targets if t not in self._index]
            if unknown:
                raise exceptions.WorkflowDefinitionError(
                    f"Route step {step.name!r} of workflow {self.name!r} targets "
                    f"{', '.join(map(repr, unknown))}, which name no step; its steps are "
                    f"{', '.join(repr(s.name) for s in self.steps)}."
                )
        reached, todo = set(), [0]
        while todo:
            position = todo.pop()
            if position in reached or position >= len(self.steps):
                continue
            reached.add(position)
            step = self.steps[position]
            timed = timing_of(step)
            if timed is not None and timed.timeout_target is not None:
                todo.append(self._index[timed.timeout_target])
            if step.routes is not None:
                todo += [self._index[t] for t in step.routes.values()]
                if step.default_route:
                    todo.append(self._index[step.default_route])
            else:
                todo.append(position + 1)
        stranded = [s.name for i, s in enumerate(self.steps) if i not in reached]
        if stranded:
            raise exceptions.WorkflowDefinitionError(
                f"Workflow {self.name!r} has steps no route or sequence leads to: "
                f"{', '.join(map(repr, stranded))}. Make them route targets, or move them "
                "before the route step."
            )

    def timeout_of(self, index: int, branch: int = 0) -> float | None:
        """Seconds an attempt of step ``index`` (of its ``parallel`` branch ``branch``) may
        run before it is interrupted; None for no limit."""
        step = self.steps[index]
        if isinstance(step, ParallelStep):
            return step.fanout.timeout_of(branch, step.timeout)
        return step.timeout

    def step_of(self, index: int, kind: type[S]) -> S:
        """Step ``index``, which the caller knows is a ``kind`` (a :class:`TaskStep`, ...).

        Raises:
            TypeError: it is not (a bug of the caller's, not of the definition).
        """
        step = self.steps[index]
        if not isinstance(step, kind):
            raise TypeError(f"Step {step.name!r} of workflow {self.name!r} is a {step.kind!r} "
                            f"step, not a {kind.__name__}.")
        return step

    def queue_of(self, index: int) -> str | None:
        """The Celery queue of step ``index``'s messages: its own, else the workflow's
        (``None``: ``QUEUETY["QUEUE"]``)."""
        return self.steps[index].queue or self.queue

    def priority_of(self, index: int) -> str | None:
        """The priority of step ``index``: its own, else the workflow's; ``None`` when neither
        sets one (normal, and its messages carry no priority)."""
        return self.steps[index].priority or self.priority

    def next_index(self, index: int) -> int | None:
        """Return the position of the step after ``index``, or ``None`` after the last one
        (the run then completes)."""
        return index + 1 if index + 1 < len(self.steps) else None

    def position(self, name: str) -> int | None:
        """Return the position of the step called ``name``, or ``None`` when none has it."""
        return self._index.get(name)

    def index_of(self, name: str) -> int:
        """Return the position of the step called ``name``.

        Raises:
            UnknownStep: no step has that name; the message lists the known names.
        """
        try:
            return self._index[name]
        except KeyError:
            known = ", ".join(repr(s.name) for s in self.steps)
            raise exceptions.UnknownStep(
                f"Workflow {self.name!r} has no step named {name!r}; its steps are {known}.",
                name=name,
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (the input of :func:`canonical_json`)."""
        return {
            "format": DEFINITION_FORMAT,
            "name": self.name,
            "version": self.version,
            "budget": self.budget.to_dict(),
            "queue": self.queue,
            "compensate_on_failure": self.compensate_on_failure,
            "on_cancel": self.on_cancel,
            "deadline_seconds": self.deadline_seconds,
            "on_deadline": self.on_deadline,
            "retry": None if self.retry is None else self.retry.to_dict(),
            "steps": [step.to_dict() for step in self.steps],
            # Only when set, so the definitions stored before this option keep their hash.
            **({} if self.prune_state_after is None
               else {"prune_state_after": self.prune_state_after}),
            **({} if self.priority is None else {"priority": self.priority}),
            **({} if self.machine is None else {"machine": self.machine}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkflowSpec:
        """Rebuild a definition from :meth:`to_dict` output."""
        if data.get("format") != DEFINITION_FORMAT:
            raise exceptions.WorkflowDefinitionError(
                f"Workflow definition format {data.get('format')!r} is not supported "
                f"(this version reads format {DEFINITION_FORMAT})."
            )
        retry = data.get("retry")
        return cls(
            name=data["name"],
            steps=tuple(StepSpec.from_dict(s) for s in data["steps"]),
            retry=None if retry is None else RetryPolicy.from_dict(retry),
            queue=data.get("queue"),
            version=data.get("version"),
            budget=Budget.from_dict(data.get("budget")),
            compensate_on_failure=data.get("compensate_on_failure", False),
            on_cancel=data.get("on_cancel"),
            deadline_seconds=data.get("deadline_seconds"),
            on_deadline=data.get("on_deadline"),
            prune_state_after=data.get("prune_state_after"),
            priority=data.get("priority"),
            machine=data.get("machine"),
        )

    def canonical_json(self) -> str:
        """Return the canonical JSON text that :attr:`definition_hash` digests."""
        return canonical_json(self.to_dict())

    @property
    def definition_hash(self) -> str:
        """Return the sha256 hex digest of :meth:`canonical_json`."""
        return hashlib.sha256(self.canonical_json().encode("ascii")).hexdigest()


def canonical_json(value: Any) -> str:
    """Serialise ``value`` deterministically: sorted keys, no whitespace, ASCII, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def check_payload(name: str, payload: Any) -> dict[str, Any]:
    """Return a run's initial state from the ``payload`` given to dispatch, as stored JSON.

    Raises:
        InvalidPayload: the payload is not a dict, uses keys starting with ``_``
            (Queuety's own) or that are not strings, or is not JSON-serialisable.
    """
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise exceptions.InvalidPayload(
            f"The payload of workflow {name!r} must be a dict (got {type(payload).__name__})."
        )
    # Sorted by repr: keys of mixed types (1, None, "_a") cannot be compared with each other.
    reserved = sorted((key for key in payload if not isinstance(key, str) or key.startswith("_")),
                      key=repr)
    if reserved:
        raise exceptions.InvalidPayload(
            f"The payload of workflow {name!r} uses reserved or non-string keys {reserved!r}; "
            "keys starting with '_' belong to Queuety. Rename them."
        )
    try:
        state: dict[str, Any] = json.loads(json.dumps(payload, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise exceptions.InvalidPayload(
            f"The payload of workflow {name!r} is not JSON-serialisable: {error}."
        ) from None
    except RecursionError:
        raise exceptions.InvalidPayload(
            f"The payload of workflow {name!r} is nested too deeply to be stored as JSON."
        ) from None
    return state
