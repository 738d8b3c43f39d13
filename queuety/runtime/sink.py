"""The sink of one attempt: where ``context.put_artifact()`` and a streaming step's chunks go.

Nothing is read or written for an attempt that neither stores an artifact nor streams, so plain
steps keep their two database round trips.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from queuety import exceptions
from queuety.conf import settings
from queuety.core import artifacts as rules
from queuety.runtime import artifacts, chunks
from queuety.runtime.claim import Claim


class AttemptOutputs:
    """Implements :class:`queuety.core.streaming.AttemptSink` for the attempt ``held``."""

    def __init__(self, held: Claim, step_name: str, *, streams: bool = True) -> None:
        self.held, self.step_name, self.streams = held, step_name, streams
        #: How many artifacts this attempt wrote: the outcome publishes them when nonzero.
        self.artifacts_written = 0
        self._chunks: list[Any] | None = None
        self._writer: chunks.ChunkWriter | None = None
        self._ended = False

    def end(self) -> None:
        """The attempt's body is over (returned, raised, or was abandoned at its deadline): a
        write from a thread it left running is refused, so it can neither join the recorded
        outcome nor leave an invisible row behind it."""
        self._ended = True

    def put_artifact(self, key: str, content: Any, kind: str,
                     metadata: dict[str, Any] | None) -> None:
        self._refuse_once_ended(f"artifact {key!r}")
        encoded = rules.encode(key, content, kind, metadata, limit=settings.MAX_ARTIFACT_BYTES,
                               run_id=self.held.run_id)
        artifacts.write_pending(self.held, self.step_name, encoded)
        self.artifacts_written += 1

    def stored_chunks(self) -> list[Any]:
        self._refuse_unless_streaming()
        if self._chunks is None:
            self._chunks = chunks.stored(self.held.step_run_id)
        return self._chunks

    def append_chunk(self, content: Any) -> None:
        self._refuse_unless_streaming()
        self._refuse_once_ended("a chunk")
        text = rules.encode_chunk(content, limit=settings.MAX_CHUNK_BYTES, step=self.step_name,
                                  run_id=self.held.run_id)
        if self._writer is None:
            # Inside a transaction (a site's test under pytest-django's db fixture, run by
            # queuety.testing) a writer thread's connection would not see the step row:
            # chunks are then written here, one statement each.
            interval = 0 if transaction.get_connection().in_atomic_block \
                else settings.CHUNK_FLUSH_INTERVAL
            self._writer = chunks.ChunkWriter(
                self.held, self.step_name, len(self.stored_chunks()),
                interval=interval, buffer=settings.CHUNK_BUFFER)
        self._writer.add(text)

    def finish_stream(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _refuse_once_ended(self, what: str) -> None:
        if self._ended:
            raise exceptions.StepTimeout(
                f"Step {self.step_name!r} of run {self.held.run_id} (attempt "
                f"{self.held.attempt}) wrote {what} after its attempt had ended (its deadline "
                "passed while the body went on in a thread); the write is refused.")

    def _refuse_unless_streaming(self) -> None:
        if not self.streams:
            raise exceptions.InvalidStepOutput(
                f"Step {self.step_name!r} of run {self.held.run_id} is a fan-out branch; only "
                "a then() step can stream (yield chunks).")
