"""Transaction-scoped advisory locks: what serialises the admissions of one concurrency group
or queue (``queuety.store.groups``), the writes of one artifact key (``queuety.runtime.
artifacts``) and the claims of the sweeper's lease (``queuety.store.sweeps``) across every
process and machine.

Each lock is ``pg_advisory_xact_lock(namespace, hashtext(name))``, released when the
transaction ends, or when the savepoint it was taken in is rolled back. On SQLite (the demo's
single machine) the locks are no-ops: it serialises writers itself.

Whether :func:`acquire` waits for a busy resource lock or only tries it is the caller's
choice, its ``mode``: :data:`WAIT` or :data:`TRY`. No cycle of waiters can form among the
resource locks because every caller keeps one rule: a transaction waits only for the locks of
its first acquire (a step's queue, then its group); once it holds a resource lock
(:func:`holding`), it only tries. A caller that may run inside a transaction that already
holds one (a ``dispatch()`` loop inside one ``atomic()`` lands several runs' steps, in
whatever order its runs come) therefore passes ``TRY if holding() else WAIT``, and says what
a busy lock means for it: a landing publishes its step for the gate to decide at the claim; a
claimed step's gate and a waker raise. :func:`acquire` refuses :data:`WAIT` from a transaction
that holds a resource lock, so a caller that forgets the rule fails at once instead of
deadlocking later. A queue's waker, which holds its queue's lock, only tries its groups'
(:func:`try_hold`), except the one group whose wake-up asked for it, whose lock it takes with
the queue's in its first acquire, waiting, as a gate does.

What a transaction holds is remembered with its on-commit callbacks: a marker callback, which
Django drops when the transaction ends or the savepoint it was registered in is rolled back,
exactly as PostgreSQL releases the lock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from django.db import connection, transaction

from queuety import exceptions
from queuety.store import sql

#: First keys of the advisory locks (second key: the name's hash). ``SWEEP``: the claim of
#: the sweeper's lease (``queuety.store.sweeps``), which only ever tries it.
GROUP, QUEUE, ARTIFACT, SWEEP = sql.GROUP_LOCK_KEY, sql.QUEUE_LOCK_KEY, 7_404, 7_420


class Mode(enum.Enum):
    """How :func:`acquire` takes a lock that another transaction holds."""

    WAIT = "wait"
    """Wait until it is free: only for a transaction's first resource locks."""
    TRY = "try"
    """Take it only if it is free: for any later ones."""


WAIT, TRY = Mode.WAIT, Mode.TRY


def _holding_marker() -> None:
    """Registered with ``on_commit`` while this transaction holds a resource lock: Django
    drops it when the transaction ends, or the savepoint the lock was taken in is rolled
    back, exactly as PostgreSQL releases the lock."""


def holding() -> bool:
    """Whether this transaction already holds a resource lock (taken by :func:`acquire` or
    :func:`try_hold`): then it may only :data:`TRY` for another."""
    return any(entry[1] is _holding_marker for entry in connection.run_on_commit)


def acquire(locks: list[tuple[int, str]], mode: Mode) -> bool:
    """Take the resource locks ``locks`` (``(namespace, name)``, in the order given) until this
    transaction ends; call inside ``transaction.atomic()``. With :data:`WAIT`, wait for each;
    with :data:`TRY`, get False when one is busy (what it took before stays held): the caller
    then decides without it.

    Raises:
        QueuetyError: :data:`WAIT` from a transaction that already holds a resource lock
            (see the module's docstring: pass ``TRY if holding() else WAIT``).
    """
    if connection.vendor != "postgresql" or not locks:
        return True
    already = holding()
    if mode is Mode.WAIT and already:
        raise exceptions.QueuetyError(
            f"A transaction that holds a resource lock asked to wait for {locks!r}; it may "
            "only try (locks.TRY), or two such transactions could deadlock. Pass "
            "locks.TRY if locks.holding() else locks.WAIT.")
    taken = _take(locks, mode)
    if taken and not already:
        transaction.on_commit(_holding_marker)
    return taken == len(locks)


def _take(locks: list[tuple[int, str]], mode: Mode) -> int:
    """Take ``locks`` in order; how many were taken (with :data:`TRY`, those before the first
    busy one)."""
    with connection.cursor() as cursor:
        for taken, (namespace, name) in enumerate(locks):
            if mode is Mode.WAIT:
                cursor.execute(sql.GROUP_LOCK, [namespace, name])
                continue
            cursor.execute(sql.TRY_LOCK, [namespace, name])
            if not cursor.fetchone()[0]:
                return taken
    return len(locks)


def try_hold(namespace: int, names: Iterable[str]) -> set[str]:
    """Take, without waiting, the resource locks of ``names`` that are free, until this
    transaction ends; return the names locked (all of them on SQLite). For a taker that holds
    another lock and must not stall behind a long transaction holding one of these."""
    wanted = sorted(set(names))
    if connection.vendor != "postgresql" or not wanted:
        return set(wanted)
    already = holding()
    with connection.cursor() as cursor:
        cursor.execute(sql.TRY_LOCKS, [wanted, namespace])
        taken = {row[0] for row in cursor.fetchall()}
    if taken and not already:
        transaction.on_commit(_holding_marker)
    return taken


def hold(namespace: int, names: Iterable[str]) -> None:
    """Take the locks of ``names`` in ``namespace`` until this transaction ends, waiting for
    each, in the order of their keys (call inside ``transaction.atomic()``): for locks no one
    holds while waiting for another (an artifact key's)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(sql.HOLD_LOCKS, [namespace, sorted(set(names))])
