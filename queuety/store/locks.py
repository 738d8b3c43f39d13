"""Transaction-scoped advisory locks: what serialises the admissions of one concurrency group
or queue (``queuety.store.groups``) and the writes of one artifact key (``queuety.runtime.
artifacts``) across every process and machine.

Each lock is ``pg_advisory_xact_lock(namespace, hashtext(name))``, released when the
transaction ends; several are taken in name order, so two takers never wait for each other
in a cycle. On SQLite (the demo's single machine) they are no-ops: it serialises writers.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from queuety.store import sql

#: First keys of the advisory locks (second key: the name's hash).
GROUP, QUEUE, ARTIFACT = sql.GROUP_LOCK_KEY, sql.QUEUE_LOCK_KEY, 7_404


def try_hold(namespace: int, names: Iterable[str]) -> set[str]:
    """Take, without waiting, the locks of ``names`` that are free, until this transaction
    ends; return the names locked (all of them on SQLite). For a taker that already holds
    another lock, which must never wait for one held by a transaction that may be waiting
    for its own."""
    wanted = sorted(set(names))
    if connection.vendor != "postgresql" or not wanted:
        return set(wanted)
    with connection.cursor() as cursor:
        cursor.execute(sql.TRY_LOCKS, [wanted, namespace])
        return {row[0] for row in cursor.fetchall()}


def hold(namespace: int, names: Iterable[str]) -> None:
    """Take the locks of ``names`` in ``namespace`` until this transaction ends, in name
    order (call inside ``transaction.atomic()``)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for name in sorted(set(names)):
            cursor.execute(sql.GROUP_LOCK, [namespace, name])
