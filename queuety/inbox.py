"""What runs receive from outside: signals, and the human replies built on them.

Not ``signals.py``, which a Django user reads as Django signals.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from queuety import exceptions, timeline
from queuety.conf import settings
from queuety.core import landing, waits
from queuety.core.definition import WaitStep, WorkflowSpec
from queuety.core.status import FINISHED
from queuety.models import Event, RunStatus, Signal, WorkflowRun
from queuety.runtime import expiry
from queuety.runtime.landing import land
from queuety.store import rows
from queuety.store.definitions import load_spec

logger = logging.getLogger("queuety")


@dataclass(frozen=True, slots=True)
class SignalReceipt:
    """What a delivered signal did."""

    signal_id: int
    run_id: int
    name: str
    settled: bool
    """True if it completed the wait the run was parked at."""
    status: str
    """The run's status afterwards."""


def send_signal(run_id: int, name: str, data: Any = None, *, sent_by: str = "",
                dedupe_key: str | None = None) -> SignalReceipt:
    """Deliver signal ``name`` with ``data`` to run ``run_id`` (``queuety.signal()``).

    One transaction, with the run row locked: the signal is stored, and if the run is parked
    at a wait it completes, the wait settles and the run moves on. A signal sent before its
    wait is reached is kept until the wait consumes it.

    Raises:
        RunNotFound: no such run (nothing is stored).
        RunNotWaiting: the run has finished, or no wait of its workflow listens for ``name``.
        InvalidSignalData: not JSON, over ``MAX_SIGNAL_BYTES``, or failing the input schema.
        BudgetExceeded: settling the wait would breach a budget; the signal is not recorded
            and the run keeps waiting.
    """
    data = waits.check_signal_data(run_id, name, data, settings.MAX_SIGNAL_BYTES)
    with transaction.atomic():
        run, spec = _lock_for_signal(run_id)
        current = spec.steps[run.current_step].wait if run.current_step < len(spec.steps) \
            else None
        late = _settle_if_expired(run, spec)
        if late is not None and current is not None and (
                name not in current.signals or spec.machine is not None):
            # The run was past due at a wait this signal is not for: that wait timed out
            # first, and the signal is delivered to what the run does now (unless the
            # timeout failed it: then it is refused, and the timeout still commits). A state
            # machine keeps an event its expired state accepted too: it loops back through
            # its states, so a later state (or this one again) may take it.
            try:
                run, spec = _lock_for_signal(run_id)
                late = None
            except exceptions.RunNotWaiting as refused:
                late = refused if isinstance(refused, exceptions.WaitExpired) else late
        if late is None:
            return _deliver(run, spec, name, data, sent_by=sent_by, dedupe_key=dedupe_key)
    raise late  # after the commit: the timeout this signal found is settled


def _settle_if_expired(run: WorkflowRun, spec: WorkflowSpec) -> exceptions.WaitExpired | None:
    """If ``run`` (locked) is parked at a wait whose timeout has passed, settle it by timeout
    now, in this transaction, and return the error for the late reply; else None.

    The reply and the sweeper decide under the same row lock, so exactly one settles the wait:
    a reply that comes after the expiry loses even if the sweeper has not run yet.
    """
    now = timezone.now()
    if not expiry.is_expired(run, now):
        return None
    step = spec.steps[run.current_step]
    expired_at = run.wait_expires_at
    expiry.settle_by_timeout(spec, run, now)
    return exceptions.WaitExpired(
        run.pk, f"Wait {step.name!r} of run {run.pk} expired at "
                f"{expired_at.isoformat() if expired_at else '?'}, before this reply came; "
                "its on_timeout has settled it, and the reply was not recorded.")


