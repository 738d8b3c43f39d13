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


def hold(namespace: int, names: Iterable[str]) -> None:
    """Take the locks of ``names`` in ``namespace`` until this transaction ends, in name
    order (call inside ``transaction.atomic()``)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for name in sorted(set(names)):
            cursor.execute(sql.GROUP_LOCK, [namespace, name])
