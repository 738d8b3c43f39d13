"""Receive one inbound webhook delivery: verify, store, and start or signal, in one transaction.

The order is what makes a provider's retries harmless and a refusal leave no trace:

1. the hook must be declared (else :class:`UnknownHook`, a 404), the body within
   ``QUEUETY["INBOUND_MAX_BYTES"]`` (:class:`BodyTooLarge`, a 413) and its signature valid
   (``InvalidSignature``, a 401); then the body must be JSON (:class:`MalformedDelivery`,
   a 400) and the delivery must have an id. Nothing is stored on any of these.
2. In one transaction, the delivery row goes first: its unique ``(hook, event_id)`` index
   decides between a first delivery and a retry (a concurrent retry waits on it, then finds
   the row), and a retry is answered from the stored row (``replayed``) doing nothing new.
3. Then the run is started (its first step is published when the transaction commits) or
   the signal stored, and the row records the outcome. An error of the site's ``payload=`` or
   ``run=`` function, or a refusal of the start or the signal, is recorded as the delivery's
   ``failed`` outcome with the error: the provider is answered 2xx, and its retries (which
   would fail the same way) start nothing; the admin lists it.

No step runs before the answer: workers pick the run up after the commit.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from queuety import dispatch, exceptions, inbox, keyed, registry
from queuety.conf import settings
from queuety.core import keyed as keyed_rules
from queuety.hooks import declare
from queuety.models import InboundDelivery

logger = logging.getLogger("queuety")

#: Headers never stored with a delivery (credentials), besides each verifier's signature
#: headers and any whose name says it carries a secret.
DROPPED_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
SECRET_WORDS = ("secret", "token", "signature", "password", "auth", "api-key", "apikey")


class UnknownHook(exceptions.QueuetyError):
    """No hook is declared under the name the delivery was POSTed to."""


class BodyTooLarge(exceptions.QueuetyError):
    """The delivery's body is over ``QUEUETY["INBOUND_MAX_BYTES"]``."""


class MalformedDelivery(exceptions.QueuetyError):
    """A correctly signed delivery that cannot be acted on: not JSON, or no usable id."""