def _expired_instead(run: WorkflowRun, spec: WorkflowSpec,
                     indexes: list[int]) -> exceptions.WaitExpired | None:
    """The error for a reply to one of the waits at ``indexes`` that the run is no longer
    parked at because its timeout settled it last (None otherwise)."""
    error = run.error or {}
    if run.status == RunStatus.FAILED and str(error.get("type", "")).endswith("WaitExpired") \
            and error.get("step_index") in indexes:
        return exceptions.WaitExpired(
            run.pk, f"Run {run.pk} failed because its wait {error.get('step')!r} timed out "
                    f"at {error.get('expires_at')}; the reply was not recorded.")
    last = (Event.objects.filter(run_id=run.pk, kind__in=("wait_timed_out", "wait_settled"),
                                 step_index__in=indexes)
            .order_by("-pk").values("kind", "step_name", "data").first())
    if last is None or last["kind"] != "wait_timed_out":
        return None
    return exceptions.WaitExpired(
        run.pk, f"Wait {last['step_name']!r} of run {run.pk} timed out at "
                f"{(last['data'] or {}).get('expires_at')} (on_timeout "
                f"{(last['data'] or {}).get('on_timeout')!r}); the reply came too late and "
                "was not recorded.")


def _lock_for_signal(run_id: int, finished_ok: bool = False
                     ) -> tuple[WorkflowRun, WorkflowSpec]:
    run = rows.lock_run(run_id, fields=expiry.EXPIRY_FIELDS)
    if run.status in FINISHED and not finished_ok:
        error = run.error or {}
        if str(error.get("type", "")).endswith("WaitExpired"):
            raise exceptions.WaitExpired(
                run_id, f"Run {run_id} of workflow {run.name!r} failed because its wait "
                        f"{error.get('step')!r} timed out at {error.get('expires_at')}; it "
                        "takes no more signals.")
        raise exceptions.RunNotWaiting(
            run_id, f"Run {run_id} of workflow {run.name!r} is {run.status}; it takes no more "
                    "signals.")
    return run, load_spec(run.definition_id)


def _deliver(run: WorkflowRun, spec: WorkflowSpec, name: str, data: Any, *, sent_by: str,
             dedupe_key: str | None) -> SignalReceipt:
    listeners = [i for i, step in enumerate(spec.steps)
                 if isinstance(step, WaitStep) and name in step.wait.signals]
    if not listeners:
        known = sorted({n for step in spec.steps if step.wait for n in step.wait.signals})
        raise exceptions.RunNotWaiting(
            run.pk, f"No wait of workflow {spec.name!r} (run {run.pk}) listens for signal "
                    f"{name!r}, so it could never be used; its waits listen for "
                    f"{', '.join(map(repr, known)) or 'nothing'}.")
    parked_here = (run.status == RunStatus.WAITING_FOR_SIGNAL
                   and run.current_step in listeners)
    timed = [i for i in listeners if (w := spec.steps[i].wait) is not None and w.timeout]
    # A workflow's waits run in step order, so a timed-out wait behind the run is not reached
    # again; a state machine's are (it loops back), so its events are always kept.
    if not parked_here and timed and spec.machine is None \
            and not any(i >= run.current_step for i in listeners):
        late = _expired_instead(run, spec, listeners)
        if late is not None:
            raise late
    target = run.current_step if parked_here else next(
        (i for i in listeners if i >= run.current_step), listeners[0])
    wait = spec.step_of(target, WaitStep).wait
    if wait.schema is not None:
        problems = waits.validation_errors(wait.schema, data)
        if problems:
            raise exceptions.InvalidSignalData(
                f"The data of signal {name!r} for run {run.pk} does not match the input schema "
                f"of step {spec.steps[target].name!r}: "
                + "; ".join(f"{p['path']}: {p['message']}" for p in problems) + ".",
                problems,
            )
    if dedupe_key is not None and Signal.objects.filter(dedupe_key=dedupe_key).exists():
        raise exceptions.AlreadyAnswered(
            run.pk, f"This reply to run {run.pk} was already recorded; nothing new was done.")
    now = timezone.now()
    signal_row = Signal.objects.create(run_id=run.pk, name=name, payload=data, sent_by=sent_by,
                                       dedupe_key=dedupe_key)
    events = [Event(run_id=run.pk, kind="signal_received", step_index=target,
                    step_name=spec.steps[target].name,
                    data={"signal": name, "signal_id": signal_row.pk, "sent_by": sent_by})]
    status = run.status
    if parked_here:
        status = land(spec, rows.run_view(run, now), run.current_step, events,
                      landing.Mode.ASK)
    else:
        Event.objects.bulk_create(events)
    settled = parked_here and not (status == RunStatus.WAITING_FOR_SIGNAL and Signal.objects
                                   .filter(pk=signal_row.pk, consumed_at__isnull=True).exists())
    logger.info("Signal %r delivered to run id=%s (settled=%s)", name, run.pk, settled)
    return SignalReceipt(signal_row.pk, run.pk, name, settled, status)


