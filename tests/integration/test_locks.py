"""The resource locks' modes against PostgreSQL (queuety.store.locks): a transaction waits only
for its first resource locks, tries any later one, and is refused a wait once it holds one."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, transaction

from queuety import exceptions
from queuety.store import groups, locks


def _held_elsewhere(name: str, release: threading.Event, taken: threading.Event) -> None:
    """Hold group ``name``'s lock in another connection until ``release`` is set."""
    try:
        with transaction.atomic():
            assert groups.lock(name, None, locks.WAIT)
            taken.set()
            release.wait(10)
    finally:
        connection.close()


def test_a_transaction_waits_for_its_first_lock_then_only_tries_and_may_not_wait_again():
    mine, busy = f"l-{uuid.uuid4().hex[:10]}", f"l-{uuid.uuid4().hex[:10]}"
    release, taken = threading.Event(), threading.Event()
    other = threading.Thread(target=_held_elsewhere, args=(busy, release, taken))
    other.start()
    try:
        assert taken.wait(10)
        with transaction.atomic():
            assert not locks.holding()
            assert groups.lock(mine, None, locks.WAIT)
            assert locks.holding()
            # A later lock is only tried: a busy one is refused, a free one (or its own) taken.
            assert not groups.lock(busy, None, locks.TRY)
            assert groups.lock(mine, f"q-{mine}", locks.TRY)
            with pytest.raises(exceptions.QueuetyError, match="locks.TRY if locks.holding"):
                groups.lock(f"{mine}-x", None, locks.WAIT)
        assert not locks.holding()
    finally:
        release.set()
        other.join()


def test_a_lock_tried_first_counts_as_held_and_a_rolled_back_savepoint_forgets_it():
    name = f"l-{uuid.uuid4().hex[:10]}"
    with transaction.atomic():
        assert locks.try_hold(locks.GROUP, [name]) == {name}
        assert locks.holding()
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            assert groups.lock(name, None, locks.WAIT)
            assert locks.holding()
            raise RuntimeError
        assert not locks.holding()
        assert groups.lock(name, None, locks.WAIT)
