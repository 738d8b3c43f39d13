"""Fire the model triggers: Django's ``post_save``/``post_delete`` receivers and ``fire()``.

A trigger acts inside the save's own transaction, on the same connection: the run it starts
(its row, first step and dispatch key), or the signal it stores, commits or rolls back with
the save, and the first step's message is published when that transaction commits. So a save
that rolls back starts nothing, and the run exists the moment the save commits. A bare
``save()`` in autocommit mode (no ``transaction.atomic``, no ``ATOMIC_REQUESTS``) commits
before Django sends ``post_save``: the trigger then writes in a transaction of its own, just
after.

An error of a trigger (its ``payload``/``key``/``when``/``run`` function, an unknown
workflow, a refused start or signal) raises :class:`TriggerFailed` from ``save()`` or
``delete()``, inside the save's transaction, so that transaction rolls back: a row is never
committed without the run its trigger promises.

The receivers are connected per model (``sender=``) when its first trigger is declared, and
``post_delete`` only for a model with a ``deleted`` trigger: a receiver for every model would
make Django collect rows one by one for every ``QuerySet.delete()`` of the site.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, models, transaction
from django.db.models.signals import post_delete, post_save

from queuety import dispatch, exceptions, inbox, registry
from queuety.core.status import FINISHED
from queuety.models import Signal, WorkflowRun
from queuety.triggers import declare
from queuety.triggers.declare import Trigger

logger = logging.getLogger("queuety")


class TriggerFailed(exceptions.QueuetyError):
    """A model trigger could not start or signal its run; the save's transaction rolls back."""


@dataclass(frozen=True, slots=True)
class Fired:
    """What one trigger did for one row: the run started or signalled, and whether it is new.

    ``run_id`` is None when the start returned no run yet (a debounced or batched start).
    ``started`` is False for a signal, and for a key that had already started its run.
    """

    trigger: str
    action: str
    key: str
    run_id: int | None
    started: bool


def trigger(model: type[models.Model] | str, **options: Any) -> Trigger:
    """Declare a trigger (:func:`queuety.triggers.declare.trigger`) and connect its model's
    receivers."""
    declared = declare.trigger(model, **options)
    watch(declared.model, deletes=declared.on == declare.DELETED)
    return declared


def watch(model: type[models.Model], *, deletes: bool = False) -> None:
    """Connect the receivers of ``model`` (again is harmless: Django keeps one per uid)."""
    uid = f"queuety.triggers:{model._meta.label}"
    post_save.connect(_saved, sender=model, weak=False, dispatch_uid=f"{uid}:saved")
    if deletes:
        post_delete.connect(_deleted, sender=model, weak=False, dispatch_uid=f"{uid}:deleted")


def _saved(sender: type[models.Model], instance: models.Model, created: bool = False,
           raw: bool = False, **kwargs: Any) -> None:
    # A fixture being loaded (loaddata) is not the site's data changing.
    if not raw:
        fire(instance, declare.CREATED if created else declare.UPDATED)


