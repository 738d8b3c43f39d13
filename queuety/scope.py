"""Which runs a user may reach: ``QUEUETY["RUN_SCOPE"]`` and ``QUEUETY["RUN_ACCESS"]``, in
one place.

``RUN_SCOPE`` is ``f(user, queryset) -> queryset``: it narrows a queryset of runs in SQL, so
every list, count, filter, bulk action and lookup by id that goes through :func:`scoped_runs`
(or, for rows reached through their run, :func:`through_runs`) sees only the user's runs. A
run outside it is *not found*, never *forbidden*: a 403 would confirm that the id exists.
``RUN_ACCESS`` is ``f(user, run) -> bool``, asked about each run the scope let through.

Both apply to every user they are given, superusers included: a site whose staff see every
tenant says so in its own function (``if user.is_superuser: return queryset``). ``user`` is
``None`` for an operator's process acting with full access (the CLI without ``--as-user``,
the sweeper): nothing is narrowed then.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model, Q, QuerySet

from queuety.conf import settings
from queuety.models import WorkflowRun

M = TypeVar("M", bound=Model)


def scoped_runs(user: Any, runs: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """``runs`` narrowed to those ``user`` may reach (``QUEUETY["RUN_SCOPE"]``), as SQL.

    Raises:
        ImproperlyConfigured: the site's function returned something other than a queryset
            of runs.
    """
    if settings.RUN_SCOPE is None or user is None:
        return runs
    return runs.filter(pk__in=_reachable(user).values("pk"))


def _reachable(user: Any) -> QuerySet[WorkflowRun]:
    """Every run ``user`` may reach, as the site's function answers (one subquery)."""
    scope = settings.RUN_SCOPE
    # The function is given every run and its answer is joined to the caller's queryset: one
    # that ignored its queryset (``WorkflowRun.objects.filter(owner=user)``) still narrows
    # what it is joined to, never replaces it (a lookup by id would get the user's first run).
    scoped = scope(user, WorkflowRun.objects.all())
    if not isinstance(scoped, QuerySet) or scoped.model is not WorkflowRun:
        raise ImproperlyConfigured(
            f"QUEUETY['RUN_SCOPE'] ({getattr(scope, '__qualname__', scope)!r}) returned "
            f"{type(scoped).__name__} for user {getattr(user, 'pk', user)!r}; it must return "
            "the queryset of runs it was given, filtered (queryset.filter(...)).")
    return scoped


def is_scoped() -> bool:
    """Whether a ``RUN_SCOPE`` is configured (else no query needs narrowing)."""
    return settings.RUN_SCOPE is not None


def through_runs(user: Any, rows: QuerySet[M], field: str = "run",
                 unowned: bool = False) -> QuerySet[M]:
    """``rows`` (waits, events, artifacts, chunks, deliveries: anything that names a run in
    ``field``) narrowed to those whose run ``user`` may reach: one ``IN (subquery)`` on the
    scoped runs, so the narrowing stays in SQL.

    ``unowned``: rows whose ``field`` is NULL (a delivery of no run) are kept too.
    """
    if settings.RUN_SCOPE is None or user is None:
        return rows
    reachable = Q(**{f"{field}__in": _reachable(user).values("pk")})
    if unowned:
        reachable |= Q(**{f"{field}__isnull": True})
    return rows.filter(reachable)


def may_access(user: Any, run: WorkflowRun) -> bool:
    """Whether ``QUEUETY["RUN_ACCESS"]`` lets ``user`` act on ``run`` (True when unset)."""
    check = settings.RUN_ACCESS
    return check is None or user is None or bool(check(user, run))


def hidden_key(user: Any, key: str | None, run_id: int) -> str | None:
    """The answer to give ``user`` whose start reused idempotency ``key``, which started run
    ``run_id``, when that run is outside their scope (None: it is theirs to see).

    Keys are global, so the key cannot be theirs; the answer names no run and is the same
    whether their payload matched or not (two answers would confirm a guess at another
    tenant's payload)."""
    if find_run(user, run_id, "pk") is not None:
        return None
    return taken_key(key)


def taken_key(key: str | None) -> str:
    """What a caller is told of an idempotency key it may not learn more about."""
    return (f"Idempotency key {key!r} is already taken; nothing was dispatched. Use a new "
            "key for a new run.")


def purged_key(key: str | None) -> str:
    """What a caller of a site with tenants is told of an idempotency key whose run was
    purged: no run, workflow or date (the run can no longer be checked against a scope)."""
    return (f"Idempotency key {key!r} started a run that retention has purged; nothing was "
            "dispatched. Use a new key for a new run.")


def find_run(user: Any, run_id: int, *fields: str) -> WorkflowRun | None:
    """Run ``run_id`` (only ``fields``, when given) if it exists and is inside ``user``'s
    scope; None otherwise: a caller answers both the same way (not found)."""
    if not 0 < run_id < 2**63:  # past the column's range: a database error, not a run
        return None
    runs = scoped_runs(user, WorkflowRun.objects.filter(pk=run_id))
    return (runs.only(*fields) if fields else runs).first()
