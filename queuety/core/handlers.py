"""Steps: the ``Step`` base class and how a handler path is turned into a call."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from queuety import exceptions
from queuety.core import resources
from queuety.core import tags as tag_rules
from queuety.core.budget import BudgetView
from queuety.core.imports import dotted_path, import_path
from queuety.core.progress import check_progress
from queuety.core.retry import RetryPolicy
from queuety.core.streaming import AttemptSink, consume, is_stream, run_awaitable


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a running step knows about itself.

    A ``Step`` subclass reads it as ``self.context``; a function receives it as a second
    argument if it takes one (``def plan(state, context)``).
    """

    run_id: int
    workflow: str
    step_name: str
    attempt: int
    """1 for the first attempt."""
    budget: BudgetView
    """Limits and usage before this step: ``context.budget.remaining("max_cost_units")``."""
    beat: Callable[[dict[str, Any] | None], None] | None = field(
        default=None, repr=False, compare=False)
    """Set by the worker: hands a report to its heartbeat thread (see :meth:`heartbeat`)."""

    def heartbeat(self, progress: dict[str, Any] | None = None) -> None:
        """Say the step is alive and, with ``progress``, how far it got.

        ``progress`` (a small JSON dict, such as ``{"done": 450, "total": 1000}``) rides on
        the heartbeat write: the worker's heartbeat thread writes the latest report soon
        after (at most one write every ``QUEUETY["PROGRESS_INTERVAL"]`` seconds per worker
        process), so calling this in a tight loop is cheap. ``workflow_status()``, the API,
        the CLI and the admin show it while the step runs. Outside a worker (a handler
        called directly, in a test) it only checks ``progress``.

        Raises:
            InvalidProgress: ``progress`` is not a dict of JSON, or is over
                ``QUEUETY["MAX_PROGRESS_BYTES"]``; nothing is recorded.
        """
        if self.beat is None:
            if progress is not None:
                check_progress(self.run_id, self.step_name, progress, 1 << 20)
            return
        self.beat(progress)
    sink: AttemptSink | None = None
    """Where this attempt's artifacts and chunks go (set by the worker for task steps and
    fan-out branches)."""
    step_run_id: int | None = None
    """The step row this attempt runs (kept across its retries; set by the worker)."""
    step_index: int | None = None
    prune_state_after: int | None = None
    """The workflow's ``prune_state_after(n)`` (None: no pruning)."""

    def put_artifact(self, key: str, content: Any, kind: str = "json",
                     metadata: dict[str, Any] | None = None) -> None:
        """Store artifact ``key`` of this run, bound to this step.

        It becomes visible (``queuety.artifacts(run_id)``) only when this attempt's outcome is
        recorded, success or failure; an attempt whose worker died leaves nothing visible, and
        a retry writing the same key replaces it rather than adding a second one.

        Raises:
            InvalidArtifact: a bad key, kind or content, or content over
                ``QUEUETY["MAX_ARTIFACT_BYTES"]``; nothing is written.
        """
        if self.sink is None:
            raise exceptions.InvalidArtifact(
                f"Step {self.step_name!r} of run {self.run_id} cannot store artifacts here "
                "(compensations and hooks cannot); use queuety.put_artifact(run_id, ...).")
        self.sink.put_artifact(key, content, kind, metadata)

    tags: dict[str, str] | None = field(default=None, repr=False, compare=False)
    """The tags this attempt set with :meth:`tag` (``None`` where a step cannot tag)."""

    def tag(self, key: str, value: str) -> None:
        """Tag this run with ``key`` = ``value`` (replacing the key's earlier value).

        The tag is written with the step's outcome, in the transaction that records its
        success: an attempt that fails (and is retried), or whose outcome is discarded, tags
        nothing. Only task steps can tag (not fan-out branches, compensations or hooks).

        Raises:
            InvalidPayload: the key or value breaks the tag rules (``queuety.core.tags``),
                more than ``MAX_TAGS`` are set in this attempt (the run's tags, merged from
                the dispatch and its steps, may be more), or this step cannot tag.
        """
        where = f"context.tag() of step {self.step_name!r} of run {self.run_id}"
        if self.tags is None:
            raise exceptions.InvalidPayload(
                f"{where[:1].upper()}{where[1:]} cannot tag the run: only task steps can "
                "(not fan-out branches, compensations or hooks); tag from the step before or "
                "after, or with dispatch(tags=...).")
        checked_key, checked_value = tag_rules.check_pair(key, value, where)
        if checked_key not in self.tags and len(self.tags) >= tag_rules.MAX_TAGS:
            raise exceptions.InvalidPayload(
                f"{where[:1].upper()}{where[1:]} sets more than {tag_rules.MAX_TAGS} tags in "
                "one attempt; nothing was written.")
        self.tags[checked_key] = checked_value

    @property
    def chunks(self) -> tuple[Any, ...]:
        """In a streaming step: the chunks earlier attempts of this step stored (empty on the
        first attempt), so the generator can resume where they stopped."""
        return () if self.sink is None else tuple(self.sink.stored_chunks())
    definition: Any = field(default=None, repr=False, compare=False)
    """The run's definition (a ``WorkflowSpec``), set by the worker: the steps a state
    machine compiles to read their machine's table from it."""


