"""Transaction-scoped advisory locks: what serialises the admissions of one concurrency group
or queue (``queuety.store.groups``) and the writes of one artifact key (``queuety.runtime.
artifacts``) across every process and machine.

Each lock is ``pg_advisory_xact_lock(namespace, hashtext(name))``, released when the
transaction (or the savepoint it was taken in) ends. No cycle of waiters can form among the
resource locks, because of one rule: a transaction waits only for the locks of one
:func:`acquire` (a step's queue, then its group); once it holds a resource lock, a later
:func:`acquire` only *tries*. (A queue's waker then only tries its groups: :func:`try_hold`.) A transaction that lands several
runs' steps in groups (a ``dispatch()`` loop inside one ``atomic()``) would otherwise hold one
group's lock while it waits for the next, in whatever order its runs come. On SQLite (the
demo's single machine) the locks are no-ops: it serialises writers itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection, transaction

from queuety.store import sql

#: First keys of the advisory locks (second key: the name's hash).
GROUP, QUEUE, ARTIFACT = sql.GROUP_LOCK_KEY, sql.QUEUE_LOCK_KEY, 7_404


def _holding_marker() -> None:
    """Registered with ``on_commit`` while this transaction holds a resource lock: Django
    drops it when the transaction, or the savepoint the lock was taken in, ends, exactly as
    PostgreSQL releases the lock."""


def holding() -> bool:
    """Whether this transaction already holds a resource lock taken by :func:`acquire`."""
    return any(entry[1] is _holding_marker for entry in connection.run_on_commit)


def acquire(locks: list[tuple[int, str]]) -> bool:
    """Take the resource locks ``locks`` (``(namespace, name)``, in the order given) until this
    transaction ends; call inside ``transaction.atomic()``. A transaction holding none yet
    waits for each; one that already holds a resource lock only tries, and gets False when one
    is busy (what it took meanwhile stays held): the caller then decides without the lock."""
    if connection.vendor != "postgresql" or not locks:
        return True
    wait = not holding()
    with connection.cursor() as cursor:
        for namespace, name in locks:
            if wait:
                cursor.execute(sql.GROUP_LOCK, [namespace, name])
            else:
                cursor.execute(sql.TRY_LOCK, [namespace, name])
                if not cursor.fetchone()[0]:
                    return False
    if wait:
        transaction.on_commit(_holding_marker)
    return True


def try_hold(namespace: int, names: Iterable[str]) -> set[str]:
    """Take, without waiting, the locks of ``names`` that are free, until this transaction
    ends; return the names locked (all of them on SQLite). For a taker that holds another
    lock and must not stall behind a long transaction holding one of these."""
    wanted = sorted(set(names))
    if connection.vendor != "postgresql" or not wanted:
        return set(wanted)
    with connection.cursor() as cursor:
        cursor.execute(sql.TRY_LOCKS, [wanted, namespace])
        return {row[0] for row in cursor.fetchall()}


def hold(namespace: int, names: Iterable[str]) -> None:
    """Take the locks of ``names`` in ``namespace`` until this transaction ends, waiting for
    each, in the order of their keys (call inside ``transaction.atomic()``): for locks no one
    holds while waiting for another (an artifact key's)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(sql.HOLD_LOCKS, [namespace, sorted(set(names))])
