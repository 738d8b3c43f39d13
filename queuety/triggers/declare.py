"""The model triggers declared by the site: ``queuety.trigger(model, on=..., start=...)``.

Declared in an app's ``workflows.py`` next to its workflows (imported at start-up by
``QueuetyConfig.ready()``)::

    queuety.trigger("shop.Order", on="created", start="order_fulfilment",
                    payload=lambda order: {"order_id": order.pk})

A trigger either starts a workflow (``start=``, optionally with flow control: ``debounce=``,
``singleton=``, ``batch=``), sends a signal to the run ``run(instance)`` names (``signal=``
with ``run=``), or signals the live run of its key and starts it if there is none
(``signal=`` with ``start=``: ``queuety.signal_or_start``). Declarations are checked here, at
start-up, so a contradictory trigger is an error when the site boots, not at the first save.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import models

from queuety import exceptions
from queuety.core.builder import WorkflowBuilder
from queuety.core.definition import WorkflowSpec
from queuety.core.keyed import SINGLETON_CONFLICTS

CREATED, UPDATED, DELETED, SAVED = "created", "updated", "deleted", "saved"
#: What ``on=`` accepts; ``saved`` is ``created`` or ``updated``.
EVENTS = (CREATED, UPDATED, DELETED, SAVED)
#: What happens to a row, as ``fire()`` and the receivers name it.
ROW_EVENTS = (CREATED, UPDATED, DELETED)

#: How a trigger acts.
START, SIGNAL_RUN, SIGNAL_OR_START = "start", "signal_run", "signal_or_start"

#: The flow-control options passed through to ``queuety.start`` (docs/guide/starting-runs.md).
FLOW_OPTIONS = ("debounce", "singleton", "on_conflict", "batch")
ON_CONFLICT = SINGLETON_CONFLICTS

Function = Callable[[Any], Any]


@dataclass(frozen=True)
class Trigger:
    """One declared trigger, as ``queuety.trigger()`` registers it."""

    name: str
    model: type[models.Model]
    #: ``created``, ``updated``, ``deleted`` or ``saved``.
    on: str
    #: ``start``, ``signal_run`` or ``signal_or_start``.
    action: str
    #: A registered workflow's name (None for a builder, or a signal sent to ``run``).
    start: str | None = None
    #: The definition built from the builder given to ``start=`` (not registered by name).
    spec: WorkflowSpec | None = None
    signal: str | None = None
    run: Function | None = None
    payload: Function | None = None
    key: Function | None = None
    when: Function | None = None
    #: The flow-control options given (only those), passed to ``queuety.start``.
    flow: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The model's ``app_label.ModelName``."""
        return str(self.model._meta.label)

    def listens_to(self, event: str) -> bool:
        """Whether a row's ``event`` (created, updated or deleted) fires this trigger."""
        return self.on == event or (self.on == SAVED and event in (CREATED, UPDATED))


_triggers: dict[str, dict[str, Trigger]] = {}
_lock = threading.Lock()


def trigger(model: type[models.Model] | str, *, on: str, start: Any = None,
            signal: str | None = None, run: Function | None = None,
            payload: Function | None = None, key: Function | None = None,
            when: Function | None = None, name: str | None = None,
            **flow: Any) -> Trigger:
    """Declare a trigger on ``model`` (a model class or ``"app_label.ModelName"``).

    Args:
        on: ``"created"``, ``"updated"``, ``"deleted"`` or ``"saved"`` (created or updated).
        start: a registered workflow's name, or a builder (or a function returning one).
        signal: the signal to send: to the run ``run(instance)`` names, or (without ``run``)
            to the live run of ``start`` with the trigger's key, starting it if there is
            none. With ``singleton=True``, the signal ``on_conflict="signal"`` delivers.
        payload: ``payload(instance) -> dict``, the run's payload or the signal's data;
            by default ``{"model": "app_label.ModelName", "pk": pk, "event": event}``.
        key: ``key(instance) -> str``; see docs/guide/triggers-and-events.md for the default.
        when: ``when(instance) -> bool``; the trigger fires only when it is true.
        name: the trigger's name among the model's triggers, in its keys and messages
            (default ``"<on>:<workflow or signal>"``); declaring the same name on the same
            model again (a module imported twice) replaces it.
        debounce, singleton, on_conflict, batch: flow control, passed to ``queuety.start``.

    Raises:
        WorkflowDefinitionError: an unknown model or event, a contradictory choice of
            ``start``/``signal``/``run`` and flow options, or a callable option that is not
            callable.
    """
    where = f"queuety.trigger({_shown(model)}, on={on!r}, ...)"
    resolved = _model(model, where)
    if on not in EVENTS:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: on= must be one of {', '.join(map(repr, EVENTS))} (got {on!r}).")
    given = _flow(flow, signal, where)
    action = _action(start, signal, run, given, where)
    for option, value in (("run", run), ("payload", payload), ("key", key), ("when", when)):
        if value is not None and not callable(value):
            raise exceptions.WorkflowDefinitionError(
                f"{where}: {option}= must be a function of the model instance (got "
                f"{type(value).__name__}).")
    spec, start = _workflow(start, where)
    label = str(resolved._meta.label)
    target = start or (spec.name if spec is not None else None) or signal
    declared = Trigger(_name(name, on, target, where), resolved, on, action, start, spec,
                       signal, run, payload, key, when, given)
    with _lock:
        _triggers.setdefault(label, {})[declared.name] = declared
    return declared


