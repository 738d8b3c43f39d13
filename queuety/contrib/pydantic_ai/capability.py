"""The Pydantic AI capability that makes one attempt of an agent step durable.

It hooks the two points where an agent run leaves the process, through Pydantic AI's public
capability interface: ``wrap_model_request`` (each model request) and ``wrap_tool_execute``
(each tool call). Each either answers from the step row's :class:`Journal` (a replay: no
model, no tool, no slot, no span) or makes the call, inside its model's slot and a span, and
records it before the agent goes on.

Model requests of one agent run are sequential, so they are numbered 1, 2, ... in the order
the agent makes them; the tool calls a response asked for are keyed by that response's number
and their tool call id (the ids are in the recorded response, so a replay sees the same ones),
since parallel tool calls complete in any order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic_ai.capabilities import (
    AbstractCapability,
    ValidatedToolArgs,
    WrapModelRequestHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import ModelRetry, ToolRetryError
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_core import to_jsonable_python

from queuety import tracing
from queuety.contrib.pydantic_ai import checkpoints, limits
from queuety.contrib.pydantic_ai.checkpoints import MODEL, RETRY, TOOL, Journal


@dataclass(init=False)
class Checkpointing(AbstractCapability[Any]):
    """Replays what the journal holds, records what it does not (one per attempt)."""

    journal: Journal
    requests: int = 0
    """Model requests this agent run has made so far (replayed or sent)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.requests = 0

    async def wrap_model_request(self, ctx: RunContext[Any], *,
                                 request_context: ModelRequestContext,
                                 handler: WrapModelRequestHandler) -> ModelResponse:
        self.requests += 1
        seq = self.requests
        name = limits.model_id(request_context.model)
        fingerprint = checkpoints.request_fingerprint(request_context.messages)
        recorded = self.journal.replay(MODEL, seq, "", name, fingerprint)
        if recorded is not None:
            return checkpoints.load_response(recorded)
        limit = limits.limit_of(request_context.model)
        async with limits.slot(limit, self.journal.step_run_id, self.journal.attempt):
            with tracing.work_span(f"queuety.agent.request {name}", model=name,
                                   checkpoint=seq, run_id=self.journal.run_id) as span:
                response = await handler(request_context)
                tokens = response.usage.total_tokens
                span.set(input_tokens=response.usage.input_tokens,
                         output_tokens=response.usage.output_tokens)
        stored = await self.journal.arecord(MODEL, seq, "", name, fingerprint,
                                            checkpoints.dump_response(response), tokens)
        # An earlier attempt (lost, yet still running) recorded this request first: go on
        # with its answer, as a replay would.
        return response if stored is None else checkpoints.load_response(stored)

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                tool_def: ToolDefinition, args: ValidatedToolArgs,
                                handler: WrapToolExecuteHandler) -> Any:
        seq, key = self.requests, call.tool_call_id
        fingerprint = checkpoints.tool_fingerprint(call.tool_name, args)
        for kind in (TOOL, RETRY):
            if (kind, seq, key) in self.journal.records:
                result = self.journal.replay(kind, seq, key, call.tool_name, fingerprint)
                # The agent counts a tool call where it runs; a replayed one still is one.
                ctx.usage.tool_calls += 1
                if kind == RETRY:
                    raise ModelRetry(result)  # the model is asked again, as the first time
                return result
        with tracing.work_span(f"queuety.agent.tool {call.tool_name}", remote=False,
                               tool=call.tool_name, checkpoint=seq, run_id=self.journal.run_id):
            try:
                result = await handler(args)
            except (ModelRetry, ToolRetryError) as error:
                # Part of the conversation: the retry prompt the model gets is recorded too,
                # so a replay asks the model the same, without running the tool again. (The
                # tool manager wraps a tool's ModelRetry in a ToolRetryError.)
                retry = error if isinstance(error, ModelRetry) else error.__cause__
                if isinstance(retry, ModelRetry):
                    await self.journal.arecord(RETRY, seq, key, call.tool_name, fingerprint,
                                               retry.message)
                raise
        stored = await self.journal.arecord(TOOL, seq, key, call.tool_name, fingerprint,
                                            to_jsonable_python(result))
        return result if stored is None else stored
