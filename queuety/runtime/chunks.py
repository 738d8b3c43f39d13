"""Chunk rows of streaming steps: stored as a generator yields them, read back by the next
attempt of the same step row and by readers while the step runs.

One INSERT per chunk costs a commit (a WAL flush) per chunk: measured at 5-10 ms on a busy
2-core machine, so 100-200 chunks/s, below what a fast model streams. So by default chunks are
written in batches by a writer thread of the attempt, at most ``CHUNK_FLUSH_INTERVAL`` seconds
(0.05) after they were yielded: each batch is one transaction whatever its size, so a step
sustains what its generator produces (docs/performance.md has the figures). The generator never
waits for the database, except when ``CHUNK_BUFFER`` chunks are waiting (back-pressure). A
worker killed outright loses at most the chunks of the last interval; those stored always form
a prefix of what was yielded, which the next attempt reads back. ``CHUNK_FLUSH_INTERVAL = 0``
writes each chunk before the generator resumes instead (one guarded statement each).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from queuety import exceptions
from queuety.models import StepChunk
from queuety.runtime.claim import Claim, owned
from queuety.store import rows


def stored(step_run_id: int) -> list[Any]:
    """The chunks stored for a step row so far, in order, as JSON values."""
    return [json.loads(text) for text in StepChunk.objects.filter(step_run_id=step_run_id)
            .order_by("index").values_list("content", flat=True)]


def append(held: Claim, step_name: str, index: int, text: str) -> bool:
    """Store chunk ``index`` (JSON ``text``) of the attempt ``held`` in one statement, in
    autocommit; False when the attempt no longer owns its step row (nothing was stored)."""
    return rows.append_chunk([held.run_id, held.step_run_id, held.step_index, step_name, index,
                              held.attempt, text, timezone.now(), held.step_run_id,
                              held.attempt, held.claimed_by])


def append_batch(held: Claim, step_name: str, first: int, texts: list[str]) -> bool:
    """Store chunks ``first``, ``first + 1``, ... in one transaction, if the attempt still
    owns its step row; False (nothing stored) when it does not."""
    now = timezone.now()
    try:
        with transaction.atomic():
            # Locked, not only read: an outcome (or the sweeper taking the row back) then
            # commits after this batch, never between the check and the insert, so a retry
            # reads back every chunk its predecessor stored.
            if not owned(held).select_for_update(no_key=True).values_list("pk", flat=True)[:1]:
                return False
            StepChunk.objects.bulk_create([StepChunk(
                run_id=held.run_id, step_run_id=held.step_run_id, step_index=held.step_index,
                step_name=step_name, index=first + n, attempt=held.attempt, content=text,
                created_at=now) for n, text in enumerate(texts)])
    except IntegrityError:
        return False  # another attempt of the row stored these indexes: this one lost it
    return True


class ChunkWriter:
    """Stores one attempt's chunks in order, in batches written by a thread of its own.

    :meth:`add` queues a chunk (and raises the writer's failure, if it had one);
    :meth:`close` writes what is left and stops the thread. With ``interval`` 0, :meth:`add`
    writes the chunk itself before returning.
    """

    def __init__(self, held: Claim, step_name: str, next_index: int, *, interval: float,
                 buffer: int) -> None:
        self.held, self.step_name = held, step_name
        self.interval, self.limit = interval, buffer
        self._next = next_index  # index of the first chunk not yet stored
        self._pending: list[str] = []
        self._failure: BaseException | None = None
        self._closed = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, text: str) -> None:
        """Queue one chunk (JSON text); durable within ``interval`` seconds.

        Raises:
            WorkerLost: the attempt no longer owns its step row (its stream must stop).
            DatabaseError: the writer could not store earlier chunks.
        """
        if self.interval <= 0:
            self._write_now(text)
            return
        with self._wake:
            self._raise_failure()
            self._pending.append(text)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"queuety-chunks-{self.held.step_run_id}")
                self._thread.start()
            while len(self._pending) >= self.limit and self._failure is None:
                self._wake.notify_all()
                self._wake.wait(1.0)  # back-pressure: the database is slower than the stream
            self._raise_failure()

    def close(self) -> None:
        """Store every queued chunk, then stop the writer thread.

        Raises:
            WorkerLost, DatabaseError: as :meth:`add`, for the chunks still queued.
        """
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._wake:
            self._raise_failure()

    def _write_now(self, text: str) -> None:
        try:
            owns = append(self.held, self.step_name, self._next, text)
        except BaseException:
            # Interrupted mid-statement (the step's deadline, say): the connection's protocol
            # state is unknown, and recording the outcome needs a sound one.
            if not connection.in_atomic_block:
                try:
                    connection.close()
                except Exception:  # noqa: BLE001 - Django forgets it either way
                    pass
            raise
        if not owns:
            raise self._lost()
        self._next += 1

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    if not self._pending and not self._closed:
                        self._wake.wait(self.interval)
                    batch, self._pending = self._pending, []
                    closing = self._closed
                if batch:
                    if not append_batch(self.held, self.step_name, self._next, batch):
                        raise self._lost()
                    self._next += len(batch)
                    with self._wake:
                        self._wake.notify_all()  # a generator held back by a full buffer
                if closing:
                    with self._wake:
                        if not self._pending:
                            return
                elif batch:
                    # Gather the chunks of the next interval into one transaction.
                    with self._wake:
                        self._wake.wait(self.interval)
        except (DatabaseError, exceptions.WorkerLost) as error:
            with self._wake:
                self._failure = error
                self._wake.notify_all()
        finally:
            connection.close()  # this thread's own connection

    def _lost(self) -> exceptions.WorkerLost:
        return exceptions.WorkerLost(
            f"Step {self.step_name!r} of run {self.held.run_id} (attempt {self.held.attempt}) "
            "no longer owns its step row (the sweeper took it back, or the run was cancelled "
            "or rewound); its stream stops here.")

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure
