"""The sweeper's lease: one row that says which worker sweeps, or swept last, and since when.

Every worker's main process offers to sweep each ``SWEEP_INTERVAL`` (``queuety.runtime.
sweep_tick``), and so does a ``queuety.sweep`` message from beat; the one whose :func:`claim`
succeeds sweeps. A claim succeeds when the last sweep started at least an interval ago, by the
database's clock (so workers whose clocks disagree still agree), and has ended, or its lease
expired: its sweeper died, or stopped renewing.

A claim is one short transaction, safe behind PgBouncer in transaction mode: the advisory lock
it tries is transaction-scoped (a session lock could stay behind on a server connection that
another client then gets), and the sweep itself runs outside it, holding nothing but the row's
token. The row is written compare-and-set on that token, so even without the lock (SQLite,
which has none and serialises writers itself) two claims of one sweep cannot both succeed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from queuety.models import SweepLease
from queuety.store import locks

#: The lease's row (one for the whole site).
NAME = "sweeper"


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed sweep: only its ``token`` renews or ends it."""

    token: int
    holder: str
    took_over: str | None = None
    """The holder of the sweep that had not ended when its lease expired (it died, or hung)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a claim did not get the lease, and when to ask again."""

    holder: str
    retry_in: float
    """Seconds until the lease is due again, by the database's clock (0: ask again soon)."""


def claim(holder: str, interval: float, lease: float, name: str = NAME) -> Lease | Refusal:
    """Claim the next sweep for ``holder`` if one is due (the last started ``interval``
    seconds ago or more) and the last has ended or its ``lease`` expired. ``name``: the
    lease's row (another than the site's only in tests)."""
    with transaction.atomic():
        # Another process claiming right now: skip, do not queue behind it for the row.
        if not locks.try_hold(locks.SWEEP, [name]):
            return Refusal("another worker", 0.0)
        row = (SweepLease.objects.select_for_update().filter(name=name)
               .annotate(now=Now()).first())
        if row is None:
            return _first_claim(holder, lease, name)
        now: datetime = row.now  # the annotation: the database's clock
        if row.started_at is not None and row.started_at + timedelta(seconds=interval) > now:
            return Refusal(row.holder, (row.started_at - now).total_seconds() + interval)
        ended = row.finished_at is not None or row.expires_at is None
        if not ended and row.expires_at is not None and row.expires_at > now:
            return Refusal(row.holder, min(interval, (row.expires_at - now).total_seconds()))
        claimed = SweepLease.objects.filter(name=name, token=row.token).update(
            token=F("token") + 1, holder=holder, started_at=now, finished_at=None,
            expires_at=now + timedelta(seconds=lease))
        if not claimed:  # another claim of this very sweep won (only without the lock)
            return Refusal(row.holder, 0.0)
        return Lease(row.token + 1, holder, None if ended else row.holder)


def _first_claim(holder: str, lease: float, name: str) -> Lease | Refusal:
    """The site's first sweep: the row is made by its first claim."""
    try:
        with transaction.atomic():
            SweepLease.objects.create(
                name=name, token=1, holder=holder, started_at=Now(),
                expires_at=Now() + timedelta(seconds=lease))
    except IntegrityError:  # made by another claim at the same moment
        return Refusal("another worker", 0.0)
    return Lease(1, holder)


def renew(token: int, lease: float, name: str = NAME) -> bool:
    """Push the lease of sweep ``token`` ``lease`` seconds on; False if it is no longer held
    (it expired and another worker took it over)."""
    return bool(SweepLease.objects.filter(name=name, token=token, finished_at__isnull=True)
                .update(expires_at=Now() + timedelta(seconds=lease)))


def release(token: int, name: str = NAME) -> bool:
    """End sweep ``token``: the next may start once it is due. False if it was taken over."""
    return bool(SweepLease.objects.filter(name=name, token=token, finished_at__isnull=True)
                .update(finished_at=Now()))
