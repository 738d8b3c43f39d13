"""Exactly-once ORM steps: a transactional step's body and its transition in one transaction.

A step with ``transactional=True`` runs its body inside ``transaction.atomic()`` on the
connection Queuety writes its own rows with (Django's ``default``), and the transition that
records its outcome runs in the same transaction (``runtime.outcome.record_success`` with
``strict``). The body's ORM writes, its output and the next step's row therefore commit
together or not at all:

- a crash (a SIGKILL, a lost connection) before the commit leaves nothing: the sweeper, or
  the worker's main process, recovers the attempt and the retry runs on a clean slate;
- the transition's guarded update of the step row (``processing``, this attempt, this
  process) is the ownership check: if the attempt was taken back meanwhile, the caller gets
  :class:`~queuety.runtime.outcome.Discarded`, the transaction rolls back, the body's writes
  with it. The row is not locked before the body, so the heartbeat thread (another
  connection) keeps refreshing it while the body runs;
- the step's ``timeout`` becomes the transaction's ``statement_timeout`` on PostgreSQL: a
  statement still running then is cancelled by the server and the attempt is a
  :class:`~queuety.StepTimeout`, which the step's retry policy treats as any timeout.

An error leaves :func:`atomic_attempt` after the rollback; the caller records it as a plain
step's failure (a serialization failure or a deadlock is an ordinary error, retried by the
policy).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, transaction

from queuety import exceptions
from queuety.runtime import lane
from queuety.runtime.claim import Claim
from queuety.store import rows


@contextmanager
def atomic_attempt(held: Claim, step_name: str, timeout: float | None) -> Iterator[None]:
    """The transaction of one attempt of transactional step ``step_name``: its statements
    bounded by ``timeout``; a statement the server cancelled raised as a StepTimeout.

    Raises:
        PermanentError: this is an I/O lane worker, whose bodies run on its event loop or in
            threads of their own, outside this transaction.
        StepTimeout: a statement ran past ``timeout`` (``statement_timeout``).
    """
    if lane.current() is not None:
        raise exceptions.PermanentError(
            f"Step {step_name!r} of run {held.run_id} is transactional, but this worker is an "
            "I/O lane (--pool threads), which runs step bodies outside the transaction that "
            "records their outcome. Route the step to a queue served by prefork workers "
            "(queue=... on the step), or drop transactional=True.")
    try:
        with transaction.atomic():
            rows.limit_statements(timeout)
            yield
    except DatabaseError as error:
        if timeout is None or rows.sqlstate_of(error) != rows.QUERY_CANCELED:
            raise
        raise exceptions.StepTimeout(
            f"Step {step_name!r} of run {held.run_id} (attempt {held.attempt}) ran a "
            f"statement past its timeout of {timeout:g}s (the transaction's "
            "statement_timeout); its writes were rolled back.") from error