_REPLY_NOUN = {"approve": "an approval", "reject": "a rejection", "input": "input"}


def reply(run_id: int, kind: str, data: Any = None, *, signal: str | None = None,
          sent_by: str = "", dedupe_key: str | None = None,
          step_index: int | None = None, transitions: int | None = None) -> SignalReceipt:
    """Answer the human wait run ``run_id`` is parked at: ``approve``, ``reject`` or ``input``.

    Unlike :func:`send_signal`, a reply is accepted only while the run waits for it: a second
    approval of an answered wait raises :class:`AlreadyAnswered`. ``approve`` satisfies both
    ``wait_for_approval()`` and ``wait_for_decision()``. ``step_index``/``transitions`` pin the
    reply to one wait instance (approval links use them).

    Raises:
        ValueError: ``kind`` is not a reply kind.
        RunNotFound, RunNotWaiting, AlreadyAnswered, InvalidSignalData, BudgetExceeded.
    """
    if kind not in _REPLY_NOUN:
        raise ValueError(f"Unknown reply kind {kind!r}; use approve, reject or input.")
    data = waits.check_signal_data(run_id, signal or kind, data, settings.MAX_SIGNAL_BYTES)
    with transaction.atomic():
        run, spec = _lock_for_signal(run_id, finished_ok=True)
        late = _settle_if_expired(run, spec)
        if late is None:
            return _reply_locked(run, spec, kind, data, signal=signal, sent_by=sent_by,
                                 dedupe_key=dedupe_key, step_index=step_index,
                                 transitions=transitions)
    raise late  # after the commit: the timeout this reply found is settled


def _reply_locked(run: WorkflowRun, spec: WorkflowSpec, kind: str, data: Any, *,
                  signal: str | None, sent_by: str, dedupe_key: str | None,
                  step_index: int | None, transitions: int | None) -> SignalReceipt:
    """:func:`reply` once the run is locked and its wait is known not to have expired."""
    run_id = run.pk
    step = spec.steps[run.current_step] if run.current_step < len(spec.steps) else None
    name = None
    if run.status == RunStatus.WAITING_FOR_SIGNAL and step is not None and step.wait:
        name = waits.reply_signal(step.wait, kind)
        if signal is not None and signal != name:
            name = None  # a reply of this kind cannot send another signal
    pinned = (transitions is None or transitions == run.transitions) and (
        step_index is None or step_index == run.current_step
        or (transitions is not None and
            timeline.moved_position(run_id, transitions, step_index) == run.current_step))
    if name is None or not pinned:
        answered = Signal.objects.filter(
            run_id=run_id, consumed_at__isnull=False,
            name__in=[n for s in spec.steps if s.wait and s.wait.human for n in s.wait.signals],
        ).exists()
        where = (f"waiting at step {step.name!r}" if step is not None and run.status ==
                 RunStatus.WAITING_FOR_SIGNAL else f"{run.status} at step "
                 f"{step.name!r}" if step else run.status)
        late = _expired_instead(run, spec, [i for i, s in enumerate(spec.steps)
                                            if s.wait and s.wait.human]
                                if step_index is None else [step_index])
        if late is not None:
            raise late
        if answered or not pinned:
            raise exceptions.AlreadyAnswered(
                run_id, f"Run {run_id} is not waiting for {_REPLY_NOUN[kind]} any more: "
                        f"the wait was already answered (the run is {where}).")
        raise exceptions.RunNotWaiting(
            run_id, f"Run {run_id} is not waiting for {_REPLY_NOUN[kind]} (it is {where}); "
                    "a reply is accepted only while the run waits for one.")
    return _deliver(run, spec, name, data, sent_by=sent_by, dedupe_key=dedupe_key)
