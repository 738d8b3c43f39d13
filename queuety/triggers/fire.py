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
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, models, transaction
from django.db.models.signals import post_delete, post_save

from queuety import dispatch, exceptions, inbox, keyed, registry
from queuety.core import keyed as keyed_rules
from queuety.core.definition import WorkflowSpec
from queuety.core.status import FINISHED
from queuety.models import Signal, WorkflowRun
from queuety.triggers import declare
from queuety.triggers.declare import Trigger

logger = logging.getLogger("queuety")


class TriggerFailed(exceptions.QueuetyError):
    """A model trigger could not start or signal its run. Inside a transaction, that
    transaction is marked for rollback (catching this does not commit the row without its
    run); in autocommit mode the row was already committed when the trigger ran."""


@dataclass(frozen=True, slots=True)
class Fired:
    """What one trigger did for one row: the run started or signalled, and whether it is new.

    ``run_id`` is None when a signal had no run to go to (``run=`` returned None, or the
    run has finished or been purged). ``started`` is True only when this firing wrote a new
    run: False for a signal, for a key that had already started its run, and for a start
    that joined a pending (debounced or batched) run or signalled a live one.
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
        mark = _mark() if each.action == declare.SIGNAL_OR_START or each.flow else None
        if mark is not None and (each.name, key) in mark.fired:
            # This transaction fired it for the row already (a save, then fire()): a second
            # signal, batch item or debounce push would count one change twice.
            return Fired(each.name, each.action, key, None, False)
        fired = _act(each, instance, data, key)
        if mark is not None:
            mark.fired.add((each.name, key))
        return fired
    except Exception as error:  # the site's functions, or a refused start or signal
        in_transaction = connection.in_atomic_block
        if in_transaction:
            # post_save is sent after save() left its own atomic block: without this, a
            # caller catching the error would commit the row without its run.
            transaction.set_rollback(True)
        if isinstance(error, DatabaseError):
            raise  # a deadlock or serialization failure, as the caller's retry loop expects
        outcome = ("The transaction the row was written in is marked for rollback"
                   if in_transaction else
                   "The row was already committed (autocommit: save inside "
                   "transaction.atomic() to make the row and its run one write)")
        raise TriggerFailed(
            f"Trigger {each.name!r} of model {each.label} failed for the row with pk="
            f"{instance.pk!r} ({event}): {type(error).__name__}: {error}. {outcome}; fix the "
            "trigger, or filter such rows out with when=.") from error


def _act(each: Trigger, instance: models.Model, data: Any, key: str) -> Fired:
    if each.action == declare.SIGNAL_RUN:
        return _signal_run(each, instance, data, key)
    if each.action == declare.SIGNAL_OR_START:
        return _signal_or_start(each, data, key)
    spec = _spec(each)
    if each.flow:
        options = keyed_rules.flow_options(spec.name, key=key, **each.flow)
        assert options is not None  # a key is given
        started = keyed.start_run(spec, data, options)
        return Fired(each.name, each.action, key, started.run_id, not started.reused)
    # One key, one run, whatever the payload: a transaction saving a row twice starts the
    # run with the first save's payload, and the second is no conflict to report.
    try:
        done = dispatch.dispatch_run(spec, data, idempotency_key=key, fingerprint={"key": key})
    except exceptions.RunPurged:
        # The key's run existed, finished and was purged: the key still says "done", so a
        # save firing it again starts nothing and goes through, as it did before the purge.
        logger.info("Trigger %r of model %s: key %r started a run retention purged; no run "
                    "started.", each.name, each.label, key)
        return Fired(each.name, each.action, key, None, False)
    return Fired(each.name, each.action, key, done.run_id, not done.reused)


def _signal_run(each: Trigger, instance: models.Model, data: Any, key: str) -> Fired:
    """Send the trigger's signal to the run ``run(instance)`` names, once per key.

    A run that has finished can use no signal: the trigger logs that and lets the save
    through, rather than making the row unsavable once its run is over. Any other refusal
    (no wait of the run listens for the signal, invalid data) is the trigger's error.
    """
    assert each.run is not None and each.signal is not None  # declare.trigger checks
    found = each.run(instance)
    if found is None:
        return Fired(each.name, each.action, key, None, False)  # the row has no run (yet)
    run_id = _run_id(each, found)
    if Signal.objects.filter(dedupe_key=key).exists():
        # This transaction already sent it (a second save, or fire() after the save).
        return Fired(each.name, each.action, key, run_id, False)
    try:
        receipt = inbox.send_signal(run_id, each.signal, data, sent_by=f"trigger:{each.name}",
                                    dedupe_key=key)
    except (exceptions.RunNotWaiting, exceptions.RunNotFound) as refused:
        if isinstance(refused, exceptions.RunNotWaiting) and not WorkflowRun.objects.filter(
                pk=run_id, status__in=FINISHED).exists():
            raise
        logger.warning("Trigger %r of model %s: run id=%s has finished (or was purged), so "
                       "signal %r for the row with pk=%r was not sent.", each.name, each.label,
                       run_id, each.signal, instance.pk)
        return Fired(each.name, each.action, key, None, False)
    return Fired(each.name, each.action, key, receipt.run_id, False)


def _signal_or_start(each: Trigger, data: Any, key: str) -> Fired:
    assert each.signal is not None  # declare.trigger checks
    done = keyed.signal_or_start(_spec(each), key, each.signal, data,
                                 sent_by=f"trigger:{each.name}")
    return Fired(each.name, each.action, key, done.run_id, done.started)


def _spec(each: Trigger) -> WorkflowSpec:
    """The definition ``each`` starts: its builder's, or the registered workflow's."""
    return each.spec if each.spec is not None else registry.get(str(each.start)).spec


def _run_id(each: Trigger, found: Any) -> int:
    text = str(found)
    if isinstance(found, bool) or not isinstance(found, int | str) or not text.isascii() \
            or not text.isdigit() or int(text) <= 0:
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
        value = str(found).strip()
        if each.action == declare.SIGNAL_OR_START or each.flow:
            return _bounded(value)  # the flow's own key: flows are per workflow already
        # An idempotency or signal dedupe key is global: kept apart per target, so two
        # triggers whose functions give the same value do not share one run.
        target = each.start or (each.spec.name if each.spec is not None else each.signal)
        return _bounded(f"trigger:{target}:{value}")
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
    says the transaction it was registered in is still open. It carries the transaction's
    token and what the transaction's triggers have fired."""

    def __init__(self) -> None:
        self.token = "tx-" + uuid.uuid4().hex
        self.fired: set[tuple[str, str]] = set()

    def __call__(self) -> None:
        pass


def _mark() -> _TransactionMark | None:
    """The mark of the transaction open on Queuety's connection (registered now if it has
    none); None in autocommit mode, where every statement is its own transaction."""
    if not connection.in_atomic_block:
        return None
    for _savepoints, hook, *_ in connection.run_on_commit:
        if isinstance(hook, _TransactionMark):
            return hook
    mark = _TransactionMark()
    transaction.on_commit(mark)
    return mark


def transaction_token() -> str:
    """A token of the database transaction open on Queuety's connection.

    A random token kept as a no-op on-commit hook of the transaction, which Django drops
    when it commits or rolls back (or rolls back the savepoint it was registered in, whose
    run rolled back too). It costs no query, and unlike a transaction id it never repeats
    (a restored dump or a new replica restarts transaction ids, and dispatch keys are kept
    for good). In autocommit mode every statement is its own transaction, so each call has a
    new token.
    """
    mark = _mark()
    return mark.token if mark is not None else _TransactionMark().token
