"""The inbound hooks declared by the site: ``queuety.inbound(name, verify=..., ...)``.

Declared in an app's ``workflows.py`` next to its workflows (imported at start-up by
``QueuetyConfig.ready()``)::

    queuety.inbound("stripe", verify=queuety.verifiers.stripe(settings.STRIPE_WHSEC),
                    start="payment_received")

A hook either starts a workflow with each delivery's event (``start=``) or sends it as a
signal to a run (``signal=`` with ``run=``). Declarations are checked here, at start-up, so a
mistake is an error when the site boots, not at the provider's first call.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from queuety import exceptions
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
    key: Callable[[Any], Any] | None = None
    payload: Callable[[Any], Any] | None = None


_hooks: dict[str, InboundHook] = {}
_lock = threading.Lock()


def inbound(name: str, *, verify: Verifier, start: Any = None, signal: str | None = None,
            run: Callable[[Any], Any] | None = None, key: Callable[[Any], Any] | None = None,
            payload: Callable[[Any], Any] | None = None) -> InboundHook:
    """Declare inbound hook ``name``, served at ``POST hooks/<name>/`` under the API's URLs.

    Args:
        verify: how a delivery's signature is checked (``queuety.verifiers.stripe(secret)``,
            ``github(secret)``, ``hmac(secret, header=...)``).
        start: a registered workflow's name, or a builder (or a function returning one):
            each new delivery starts a run whose payload is the event (or ``payload(event)``).
        signal: the signal each new delivery sends (its data: the event, or
            ``payload(event)``) to the run ``run(event)`` names.
        key: ``key(event) -> str``, the delivery's id (what the provider's retries share);
            by default the verifier's (Stripe: the event's ``id``; GitHub:
            ``X-GitHub-Delivery``; hmac: its ``id_header``), else a hash of the body.

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
    if (start is None) == (signal is None):
        raise exceptions.WorkflowDefinitionError(
            f"{where} needs exactly one of start= (a workflow to start with each delivery) "
            "and signal= (a signal to send to the run named by run=).")
    if signal is not None and (not isinstance(signal, str) or not signal or run is None):
        raise exceptions.WorkflowDefinitionError(
            f"{where}: signal= must be a signal's name and comes with run=, a function of the "
            "event returning the id of the run to signal.")
    for option, value in (("run", run), ("key", key), ("payload", payload)):
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
    hook = InboundHook(name, verify, start, spec, signal, run, key, payload)
    with _lock:
        _hooks[name] = hook
    return hook


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