def _deleted(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    # Sent before Django clears the instance's pk, inside the delete's transaction.
    fire(instance, declare.DELETED)


def fire(instance: models.Model, event: str) -> list[Fired]:
    """Fire the triggers of ``instance``'s model that ``event`` (``"created"``,
    ``"updated"`` or ``"deleted"``) fires, as a save or delete would; return what each did.

    For writes that send no per-row signal (``bulk_create``, ``QuerySet.update()``, raw SQL):
    call it for each row, in the same transaction. With the default keys, a ``fire()`` after
    a save that already fired the trigger in the same transaction starts nothing new.

    Raises:
        TriggerFailed: a trigger failed (the message names it, the model and the row).
        ValueError: ``event`` is not one of the three, or the instance has no pk.
    """
    if event not in declare.ROW_EVENTS:
        raise ValueError(f"queuety.fire(): event must be one of "
                         f"{', '.join(map(repr, declare.ROW_EVENTS))} (got {event!r}).")
    if not isinstance(instance, models.Model) or instance.pk is None:
        raise ValueError(f"queuety.fire() needs a saved model instance, with a pk (got "
                         f"{instance!r:.80}).")
    done = []
    for each in declare.for_event(type(instance), event):
        fired = _fire_one(each, instance, event)
        if fired is not None:
            done.append(fired)
    return done


def _fire_one(each: Trigger, instance: models.Model, event: str) -> Fired | None:
    try:
        if each.when is not None and not each.when(instance):
            return None
        data = each.payload(instance) if each.payload is not None \
            else {"model": each.label, "pk": _json_pk(instance.pk), "event": event}
        key = trigger_key(each, instance)
        return _act(each, instance, data, key)
    except Exception as error:  # the site's functions, or a refused start or signal
        raise TriggerFailed(
            f"Trigger {each.name!r} of model {each.label} failed for the row with pk="
            f"{instance.pk!r} ({event}): {type(error).__name__}: {error} The save's "
            "transaction is rolled back with it; fix the trigger, or filter such rows out "
            "with when=.") from error


def _act(each: Trigger, instance: models.Model, data: Any, key: str) -> Fired:
    if each.action == declare.SIGNAL_RUN:
        return _signal_run(each, instance, data, key)
    if each.action == declare.SIGNAL_OR_START:
        return _signal_or_start(each, data, key)
    if each.flow:
        # Imported here: the facade's start() carries the flow-control keywords.
        import queuety

        start: Callable[..., Any] = queuety.start
        run_id = start(each.start, data, key=key, **each.flow)
        return Fired(each.name, each.action, key, run_id, run_id is not None)
    spec = each.spec if each.spec is not None else registry.get(str(each.start)).spec
    # One key, one run, whatever the payload: a transaction saving a row twice starts the
    # run with the first save's payload, and the second is no conflict to report.
    done = dispatch.dispatch_run(spec, data, idempotency_key=key, fingerprint={"key": key})
    return Fired(each.name, each.action, key, done.run_id, not done.reused)


def _signal_run(each: Trigger, instance: models.Model, data: Any, key: str) -> Fired:
    """Send the trigger's signal to the run ``run(instance)`` names, once per key.

    A run that has finished can use no signal: the trigger logs that and lets the save
    through, rather than making the row unsavable once its run is over. Any other refusal
    (no wait of the run listens for the signal, invalid data) is the trigger's error.
    """
    assert each.run is not None and each.signal is not None  # declare.trigger checks
    run_id = _run_id(each, each.run(instance))
    if Signal.objects.filter(dedupe_key=key).exists():
        # This transaction already sent it (a second save, or fire() after the save).
        return Fired(each.name, each.action, key, run_id, False)
    try:
        receipt = inbox.send_signal(run_id, each.signal, data, sent_by=f"trigger:{each.name}",
                                    dedupe_key=key)
    except exceptions.RunNotWaiting:
        if not WorkflowRun.objects.filter(pk=run_id, status__in=FINISHED).exists():
            raise
        logger.warning("Trigger %r of model %s: run id=%s has finished, so signal %r for the "
                       "row with pk=%r was not sent.", each.name, each.label, run_id,
                       each.signal, instance.pk)
        return Fired(each.name, each.action, key, run_id, False)
    return Fired(each.name, each.action, key, receipt.run_id, False)


def _signal_or_start(each: Trigger, data: Any, key: str) -> Fired:
    import queuety

    signal_or_start = getattr(queuety, "signal_or_start", None)
    if signal_or_start is None:
        raise exceptions.WorkflowDefinitionError(
            "signal= with start= (and no run=) needs queuety.signal_or_start, which this "
            "version of Queuety does not have; pass run= to signal a run you name.")
    done = signal_or_start(each.start, key, each.signal, data)
    return Fired(each.name, each.action, key, done.run_id, bool(done.started))


def _run_id(each: Trigger, found: Any) -> int:
    if isinstance(found, bool) or not isinstance(found, int | str) or not str(found).isdigit():
        raise exceptions.InvalidPayload(
            f"run= of trigger {each.name!r} returned {found!r:.80}, not a run id; it must "
            "return the id (a positive whole number) of the run to signal.")
    return int(found)


def trigger_key(each: Trigger, instance: models.Model) -> str:
    """The key of what ``each`` does for ``instance``: ``key(instance)`` as it is, else one
    built from the model, the pk and the trigger's name (which carries its event).

    The default idempotency key (a plain start, a signal to ``run=``) also carries the
    database transaction (:func:`transaction_token`): one transaction's saves of a row start
    one run, a later transaction's another. The default key of flow control and of
    signal-with-start names the row alone, since it is what groups a row's events.
    Keys over 255 characters are replaced by their SHA-256.
    """
    if each.key is not None:
        found = each.key(instance)
        if isinstance(found, bool) or not isinstance(found, str | int) or not str(found).strip():
            raise exceptions.InvalidPayload(
                f"key= of trigger {each.name!r} returned {found!r:.80}; it must return a "
                "non-blank string.")
        return _bounded(str(found).strip())
    key = f"trigger:{each.label}:{instance.pk}:{each.name}"
    if each.action == declare.SIGNAL_OR_START or each.flow:
        return _bounded(key)
    return _bounded(f"{key}:{transaction_token()}")


def _bounded(key: str) -> str:
    if len(key) <= 255:
        return key
    return "trigger:sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _json_pk(pk: Any) -> Any:
    return pk if isinstance(pk, int | str) and not isinstance(pk, bool) else str(pk)


class _TransactionMark:
    """An on-commit hook that does nothing: its presence in the connection's pending hooks
    says the transaction it was registered in is still open."""

    def __init__(self) -> None:
        self.token = "tx-" + uuid.uuid4().hex

    def __call__(self) -> None:
        pass


def transaction_token() -> str:
    """A token of the database transaction open on Queuety's connection.

    PostgreSQL: ``txid_current()``, the transaction's own id. Elsewhere: a random token kept
    as a no-op on-commit hook of the transaction, which Django drops when it commits or rolls
    back (or rolls back the savepoint it was registered in, whose run rolled back too). In
    autocommit mode every statement is its own transaction, so each call has a new token.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current()")
            return f"tx{cursor.fetchone()[0]}"
    if not connection.in_atomic_block:
        return _TransactionMark().token
    for _savepoints, hook, *_ in connection.run_on_commit:
        if isinstance(hook, _TransactionMark):
            return hook.token
    mark = _TransactionMark()
    transaction.on_commit(mark)
    return mark.token
