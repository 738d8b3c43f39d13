"""Approval links for people without an account: signed, expiring, single-use tokens.

A token names one run and one wait instance (the wait's step and the run's transition count
when it parked), so it cannot answer another run, a later wait, or the same wait twice.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.urls import reverse

from queuety import exceptions, inbox
from queuety.conf import settings
from queuety.models import RunStatus, WorkflowRun
from queuety.store.definitions import load_spec

SALT = "queuety.approval-link"


class InvalidLink(exceptions.QueuetyError):
    """The link was tampered with or was not made by this site."""


class ExpiredLink(exceptions.QueuetyError):
    """The link is older than ``QUEUETY["APPROVAL_LINK_MAX_AGE"]``."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a valid token grants."""

    run_id: int
    step_index: int
    transitions: int
    nonce: str


def make_token(run_id: int) -> str:
    """Return a token answering the human wait run ``run_id`` is parked at now.

    Raises:
        RunNotFound: no such run.
        RunNotWaiting: the run is not parked at a human wait.
    """
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None:
        raise exceptions.RunNotFound(run_id)
    spec = load_spec(run.definition_id)
    step = spec.steps[run.current_step] if run.current_step < len(spec.steps) else None
    if run.status != RunStatus.WAITING_FOR_SIGNAL or step is None or not (
            step.wait and step.wait.human):
        raise exceptions.RunNotWaiting(
            run_id, f"Run {run_id} is not waiting on a person, so it has no approval link.")
    return signing.dumps({"r": run_id, "s": run.current_step, "t": run.transitions,
                          "n": secrets.token_urlsafe(12)}, salt=SALT, compress=True)


def approval_link(run_id: int) -> str:
    """Return the link to the approval page for run ``run_id``'s current human wait.

    An absolute URL when ``QUEUETY["BASE_URL"]`` is set (``BASE_URL`` followed by the page's
    path), so a Celery task can mail it; otherwise the page's path, to be joined to the site's
    address (``request.build_absolute_uri(link)`` in a view).
    """
    path = reverse("queuety:approval-page", args=[make_token(run_id)])
    if settings.BASE_URL is None:
        return path
    return str(settings.BASE_URL).rstrip("/") + path


def read_token(token: str) -> Ticket:
    """Check a token's signature and age; return what it grants."""
    try:
        data = signing.loads(token, salt=SALT, max_age=settings.APPROVAL_LINK_MAX_AGE)
    except signing.SignatureExpired:
        raise ExpiredLink("This approval link has expired; ask for a new one.") from None
    except signing.BadSignature:
        raise InvalidLink("This approval link is not valid.") from None
    return Ticket(data["r"], data["s"], data["t"], data["n"])


def redeem(token: str, kind: str, data: Any) -> inbox.SignalReceipt:
    """Answer the wait a token names, once: ``kind`` is approve, reject or input."""
    ticket = read_token(token)
    return inbox.reply(ticket.run_id, kind, data, sent_by="approval link",
                          dedupe_key=f"approval-link:{ticket.nonce}",
                          step_index=ticket.step_index, transitions=ticket.transitions)
