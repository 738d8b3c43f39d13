"""The actions of the run page: who may do each, what it does, and which a run allows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.http import (
    HttpRequest,
)
from django.utils.translation import ngettext

from queuety import exceptions, inbox, operations, replyforms
from queuety.admin.display import actor
from queuety.core.definition import WorkflowSpec
from queuety.models import (
    RunStatus,
    WorkflowRun,
)
from queuety.store.definitions import load_spec


class StaleForm(Exception):
    """The run changed between rendering the form and posting it."""

    def __init__(self, revision: int) -> None:
        super().__init__(revision)
        self.revision = revision


@dataclass(frozen=True, slots=True)
class LockedRun:
    """What an action sees of the run it holds locked."""

    pk: int
    definition_id: int
    current_step: int


@dataclass(frozen=True, slots=True)
class RunAction:
    """An action of the run page: its label, who may do it, and what it does."""

    name: str
    label: str
    permission: str
    """``operate`` (``queuety.change_workflowrun``) or ``signal``
    (``queuety.signal_workflowrun``)."""
    perform: Callable[[HttpRequest, LockedRun], str]
    """Do it (inside the transaction holding the run's lock); return the success message."""


def _retry(request: HttpRequest, run: LockedRun) -> str:
    operations.retry(run.pk, actor=actor(request))
    return f"Run {run.pk} was scheduled for retry from its failed step."


def _retry_from(request: HttpRequest, run: LockedRun) -> str:
    step = request.POST.get("from_step", "").strip()
    if not step:
        raise exceptions.InvalidTransition(
            run.pk, f"Choose the step to retry workflow run {run.pk} from; nothing was done.")
    operations.retry(run.pk, actor=actor(request), from_step=step)
    return (f"Run {run.pk} was scheduled for retry from step {step!r}: it and the later "
            "steps run again.")


def _pause(request: HttpRequest, run: LockedRun) -> str:
    operations.pause(run.pk, actor=actor(request))
    return f"Run {run.pk} was paused: a step in flight finishes, nothing new starts."


def _resume(request: HttpRequest, run: LockedRun) -> str:
    status = operations.resume(run.pk, actor=actor(request))
    return f"Run {run.pk} was resumed; it is now {status}."


def _cancel(request: HttpRequest, run: LockedRun) -> str:
    operations.cancel(run.pk, actor=actor(request))
    return f"Run {run.pk} was cancelled; its compensations, if any, run next."


def _decision_data(request: HttpRequest) -> dict[str, Any]:
    data = {"by": request.user.get_username()}
    note = request.POST.get("note", "").strip()
    if note:
        data["note"] = note
    return data


def _approve(request: HttpRequest, run: LockedRun) -> str:
    receipt = inbox.reply(run.pk, "approve", _decision_data(request), sent_by=actor(request))
    return f"Run {run.pk} was approved; it is now {receipt.status}."


def _reject(request: HttpRequest, run: LockedRun) -> str:
    receipt = inbox.reply(run.pk, "reject", _decision_data(request), sent_by=actor(request))
    return f"Run {run.pk} was rejected; it is now {receipt.status}."


def _input(request: HttpRequest, run: LockedRun) -> str:
    spec = load_spec(run.definition_id)
    step = spec.steps[run.current_step] if run.current_step < len(spec.steps) else None
    schema = step.wait.schema if step is not None and step.wait is not None else None
    try:
        data = replyforms.form_reply(schema, request.POST)
    except ValueError as error:
        raise exceptions.InvalidSignalData(
            f"The input for run {run.pk} was not sent: {error}") from None
    receipt = inbox.reply(run.pk, "input", data, sent_by=actor(request))
    return f"Your input was sent to run {run.pk}; it is now {receipt.status}."


RUN_ACTIONS = {action.name: action for action in (
    RunAction("retry", "Retry", "operate", _retry),
    RunAction("retry_from", "Retry from step", "operate", _retry_from),
    RunAction("pause", "Pause", "operate", _pause),
    RunAction("resume", "Resume", "operate", _resume),
    RunAction("cancel", "Cancel", "operate", _cancel),
    RunAction("approve", "Approve", "signal", _approve),
    RunAction("reject", "Reject", "signal", _reject),
    RunAction("input", "Submit input", "signal", _input),
)}


def valid_actions(run: WorkflowRun, spec: WorkflowSpec) -> list[str]:
    """Return the actions the run's status allows (the operations refuse the others anyway)."""
    found = []
    if run.status == RunStatus.FAILED and not (
            run.cleanup and run.cleanup.get("cause") in ("failure", "deadline")):
        found += ["retry", "retry_from"]
    if run.status in (RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL):
        found.append("pause")
    if run.status == RunStatus.PAUSED:
        found.append("resume")
    if run.status not in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        found.append("cancel")
    step = spec.steps[run.current_step] if run.current_step < len(spec.steps) else None
    if run.status == RunStatus.WAITING_FOR_SIGNAL and step is not None and step.wait:
        found += {"approval": ["approve"], "decision": ["approve", "reject"],
                  "input": ["input"]}.get(step.wait.human or "", [])
    return found


def bulk_outcome(request: HttpRequest, ids: list[int], operation: Callable[..., Any],
                 done_one: str, done_many: str, noun: tuple[str, str]) -> list[tuple[str, int]]:
    """Apply ``operation`` to each run of ``ids`` for the request's user; return the messages
    to show, ``(text, level)``: the runs it was applied to (``done_one``/``done_many``, with
    ``%(ids)s``) and, with at most five reasons, those it refused (``noun``: the singular and
    plural of what the runs are called on this page)."""
    done, refused = [], []
    for pk in ids:
        try:
            operation(pk, actor=actor(request))
        except exceptions.QueuetyError as error:
            refused.append(str(error))
        else:
            done.append(pk)
    shown: list[tuple[str, int]] = []
    if done:
        shown.append((ngettext(done_one, done_many, len(done))
                      % {"ids": ", ".join(map(str, done))}, messages.SUCCESS))
    if refused:
        more = len(refused) - 5
        one, many = noun
        shown.append((ngettext(f"%(count)d {one} was left as it was: %(reasons)s",
                               f"%(count)d {many} were left as they were: %(reasons)s",
                               len(refused)) % {"count": len(refused),
                                                "reasons": " ".join(refused[:5])}
                      + (f" ({more} more not shown.)" if more > 0 else ""), messages.WARNING))
    return shown
