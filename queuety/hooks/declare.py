"""The inbound hooks declared by the site: ``queuety.inbound(name, verify=..., ...)``.

Declared in an app's ``workflows.py`` next to its workflows (imported at start-up by
``QueuetyConfig.ready()``)::

    queuety.inbound("stripe", verify=queuety.verifiers.stripe(settings.STRIPE_WHSEC),
                    start="payment_received")

A hook either starts a workflow with each delivery's event (``start=``, optionally under flow
control per ``key=``: ``debounce=``, ``singleton=``, ``batch=``), sends it as a signal to a
run (``signal=`` with ``run=``), or sends it to the live run of its key, starting that run
first if none is live (``signal=`` with ``start=`` and ``key=``: signal-with-start). Declarations are checked here, at start-up, so a
mistake is an error when the site boots, not at the provider's first call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from queuety import exceptions
from queuety.core import keyed as keyed_rules
from queuety.core.builder import WorkflowBuilder
from queuety.core.definition import WorkflowSpec
from queuety.verifiers import Verifier

#: The hook's name is the last part of its URL (``hooks/<name>/``).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class InboundHook:
    """One declared hook, as ``queuety.inbound()`` registers it."""

    name: str
    verify: Verifier
    #: A registered workflow's name, or None for a signal hook.
    start: str | None = None
    #: The definition built from the builder given to ``start=`` (not registered by name).
    spec: WorkflowSpec | None = None
    signal: str | None = None
    run: Callable[[Any], Any] | None = None
    #: ``key(event)``: the run's key (flow control, signal-with-start), not the delivery's id.
    key: Callable[[Any], Any] | None = None
    payload: Callable[[Any], Any] | None = None
    #: ``event_id(event)``: the delivery's id, when the verifier has none to give.
    event_id: Callable[[Any], Any] | None = None
    #: The flow-control options given (only those), for ``queuety.keyed``.
    flow: dict[str, Any] = field(default_factory=dict)

    @property
    def signal_or_start(self) -> bool:
        """True when a delivery goes to its key's live run (started first if none is)."""
        return self.signal is not None and self.run is None and "singleton" not in self.flow


_hooks: dict[str, InboundHook] = {}
_lock = threading.Lock()


#: The flow-control options a hook passes to ``queuety.keyed`` (docs/guide/triggers-and-events.md).
FLOW_OPTIONS = ("debounce", "singleton", "on_conflict", "batch")