class Step:
    """Base class for a workflow step.

    Subclass it and implement :meth:`handle`. Class attributes set defaults that
    ``.then(..., retry=..., timeout=..., queue=...)`` may override::

        class Charge(queuety.Step):
            timeout = 30
            queue = "io"  # run by the workers that consume the "io" queue (the I/O lane)
            retry = queuety.RetryPolicy(max_attempts=4, retry_on=[ConnectionError])

            def handle(self, state):
                return {"charge_id": gateway.charge(state["amount"])}
    """

    retry: ClassVar[RetryPolicy | None] = None
    timeout: ClassVar[float | None] = None
    cost_units: ClassVar[int | None] = None
    concurrency_group: ClassVar[str | None] = None
    concurrency_limit: ClassVar[int | None] = None
    rate_limit: ClassVar[tuple[int, float] | None] = None
    queue: ClassVar[str | None] = None
    priority: ClassVar[str | None] = None
    transactional: ClassVar[bool] = False
    """Run :meth:`handle` inside the transaction that records its outcome (exactly-once ORM
    writes; docs/guide/triggers-and-events.md, "Exactly-once ORM steps")."""
    context: StepContext
    """Set before :meth:`handle` runs: the run id, step name, attempt and budget."""

    def handle(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Do the step's work; return keys to merge into the state, or None."""
        raise NotImplementedError(f"{type(self).__name__}.handle() is not implemented.")


def resolve_handler(step: Any) -> tuple[str, Any]:
    """Return ``(dotted path, object)`` for a Step subclass, a function or a dotted path.

    Raises:
        WorkflowDefinitionError: the object cannot be imported back by a worker from its path,
            or is not a step.
    """
    if isinstance(step, str):
        try:
            obj = import_path(step)
        except ImportError as error:
            raise exceptions.WorkflowDefinitionError(
                f"Step {step!r} cannot be imported: {error}. "
                "Give the full dotted path, e.g. 'myapp.steps.ChargeCard'."
            ) from None
        path = step
    else:
        obj, path = step, None
    if inspect.isclass(obj):
        if not callable(getattr(obj, "handle", None)):
            raise exceptions.WorkflowDefinitionError(
                f"Step class {dotted_path(obj)!r} has no handle(self, state) method; "
                "subclass queuety.Step."
            )
    elif not inspect.isfunction(obj):
        raise exceptions.WorkflowDefinitionError(
            f"{obj!r} is not a step: give a queuety.Step subclass, a function or a dotted path."
        )
    if path is None:
        path = dotted_path(obj)
        if "<locals>" in path or obj.__module__ == "__main__":
            raise exceptions.WorkflowDefinitionError(
                f"Step {path!r} is defined inside a function or in __main__, so a worker "
                "cannot import it; define it at module level in an importable module."
            )
        try:
            imported = import_path(path)
        except ImportError:
            imported = None
        if imported is not obj:
            raise exceptions.WorkflowDefinitionError(
                f"Step {path!r} does not import back to the same object; "
                "define it at module level under its own name."
            )
    return path, obj


@dataclass(frozen=True, slots=True)
class StepOptions:
    """How a handler is run: resolved once, the same way wherever a handler runs."""

    retry: RetryPolicy | None
    """Its own policy (``None``: the workflow's, then ``QUEUETY["DEFAULT_RETRY"]``)."""
    timeout: float | None
    """Seconds an attempt may run before it is interrupted."""
    cost_units: int
    """Units its completion adds to the run's ``cost_units``."""
    concurrency_group: str | None = None
    """The group whose limits bound it across runs (a template with ``{state_key}``s)."""
    concurrency_limit: int | None = None
    rate_limit: tuple[int, float] | None = None
    queue: str | None = None
    """The Celery queue its messages go to (``None``: the workflow's)."""
    priority: str | None = None

    def resource_fields(self) -> dict[str, Any]:
        """The resource hints as ``StepSpec`` keyword arguments."""
        return {"concurrency_group": self.concurrency_group,
                "concurrency_limit": self.concurrency_limit, "rate_limit": self.rate_limit,
                "queue": self.queue, "priority": self.priority}


#: The resource hints a step class may declare and ``then()`` may override.
RESOURCE_OPTIONS = ("concurrency_group", "concurrency_limit", "rate_limit", "queue", "priority")


def resource_options(name: str, obj: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Resolve a step's resource hints: each keyword given, else the handler's class
    attribute, else None (see ``queuety.core.resources``).

    Raises:
        WorkflowDefinitionError: a hint is malformed; the message names the step.
    """
    values = {key: given[key] if given.get(key) is not None else getattr(obj, key, None)
              for key in RESOURCE_OPTIONS}
    where = f"step {name!r}"
    group = values["concurrency_group"]
    limit = resources.check_limit("concurrency_limit", name, values["concurrency_limit"])
    rate = resources.check_rate(where, values["rate_limit"])
    if group is None and (limit is not None or rate is not None):
        raise exceptions.WorkflowDefinitionError(
            f"Step {name!r} sets a concurrency_limit or rate_limit but no concurrency_group; "
            "name the group the limit is shared by, such as concurrency_group='openai'.")
    return {
        "concurrency_group": None if group is None
        else resources.check_group_template(name, group),
        "concurrency_limit": limit, "rate_limit": rate,
        "queue": _queue(name, obj, given.get("queue")),
        "priority": resources.check_priority(where, values["priority"]),
    }


def step_options(name: str, obj: Any, *, retry: RetryPolicy | None = None,
                 timeout: float | None = None, cost_units: int | None = None,
                 **hints: Any) -> StepOptions:
    """Resolve how the handler ``obj`` (of step ``name``) runs: each of ``retry``, ``timeout``,
    ``cost_units`` and the resource ``hints`` (``concurrency_group``, ``concurrency_limit``,
    ``rate_limit``, ``queue``, ``priority``) is the keyword given, else the handler's class
    attribute of that name, else the default (no policy of its own, no timeout, 1 unit). Every builder method that
    takes a handler (``then()``, ``route()``, ``parallel()`` branches, ``for_each()`` items)
    and every compensation resolves its options here.

    Raises:
        WorkflowDefinitionError: a value is of the wrong type or out of range; the message
            names the step and what to give instead.
    """
    if retry is None:
        retry = getattr(obj, "retry", None)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise exceptions.WorkflowDefinitionError(
            f"retry for step {name!r} must be a queuety.RetryPolicy (got {retry!r}).")
    if timeout is None:
        timeout = getattr(obj, "timeout", None)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise exceptions.WorkflowDefinitionError(
                f"timeout for step {name!r} must be a positive number of seconds "
                f"(got {timeout!r}).")
        timeout = float(timeout)
    unknown = sorted(set(hints) - set(RESOURCE_OPTIONS))
    if unknown:
        raise TypeError(f"step_options() got unexpected keyword arguments {unknown!r}")
    return StepOptions(retry, timeout, _cost_units(name, obj, cost_units),
                       **resource_options(name, obj, hints))


def transactional_option(name: str, obj: Any, explicit: bool | None) -> bool:
    """Whether step ``name`` (handler ``obj``) is transactional: the keyword given, else the
    handler's ``transactional`` class attribute, else False.

    Raises:
        WorkflowDefinitionError: the value is not a bool, or the handler is an ``async def``
            (an async body runs on the I/O lane's event loop, outside the worker's database
            transaction, so its writes could not commit with its outcome).
    """
    value = getattr(obj, "transactional", False) if explicit is None else explicit
    if not isinstance(value, bool):
        raise exceptions.WorkflowDefinitionError(
            f"transactional for step {name!r} must be True or False (got {value!r}).")
    handle = getattr(obj, "handle", None) if inspect.isclass(obj) else obj
    if value and inspect.iscoroutinefunction(handle):
        raise exceptions.WorkflowDefinitionError(
            f"Step {name!r} is transactional but its handler is an async def: an async body "
            "runs on the I/O lane's event loop, outside the transaction that records its "
            "outcome. Make the handler a plain def, or drop transactional=True.")
    return value


#: The options a ``parallel()`` branch may set for itself.
_BRANCH_OPTIONS = frozenset({"retry", "timeout", "cost_units"})


def branch_entry(step_name: str, position: int, entry: Any) -> tuple[Any, dict[str, Any]]:
    """Split a ``parallel()`` entry into its step and the options it sets for itself: an
    entry is a step, or a pair ``(step, {option: value})``.

    Raises:
        WorkflowDefinitionError: the entry is malformed or sets an unknown option.
    """
    if not isinstance(entry, tuple):
        return entry, {}
    if len(entry) != 2 or not isinstance(entry[1], dict):
        raise exceptions.WorkflowDefinitionError(
            f"Branch {position} of parallel step {step_name!r} must be a step or a pair "
            f"(step, {{option: value}}) (got {entry!r}).")
    unknown = sorted(set(entry[1]) - _BRANCH_OPTIONS, key=repr)
    if unknown:
        raise exceptions.WorkflowDefinitionError(
            f"Branch {position} of parallel step {step_name!r} sets unknown options "
            f"{unknown!r}; a branch may set {', '.join(sorted(_BRANCH_OPTIONS))}.")
    return entry[0], entry[1]


def _queue(name: str, obj: Any, explicit: str | None) -> str | None:
    """A step's queue: the keyword, else the class's, else None (the workflow's)."""
    queue = explicit if explicit is not None else getattr(obj, "queue", None)
    if queue is None:
        return None
    if not isinstance(queue, str) or not queue.strip() or queue != queue.strip():
        raise exceptions.WorkflowDefinitionError(
            f"queue for step {name!r} must be a non-blank queue name without surrounding "
            f"spaces, e.g. queue='io' (got {queue!r}).")
    return queue


def _cost_units(name: str, obj: Any, explicit: int | None) -> int:
    """A step's cost: the keyword (0 allowed), the class's (at least 1), else 1."""
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 0:
            raise exceptions.WorkflowDefinitionError(
                f"cost_units for step {name!r} must be a whole number of at least 0 "
                f"(got {explicit!r}).")
        return explicit
    declared = getattr(obj, "cost_units", None)
    if declared is None:
        return 1
    if isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1:
        return declared
    raise exceptions.WorkflowDefinitionError(
        f"Step class {name!r} declares cost_units={declared!r}; a class's cost must be "
        "a whole number of at least 1 (set cost_units=0 on .then() to make one use free).")


def call_handler(path: str, state: dict[str, Any], context: StepContext | None = None) -> Any:
    """Import the handler at ``path`` and run it on ``state``.

    ``async`` handlers (and ``async def handle``) run to completion on a private event loop.
    """
    result = invoke_handler(path, state, context)
    if inspect.isawaitable(result):
        result = run_awaitable(result)
    return result


def invoke_handler(path: str, state: dict[str, Any], context: StepContext | None = None) -> Any:
    """Call the handler at ``path`` on ``state`` and return what the call returns: the output
    of a sync handler, the coroutine of an ``async`` one (for the caller's event loop)."""
    obj = import_path(path)
    on_complete = None
    if inspect.isclass(obj):
        instance = obj()
        instance.context = context
        result = instance.handle(state)
        on_complete = getattr(instance, "on_complete", None)
    elif wants_context(obj):
        result = obj(state, context)
    else:
        result = obj(state)
    if is_stream(result):
        if context is None or context.sink is None:
            raise exceptions.InvalidStepOutput(
                f"Handler {path!r} is a generator (a streaming step), which only a then() "
                "step can be; make it a plain function, or its own then() step.")
        return consume(result, context.sink, state, on_complete)
    return result


def call_item_handler(path: str, state: dict[str, Any], item: Any, index: int,
                      context: StepContext | None = None) -> Any:
    """Run a ``for_each`` handler on one item: ``f(state, item, index)`` or a Step's
    ``handle_item(state, item, index)``."""
    result = invoke_item_handler(path, state, item, index, context)
    if inspect.isawaitable(result):
        result = run_awaitable(result)
    return result


def invoke_item_handler(path: str, state: dict[str, Any], item: Any, index: int,
                        context: StepContext | None = None) -> Any:
    """Call a ``for_each`` handler on one item; like :func:`invoke_handler`, an ``async``
    handler's coroutine is returned, not run."""
    obj = import_path(path)
    if inspect.isclass(obj):
        instance = obj()
        instance.context = context
        result = instance.handle_item(state, item, index)
    else:
        result = obj(state, item, index)
    if is_stream(result):
        raise exceptions.InvalidStepOutput(
            f"Handler {path!r} is a generator (a streaming step), which only a then() step "
            "can be, not a for_each item.")
    return result


def is_async_handler(path: str, *, item: bool = False) -> bool:
    """Whether the handler at ``path`` (its ``handle``, or ``handle_item`` with ``item``) is
    an ``async def``."""
    obj = import_path(path)
    if inspect.isclass(obj):
        obj = getattr(obj, "handle_item" if item else "handle", None)
    return inspect.iscoroutinefunction(obj)


@functools.lru_cache(maxsize=1024)
def wants_context(function: Any) -> bool:
    """Whether a function handler is called as ``f(state, context)`` (it takes two
    positional arguments or ``*args``) rather than ``f(state)``."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)
