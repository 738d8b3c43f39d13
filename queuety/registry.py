"""The workflow registry: workflows known by name, so a run can be started from anywhere.

Sites register builders in their apps' ``workflows.py`` (imported at start-up by
``QueuetyConfig.ready()``, as Django imports ``admin.py``)::

    @queuety.register("order_fulfilment")
    def order_fulfilment():
        return queuety.workflow("order_fulfilment").then(validate).then(charge)

Then ``queuety.start("order_fulfilment", {"order_id": 7})`` starts a run, and so do the REST
API (``POST runs/``), ``manage.py queuety workflow dispatch``, the admin's "Start a run" page
and schedules. Each definition is built once, when it is registered: a builder mistake is an
error at start-up, not at the first dispatch.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from queuety import exceptions
from queuety.core import tags as tag_rules
from queuety.core.builder import WorkflowBuilder
from queuety.core.definition import WorkflowSpec
from queuety.core.keyed import FlowOptions
from queuety.core.machine import MachineBuilder

Registrable = (WorkflowBuilder | MachineBuilder
               | Callable[[], WorkflowBuilder] | Callable[[], MachineBuilder])
_R = TypeVar("_R", bound=Registrable)


@dataclass(frozen=True, slots=True)
class RegisteredWorkflow:
    """One registered workflow, as ``queuety.registered()`` lists it."""

    name: str
    version: str | None
    definition_hash: str
    steps: tuple[str, ...]
    description: str
    spec: WorkflowSpec

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape the API, the CLI and the admin show."""
        return {"name": self.name, "version": self.version,
                "definition_hash": self.definition_hash, "steps": list(self.steps),
                "description": self.description}


_workflows: dict[str, RegisteredWorkflow] = {}
_lock = threading.Lock()


@overload
def register(name: str, builder: None = None) -> Callable[[_R], _R]: ...


@overload
def register(name: str, builder: Registrable) -> Registrable: ...


def register(name: str, builder: Registrable | None = None) -> Any:
    """Register ``builder`` (a :class:`WorkflowBuilder`, or a function returning one) as
    workflow ``name``; without ``builder``, return a decorator that registers the function.

    ``name`` must be the builder's own workflow name (the name its runs carry). Registering
    the same definition again (a module imported twice) is harmless.

    Raises:
        WorkflowDefinitionError: the builder is not one, names another workflow, does not
            build, or another definition is already registered under ``name``.
    """
    if builder is None:
        def decorator(function: _R) -> _R:
            register(name, function)
            return function
        return decorator
    built = builder() if callable(builder) and not isinstance(builder, WorkflowBuilder) \
        else builder
    if isinstance(built, MachineBuilder):
        built = built.compile()  # a state machine registers the workflow it compiles to
    if not isinstance(built, WorkflowBuilder):
        raise exceptions.WorkflowDefinitionError(
            f"queuety.register({name!r}, ...) needs a WorkflowBuilder or a function returning "
            f"one (got {type(built).__name__}).")
    spec = built.build()
    if spec.name != name:
        raise exceptions.WorkflowDefinitionError(
            f"queuety.register({name!r}, ...) was given the builder of workflow {spec.name!r}; "
            f"register it as {spec.name!r}, or build it with queuety.workflow({name!r}).")
    doc = inspect.getdoc(builder) if not isinstance(builder, WorkflowBuilder | MachineBuilder) \
        else None
    entry = RegisteredWorkflow(name, spec.version, spec.definition_hash,
                               tuple(step.name for step in spec.steps),
                               (doc or "").split("\n\n")[0].strip(), spec)
    with _lock:
        known = _workflows.get(name)
        if known is not None and known.definition_hash != entry.definition_hash:
            raise exceptions.WorkflowDefinitionError(
                f"Workflow {name!r} is already registered with definition "
                f"{known.definition_hash[:12]}; a second, different definition "
                f"({entry.definition_hash[:12]}) cannot take its name. Register it once, or "
                "call queuety.registry.unregister() first.")
        _workflows[name] = entry
    return builder


def unregister(name: str) -> None:
    """Forget workflow ``name`` (for tests, and sites that swap definitions at start-up).

    Raises:
        UnknownWorkflow: nothing is registered under ``name``.
    """
    with _lock:
        if _workflows.pop(name, None) is None:
            raise exceptions.UnknownWorkflow(name, tuple(sorted(_workflows)))


def registered() -> list[RegisteredWorkflow]:
    """Every registered workflow, by name."""
    with _lock:
        return [_workflows[name] for name in sorted(_workflows)]


def get(name: str) -> RegisteredWorkflow:
    """The workflow registered as ``name``.

    Raises:
        UnknownWorkflow: nothing is registered under ``name``; the error lists what is.
    """
    with _lock:
        found = _workflows.get(name)
        if found is None:
            raise exceptions.UnknownWorkflow(name, tuple(sorted(_workflows)))
        return found


def start_run(name: str, payload: Any = None, *, idempotency_key: str | None = None,
              on_conflict: str = "report", flow: FlowOptions | None = None,
              tags: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """Start a run of workflow ``name``; return its id and whether ``idempotency_key`` had
    already started it (then no run is written and the id is the original run's).

    Raises:
        UnknownWorkflow: nothing is registered under ``name``.
        InvalidPayload: the payload is not a JSON object (or uses Queuety's ``_`` keys).
        BudgetExceeded: the payload alone is over the workflow's ``max_state_bytes``.
        InvalidPayload: ``idempotency_key`` is blank or longer than 255 characters.
        IdempotencyConflict: the key started a run of another workflow or payload and
            ``on_conflict="error"`` (as the REST API and the admin pass).

    A key fixed on the registered builder (``.idempotency_key()``) is not used: a template
    started many times takes its key from each start. ``flow`` (checked by
    ``queuety.core.keyed.flow_options``) starts it as ``queuety.keyed.start_run`` does; a start
    that joined a pending run or signalled a live one is reported as reused too. ``tags``
    are the run's, merged over the registered builder's ``.with_tags()``.
    """
    # Imported here: the facade imports this module, and ``dispatch`` imports Django.
    from queuety import dispatch

    entry = get(name)
    if payload is not None and not isinstance(payload, dict):
        raise exceptions.InvalidPayload(
            f"The payload of workflow {name!r} must be a JSON object (got "
            f"{type(payload).__name__}); nothing was dispatched.")
    if idempotency_key is not None:
        if not isinstance(idempotency_key, str) or not idempotency_key.strip() \
                or len(idempotency_key.strip()) > 255:
            raise exceptions.InvalidPayload(
                f"The idempotency key of a run of workflow {name!r} must be a non-blank "
                f"string of at most 255 characters (got {idempotency_key!r:.80}); nothing was "
                "dispatched.")
        idempotency_key = idempotency_key.strip()
    spec = tag_rules.tagged(entry.spec, tags)
    if flow is not None:
        from queuety import keyed

        started = keyed.start_run(spec, payload, flow, idempotency_key=idempotency_key,
                                  on_conflict=on_conflict)
        return started.run_id, started.reused
    done = dispatch.dispatch_run(spec, payload, idempotency_key=idempotency_key,
                                 on_conflict=on_conflict)
    return done.run_id, done.reused