def inbound(name: str, *, verify: Verifier, start: Any = None, signal: str | None = None,
            run: Callable[[Any], Any] | None = None, key: Callable[[Any], Any] | None = None,
            payload: Callable[[Any], Any] | None = None,
            event_id: Callable[[Any], Any] | None = None, **flow: Any) -> InboundHook:
    """Declare inbound hook ``name``, served at ``POST hooks/<name>/`` under the API's URLs.

    Args:
        verify: how a delivery's signature is checked (``queuety.verifiers.stripe(secret)``,
            ``github(secret)``, ``hmac(secret, header=...)``).
        start: a registered workflow's name, or a builder (or a function returning one):
            each new delivery starts a run whose payload is the event (or ``payload(event)``).
        signal: the signal each new delivery sends (its data: the event, or
            ``payload(event)``): to the run ``run(event)`` names, or, with ``start=`` and
            ``key=``, to the live run of that key (started first when none is live).
        key: ``key(event) -> str``, the run's key: what flow control groups by and what
            signal-with-start finds the live run by (stored on the run).
        event_id: ``event_id(event) -> str``, the delivery's id (what the provider's retries
            share); by default the verifier's (Stripe: the event's ``id``; GitHub:
            ``X-GitHub-Delivery``; hmac: its ``id_header``), else a hash of the body.
        debounce, singleton, on_conflict, batch: flow control per ``key``, as
            ``queuety.start`` takes them.

    Declaring the same hook again (a module imported twice) replaces it.

    Raises:
        WorkflowDefinitionError: the name is not a URL-safe word, ``verify`` is not a
            verifier, both or neither of ``start`` and ``signal`` are given, ``signal``
            comes without ``run``, or a callable option is not callable.
    """
    where = f"queuety.inbound({name!r}, ...)"
    if not isinstance(name, str) or not NAME.match(name):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: a hook's name is the last part of its URL, so it must be 1 to 100 "
            "letters, digits, '_', '.' or '-', starting with a letter or digit.")
    if not isinstance(verify, Verifier):
        raise exceptions.WorkflowDefinitionError(
            f"{where} needs verify=queuety.verifiers.stripe(secret), github(secret) or "
            f"hmac(secret, header=...) (got {type(verify).__name__}): a hook authenticates "
            "each delivery by its signature.")
    _check_action(where, start, signal, run, key, flow)
    for option, value in (("run", run), ("key", key), ("payload", payload),
                          ("event_id", event_id)):
        if value is not None and not callable(value):
            raise exceptions.WorkflowDefinitionError(
                f"{where}: {option}= must be a function of the parsed event (got "
                f"{type(value).__name__}).")
    spec = None
    if start is not None and not isinstance(start, str):
        built = start() if callable(start) and not isinstance(start, WorkflowBuilder) else start
        if not isinstance(built, WorkflowBuilder):
            raise exceptions.WorkflowDefinitionError(
                f"{where}: start= must be a registered workflow's name, a WorkflowBuilder or a "
                f"function returning one (got {type(built).__name__}).")
        # Built now: a builder mistake fails at start-up, as with queuety.register.
        spec, start = built.build(), None
    given = {option: value for option, value in flow.items()
             if value is not None and value is not False}
    if signal is not None and "singleton" in given:
        given["signal"] = signal
    if given:
        try:  # the rules of queuety.start's options, checked now rather than per delivery
            keyed_rules.flow_options(name, key="declaration", **given)
        except exceptions.InvalidPayload as error:
            raise exceptions.WorkflowDefinitionError(f"{where}: {error}") from None
    hook = InboundHook(name, verify, start, spec, signal, run, key, payload, event_id, given)
    with _lock:
        _hooks[name] = hook
    return hook


def _check_action(where: str, start: Any, signal: Any, run: Any, key: Any,
                  flow: dict[str, Any]) -> None:
    """What each delivery does must be one thing, and complete."""
    unknown = sorted(set(flow) - set(FLOW_OPTIONS))
    if unknown:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: unknown option(s) {', '.join(unknown)}; a hook takes verify=, start=, "
            "signal=, run=, key=, payload=, event_id= and the flow options "
            f"{', '.join(FLOW_OPTIONS)}.")
    if start is None and signal is None:
        raise exceptions.WorkflowDefinitionError(
            f"{where} needs start= (a workflow to start with each delivery) or signal= (a "
            "signal to send to the run named by run=, or to the live run of key=).")
    if signal is not None and (not isinstance(signal, str) or not signal):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: signal= must be a signal's name (got {signal!r:.40}).")
    if signal is not None and (run is None) == (start is None):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: signal= comes with run= (a function of the event returning the id of the "
            "run to signal) or with start= and key= (signal-with-start), not both or neither.")
    if run is not None and key is not None:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: key= is the run's key, for signal-with-start and flow control; with "
            "run= the run is named already. Drop key= (event_id= gives the delivery's id).")
    given = [option for option, value in flow.items() if value is not None and value is not False]
    if given and (start is None or signal is not None and not flow.get("singleton")):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: flow control ({', '.join(given)}) applies to the runs start= starts, "
            "not to a signal (with singleton=True, signal= names the signal "
            "on_conflict='signal' sends).")
    if (given or (signal is not None and run is None)) and key is None:
        raise exceptions.WorkflowDefinitionError(
            f"{where}: flow control and signal-with-start are per key: pass key=, a function "
            "of the event returning the key of its run (such as the order's id).")


def get(name: str) -> InboundHook | None:
    """The hook declared as ``name``, or None."""
    with _lock:
        return _hooks.get(name)


def declared() -> list[InboundHook]:
    """Every declared hook, by name."""
    with _lock:
        return [_hooks[name] for name in sorted(_hooks)]


def forget(name: str) -> None:
    """Drop hook ``name`` if it is declared (for tests)."""
    with _lock:
        _hooks.pop(name, None)