def _name(name: str | None, on: str, target: str | None, where: str) -> str:
    if name is None:
        return f"{on}:{target}"
    if not isinstance(name, str) or not name.strip():
        raise exceptions.WorkflowDefinitionError(
            f"{where}: name= must be a non-blank string (got {name!r}).")
    return name.strip()


def _shown(model: Any) -> str:
    if isinstance(model, type):
        return model.__name__
    return repr(model)


def _model(model: Any, where: str) -> type[models.Model]:
    """The model class ``model`` names."""
    if isinstance(model, str):
        try:
            model = apps.get_model(model)
        except (LookupError, ValueError):
            raise exceptions.WorkflowDefinitionError(
                f"{where}: no installed model is {model!r}; name it as "
                "'app_label.ModelName' (or pass the model class).") from None
    if not isinstance(model, type) or not issubclass(model, models.Model):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: the model must be a Django model class or an 'app_label.ModelName' "
            f"string (got {type(model).__name__}).")
    if model._meta.abstract:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: {model.__name__} is abstract, so no row of it is ever saved; declare "
            "the trigger on the concrete model.")
    return model


def _flow(flow: dict[str, Any], signal: str | None, where: str) -> dict[str, Any]:
    """The flow-control options actually given, checked against each other."""
    unknown = sorted(set(flow) - set(FLOW_OPTIONS))
    if unknown:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: unknown option(s) {', '.join(unknown)}; a trigger takes start=, "
            "signal=, run=, payload=, key=, when=, name= and the flow options "
            f"{', '.join(FLOW_OPTIONS)}.")
    given = {option: value for option, value in flow.items()
             if value is not None and value is not False}
    kinds = sorted(set(given) & {"debounce", "singleton", "batch"})
    if len(kinds) > 1:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: {' and '.join(kinds)} each decide how a key's events become runs; "
            "give one of them.")
    debounce = given.get("debounce")
    if debounce is not None and (isinstance(debounce, bool)
                                 or not isinstance(debounce, int | float) or debounce <= 0):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: debounce= is the quiet time in seconds, a positive number (got "
            f"{debounce!r}).")
    if "singleton" in given and given["singleton"] is not True:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: singleton= is True or False (got {given['singleton']!r}).")
    _check_conflict(given, signal, where)
    if signal is not None and "singleton" in given:
        given["signal"] = signal
    return given


def _check_conflict(given: dict[str, Any], signal: str | None, where: str) -> None:
    on_conflict = given.get("on_conflict")
    if on_conflict is not None and "singleton" not in given:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: on_conflict= says what a start does while the key's run is live, so "
            "it comes with singleton=True.")
    if on_conflict is not None and on_conflict not in ON_CONFLICT:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: on_conflict= must be one of {', '.join(map(repr, ON_CONFLICT))} (got "
            f"{on_conflict!r}).")
    if "singleton" in given and signal is not None and on_conflict != "signal":
        raise exceptions.WorkflowDefinitionError(
            f"{where}: with singleton=True, signal= names the signal on_conflict='signal' "
            f"delivers to the live run, but on_conflict is {on_conflict!r}; pass "
            "on_conflict='signal' or drop signal=.")


def _action(start: Any, signal: str | None, run: Function | None, given: dict[str, Any],
            where: str) -> str:
    """How the trigger acts, from the combination of ``start``, ``signal`` and ``run``."""
    if signal is not None and (not isinstance(signal, str) or not signal.strip()):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: signal= must be a signal's name (got {signal!r}).")
    if run is not None:
        if signal is None or start is not None or given:
            raise exceptions.WorkflowDefinitionError(
                f"{where}: run= names the run a signal is sent to, so it comes with signal= "
                "and without start= or flow options.")
        return SIGNAL_RUN
    if start is None:
        raise exceptions.WorkflowDefinitionError(
            f"{where} needs start= (a workflow to start), or signal= with run= (a function "
            "of the instance returning the id of the run to signal).")
    if signal is not None and "singleton" not in given:
        if given:
            raise exceptions.WorkflowDefinitionError(
                f"{where}: signal= with start= signals the live run of the trigger's key (or "
                f"starts it), which takes no flow options ({', '.join(sorted(given))}).")
        return SIGNAL_OR_START
    return START


def _workflow(start: Any, where: str) -> tuple[WorkflowSpec | None, str | None]:
    """``start`` as a registered name, or as a definition built now from a builder."""
    if start is None or isinstance(start, str):
        if isinstance(start, str) and not start.strip():
            raise exceptions.WorkflowDefinitionError(
                f"{where}: start= must be a registered workflow's name, not blank.")
        return None, start
    built = start() if callable(start) and not isinstance(start, WorkflowBuilder) else start
    if not isinstance(built, WorkflowBuilder):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: start= must be a registered workflow's name, a WorkflowBuilder or a "
            f"function returning one (got {type(built).__name__}).")
    # Built now: a builder mistake fails at start-up, as with queuety.register.
    return built.build(), None


def for_event(model: type[models.Model], event: str) -> list[Trigger]:
    """The triggers of ``model`` that a row's ``event`` fires, by name."""
    with _lock:
        declared = _triggers.get(str(model._meta.label), {})
        return [declared[name] for name in sorted(declared) if declared[name].listens_to(event)]


def declared() -> list[Trigger]:
    """Every declared trigger, by model and name."""
    with _lock:
        return [each for label in sorted(_triggers)
                for _, each in sorted(_triggers[label].items())]


def forget(name: str) -> None:
    """Drop trigger ``name`` if it is declared (for tests)."""
    with _lock:
        for declared_ in _triggers.values():
            declared_.pop(name, None)