@dataclass(frozen=True, slots=True)
class Received:
    """What a delivery did: its row's id, outcome and run, and whether it was a retry."""

    delivery_id: int
    hook: str
    event_id: str
    outcome: str
    run_id: int | None
    replayed: bool
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of the endpoint."""
        return {"delivery_id": self.delivery_id, "hook": self.hook, "event_id": self.event_id,
                "outcome": self.outcome, "run_id": self.run_id, "replayed": self.replayed,
                "error": self.error}


def find(name: str) -> declare.InboundHook:
    """The hook declared as ``name``.

    Raises:
        UnknownHook: none is.
    """
    hook = declare.get(name)
    if hook is None:
        raise UnknownHook(f"No inbound hook is declared as {name!r}; declare it with "
                          f"queuety.inbound({name!r}, verify=..., start=...) in an app's "
                          "workflows.py.")
    return hook


def check_size(name: str, size: int) -> None:
    """Refuse a body of ``size`` bytes over the limit, before it is read.

    Raises:
        BodyTooLarge: it is.
    """
    limit = settings.INBOUND_MAX_BYTES
    if size > limit:
        raise BodyTooLarge(f"The delivery to hook {name!r} is {size} bytes; the limit is "
                           f"{limit} (QUEUETY['INBOUND_MAX_BYTES']). Nothing was stored.")


def receive(name: str, headers: Mapping[str, str], body: bytes) -> Received:
    """Verify, store and act on one delivery to hook ``name`` (see the module's docstring).

    Raises:
        UnknownHook, BodyTooLarge, InvalidSignature, MalformedDelivery: nothing was stored.
    """
    hook = find(name)
    check_size(name, len(body))
    hook.verify.verify(headers, body)
    try:
        text = body.decode("utf-8")
        event = json.loads(text) if text.strip() else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MalformedDelivery(f"The delivery to hook {name!r} is signed but its body is not "
                                "JSON (UTF-8); send it as application/json. Nothing was "
                                "stored.") from None
    event_id = _event_id(hook, headers, event, body)
    kept = _kept_headers(hook, headers)
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = InboundDelivery.objects.create(hook=name, event_id=event_id,
                                                     headers=kept, body=text,
                                                     outcome=InboundDelivery.FAILED)
        except IntegrityError:
            # A retry of a delivery already stored (or being stored: the unique index made
            # this insert wait for that transaction).
            row = InboundDelivery.objects.get(hook=name, event_id=event_id)
            return _received(row, replayed=True)
        try:
            with transaction.atomic():
                row.run_id, row.outcome = _act(hook, event, event_id)
        except DatabaseError:
            # The database failed, not the delivery: roll it all back and answer 5xx, so the
            # provider's retry is taken once the database answers again.
            raise
        except Exception as error:  # the site's functions, or a refused start or signal
            logger.warning("Inbound hook %r: delivery %s was stored but not acted on: %s",
                           name, event_id, error)
            row.error = _text(f"{type(error).__name__}: {error}")[:4000]
        row.save(update_fields=["run_id", "outcome", "error"])
    return _received(row, replayed=False)


def _act(hook: declare.InboundHook, event: Any, event_id: str) -> tuple[int, str]:
    """Start the hook's workflow or send its signal; return the run's id and the outcome."""
    data = hook.payload(event) if hook.payload is not None else event
    key = dedupe_key(hook.name, event_id)
    if hook.signal_or_start or hook.flow or hook.key is not None:
        return _act_keyed(hook, event, data, key)
    if hook.signal is not None:
        assert hook.run is not None  # declare.inbound requires it with signal=
        run_id = hook.run(event)
        if isinstance(run_id, bool) or not isinstance(run_id, int | str) \
                or not str(run_id).isdigit():
            raise exceptions.InvalidPayload(
                f"run= of hook {hook.name!r} returned {run_id!r:.80}, not a run id; it must "
                "return the id (a positive whole number) of the run to signal.")
        receipt = inbox.send_signal(int(run_id), hook.signal, data, sent_by=f"hook:{hook.name}",
                                    dedupe_key=key)
        return receipt.run_id, InboundDelivery.SIGNALLED
    if hook.spec is not None:
        dispatched = dispatch.dispatch_run(hook.spec, data, idempotency_key=key)
        return dispatched.run_id, InboundDelivery.STARTED
    assert hook.start is not None
    run_id, _ = registry.start_run(hook.start, data, idempotency_key=key)
    return run_id, InboundDelivery.STARTED


def _act_keyed(hook: declare.InboundHook, event: Any, data: Any,
               idempotency: str) -> tuple[int, str]:
    """A hook with a run key: signal-with-start, flow control, or a start that stores it."""
    assert hook.key is not None  # declare.inbound requires it for these
    run_key = _run_key(hook, event)
    spec = hook.spec if hook.spec is not None else registry.get(str(hook.start)).spec
    if hook.signal_or_start:
        assert hook.signal is not None
        done = keyed.signal_or_start(spec, run_key, hook.signal, data, sent_by=f"hook:{hook.name}")
        return done.run_id, (InboundDelivery.STARTED if done.started
                             else InboundDelivery.SIGNALLED)
    options = keyed_rules.flow_options(spec.name, key=run_key, **hook.flow)
    assert options is not None  # a key is given
    # The delivery's row already dedupes the provider's retries; a flow's start folds into
    # a pending or live run, which an idempotency key would refuse to combine with.
    started = keyed.start_run(spec, data, options,
                              idempotency_key=None if options.mode else idempotency)
    return started.run_id, (InboundDelivery.SIGNALLED if started.reused and options.mode
                            else InboundDelivery.STARTED)


def _run_key(hook: declare.InboundHook, event: Any) -> str:
    assert hook.key is not None
    found = hook.key(event)
    if isinstance(found, bool) or not isinstance(found, str | int) or not str(found).strip():
        raise exceptions.InvalidPayload(
            f"key= of hook {hook.name!r} returned {found!r:.80}; it must return a non-blank "
            "string, the key of the event's run (such as the order's id).")
    return str(found).strip()


def dedupe_key(hook: str, event_id: str) -> str:
    """The idempotency key of the run (or the signal's dedupe key) a delivery starts:
    ``inbound:<hook>:<event id>``, or its SHA-256 when that is over the keys' 255 characters
    (a cut would let two long ids share a key)."""
    key = f"inbound:{hook}:{event_id}"
    if len(key) <= 255:
        return key
    return "inbound:sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _text(value: str) -> str:
    """``value`` as PostgreSQL's text can hold it: no NUL, no lone surrogate."""
    return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def _event_id(hook: declare.InboundHook, headers: Mapping[str, str], event: Any,
              body: bytes) -> str:
    """The delivery's id as stored: its SHA-256 when over the column's 255 characters (a cut
    would let two long ids share a row, and the second delivery pass for a retry)."""
    found = _text(_find_event_id(hook, headers, event, body))
    if len(found) <= 255:
        return found
    return "sha256:" + hashlib.sha256(found.encode()).hexdigest()


def _find_event_id(hook: declare.InboundHook, headers: Mapping[str, str], event: Any,
                   body: bytes) -> str:
    """The delivery's id: ``event_id(event)``, else the verifier's, else a hash of the body
    (so byte-identical retries still dedupe)."""
    if hook.event_id is not None:
        try:
            found = hook.event_id(event)
        except Exception as error:
            raise MalformedDelivery(
                f"event_id= of hook {hook.name!r} raised {type(error).__name__}: {error}; it must "
                "return the delivery's id for every event the provider sends. Nothing was "
                "stored (the provider's retry will be taken once it is fixed).") from None
        if not isinstance(found, str | int) or isinstance(found, bool) or not str(found).strip():
            raise MalformedDelivery(
                f"event_id= of hook {hook.name!r} returned {found!r:.80}; it must return a "
                "non-blank string (the delivery's id). Nothing was stored.")
        return str(found).strip()
    found = hook.verify.event_id(headers, event)
    if found:
        return found
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _kept_headers(hook: declare.InboundHook, headers: Mapping[str, str]) -> dict[str, str]:
    """The headers stored with the delivery: none that carries a signature or a secret."""
    dropped = DROPPED_HEADERS | set(hook.verify.signature_headers)
    kept = {}
    for key, value in headers.items():
        lowered = str(key).lower()
        if lowered in dropped or any(word in lowered for word in SECRET_WORDS):
            continue
        kept[str(key)] = str(value)[:1000]
    return kept


def _received(row: InboundDelivery, *, replayed: bool) -> Received:
    return Received(row.pk, row.hook, row.event_id, row.outcome, row.run_id, replayed,
                    row.error)
