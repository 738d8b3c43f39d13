"""Steps of the artifact and streaming tests; the worker subprocess imports them by path.

They leave marks (``tests.workflows.mark``) so a test can count real executions and see what
each attempt was given.
"""

from __future__ import annotations

import asyncio
import time

import queuety
from tests.workflows import mark, marks


def write_artifacts(state, context):
    """Three artifacts of three kinds, one written twice in the attempt (the last write wins)."""
    context.put_artifact("draft", {"title": "first try"}, metadata={"source": "planner"})
    context.put_artifact("draft", {"title": state["title"], "body": "..."},
                         metadata={"source": "planner"})
    context.put_artifact("notes", "# Notes\n\nDone.", kind="markdown")
    context.put_artifact("blob", b"\x00\x01binary", kind="bytes")
    return {"wrote": True}


def artifact_then_fail_once(state, context):
    """Writes ``draft`` on each attempt; the first attempt then fails (and is retried)."""
    context.put_artifact("draft", f"attempt {context.attempt}", kind="text")
    if context.attempt == 1:
        context.put_artifact("only_first", "from the failed attempt", kind="text")
        raise ConnectionError("the model's API dropped the connection")
    return {"attempts": context.attempt}


def artifact_then_fail(state, context):
    """Writes ``debug`` then fails for good: the failure is recorded, so ``debug`` shows."""
    context.put_artifact("debug", {"raw": "unparseable"})
    raise queuety.PermanentError("the answer could not be parsed")


class Tokens(queuety.Step):
    """Yields ``state["n"]`` tokens ``t0 `` ... resuming after the chunks earlier attempts
    stored. With ``hang_at``, the first attempt writes its pid and hangs before that token
    (the test kills it); ``pause`` sleeps before each token."""

    def handle(self, state):
        done = len(self.context.chunks)
        token = state["token"]
        mark(f"{token}-resume", f"{self.context.attempt}:{done}")
        self.context.put_artifact("partial", f"attempt {self.context.attempt}", kind="text")
        for i in range(done, state["n"]):
            if state.get("hang_at") == i and self.context.attempt == 1:
                mark(f"{token}-hang", "hanging")
                time.sleep(120)
            time.sleep(state.get("pause", 0))
            yield f"t{i} "

    def on_complete(self, chunks, state):
        return {"text": "".join(chunks), "count": len(chunks)}


def counted_tokens(state):
    """A generator function: its ``return`` value is the output (no on_complete)."""
    for i in range(state["n"]):
        yield {"i": i}
    return {"streamed": state["n"]}


class AsyncTokens(queuety.Step):
    """An async generator: JSON chunks, then on_complete."""

    async def handle(self, state):
        for word in state["words"]:
            await asyncio.sleep(0.01)
            yield word

    def on_complete(self, chunks, state):
        return {"sentence": " ".join(chunks)}


class EndlessTokens(queuety.Step):
    """Streams until its timeout interrupts it."""

    timeout = 1.5

    def handle(self, state):
        i = 0
        while True:
            time.sleep(0.2)
            yield f"t{i}"
            i += 1

    def on_complete(self, chunks, state):
        return {"never": True}


class FailAfterTwo(queuety.Step):
    """Yields two chunks and fails on the first attempt; the retry resumes after them."""

    def handle(self, state):
        start = len(self.context.chunks)
        mark(f"{state['token']}-given", f"{self.context.attempt}:{start}")
        for i in range(start, 4):
            if i == 2 and self.context.attempt == 1:
                raise ConnectionError("stream dropped")
            yield i

    def on_complete(self, chunks, state):
        return {"numbers": chunks}


def stream_in_branch(state, item=None, index=None):
    yield "no"


def pid_of_hang(token: str) -> int | None:
    """The pid of the pool process that hangs (marked by Tokens), once it is hanging."""
    found = marks(f"{token}-hang")
    return int(found[0].split()[0]) if found else None


class TakenBack(queuety.Step):
    """After two chunks, its step row is taken from it (as the sweeper takes a lost attempt
    back); the chunks it yields afterwards must not be stored."""

    def handle(self, state):
        from queuety.models import StepRun

        yield "kept-0"
        yield "kept-1"
        time.sleep(0.3)  # past the writer's flush interval: both are stored
        StepRun.objects.filter(run_id=self.context.run_id).update(claimed_by="elsewhere:1")
        for i in range(2, 50):
            time.sleep(0.01)
            yield f"lost-{i}"
