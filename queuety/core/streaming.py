"""Streaming steps: a handler that is a generator (sync or async) and yields chunks.

Each chunk is handed to the attempt's sink as it is yielded, which stores it durably (at once,
or batched within ``QUEUETY["CHUNK_FLUSH_INTERVAL"]``; all of them before the outcome). On a retry, the chunks stored by earlier attempts come first: the
handler reads them as ``context.chunks`` and decides how to resume. When the generator is
exhausted, the step's output is ``on_complete(chunks, state)`` when the handler's class defines
it (``chunks``: every stored chunk, earlier attempts' included), else the generator's
``return`` value (a sync generator may ``return {...}``), else nothing.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from contextlib import suppress
from typing import Any, Protocol


class AttemptSink(Protocol):
    """Where a running attempt writes its artifacts and chunks (``queuety.runtime`` gives
    each attempt one)."""

    def put_artifact(self, key: str, content: Any, kind: str,
                     metadata: dict[str, Any] | None) -> None:
        """Write an artifact, visible once the attempt's outcome is recorded."""

    def stored_chunks(self) -> list[Any]:
        """The chunks stored by earlier attempts of this step row (read once, then kept)."""

    def append_chunk(self, content: Any) -> None:
        """Store one chunk durably (at once, or within the sink's flush interval)."""

    def finish_stream(self) -> None:
        """Store every chunk still queued; raise if some could not be stored."""


def is_stream(value: Any) -> bool:
    """True for what a streaming handler returns: a generator or an async generator."""
    return inspect.isgenerator(value) or inspect.isasyncgen(value)


def consume(produced: Generator[Any, Any, Any] | AsyncGenerator[Any, Any], sink: AttemptSink,
            state: dict[str, Any],
            on_complete: Callable[[list[Any], dict[str, Any]], Any] | None) -> Any:
    """Drive a streaming handler to its end, storing each chunk; return the step's output.

    A deadline (``SIGALRM``) or an error in the generator propagates out of here after the
    generator is closed; the chunks it yielded before stay stored.
    """
    # Read before the generator's body runs: ``context.chunks`` then shows the earlier
    # attempts' chunks, never this attempt's.
    chunks = list(sink.stored_chunks())
    returned: Any = None
    try:
        if inspect.isasyncgen(produced):
            _consume_async(produced, sink, chunks)
        else:
            assert inspect.isgenerator(produced)
            try:
                while True:
                    try:
                        chunk = next(produced)
                    except StopIteration as stop:
                        returned = stop.value
                        break
                    sink.append_chunk(chunk)
                    chunks.append(chunk)
            finally:
                with suppress(Exception):
                    produced.close()
    except BaseException:
        # What was yielded before the error (or the deadline) is stored all the same; an
        # error storing it must not hide the one that stopped the stream.
        with suppress(Exception):
            sink.finish_stream()
        raise
    # Every chunk is stored before the output is computed, so before the outcome is recorded.
    sink.finish_stream()
    if on_complete is None:
        return returned
    result = on_complete(chunks, state)
    if inspect.isawaitable(result):
        result = run_awaitable(result)
    return result


def _consume_async(produced: AsyncGenerator[Any, Any], sink: AttemptSink,
                   chunks: list[Any]) -> None:
    # One private loop for the whole stream (not asyncio.run per chunk): the generator's
    # tasks and connections live on it between chunks. Each chunk is stored between two
    # steps of the loop, so it is durable before the generator resumes.
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                chunk = loop.run_until_complete(produced.__anext__())
            except StopAsyncIteration:
                break
            sink.append_chunk(chunk)
            chunks.append(chunk)
    finally:
        try:
            with suppress(Exception):
                loop.run_until_complete(produced.aclose())
        finally:
            close_loop(loop)


def run_awaitable(awaitable: Any) -> Any:
    """Run ``awaitable`` on a private event loop and return its result (a sync caller's
    ``async`` handler, or an ``on_complete``)."""
    # Not asyncio.run(): on the way out it waits for the default executor's threads, so a
    # timed-out `await asyncio.to_thread(...)` would hold the attempt open until the thread
    # finished. Here the loop is closed without waiting; the caller deals with leftover threads.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(awaitable)
    finally:
        close_loop(loop)


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a private loop still has, let them finish cancelling, and close it."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    finally:
        loop.close()
