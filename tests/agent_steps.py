"""Agent steps of the durable agents' tests (queuety.contrib.pydantic_ai), importable by the
worker: Pydantic AI agents on ``FunctionModel``s (offline) whose model functions and tools
append to a ledger (tests.workflows.mark), so a test counts every real call."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import queuety
from queuety.contrib.pydantic_ai import AgentStep
from tests.workflows import mark, marks


def _token(messages: list[ModelMessage]) -> str:
    """The test's token, from the run's first prompt (``"ledger <token>"``)."""
    for message in messages:
        for part in message.parts:
            content = getattr(part, "content", None)
            if part.part_kind == "user-prompt" and isinstance(content, str):
                return content.split()[1]
    raise AssertionError(f"no ledger prompt in {messages!r}")


def _answered(messages: list[ModelMessage]) -> int:
    return sum(isinstance(message, ModelResponse) for message in messages)


def ledger_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for tool ``first``, then ``second``, then answer; each request marks the ledger."""
    token, n = _token(messages), _answered(messages) + 1
    mark(f"{token}-ledger", f"model {n}")
    if n == 1:
        return ModelResponse(parts=[ToolCallPart("first", {"token": token}, tool_call_id="c1")])
    if n == 2:
        return ModelResponse(parts=[ToolCallPart("second", {"token": token},
                                                 tool_call_id="c2")])
    return ModelResponse(parts=[TextPart(f"done {token}")])


def build_deps(context: queuety.StepContext) -> dict[str, Any]:
    """The deps of one attempt: marks that it was built (never stored)."""
    mark(f"deps-{context.run_id}", f"attempt {context.attempt}")
    return {"run_id": context.run_id, "attempt": context.attempt, "secret": object()}


ledger_agent = Agent(FunctionModel(ledger_model, model_name="ledger"), name="ledger_research",
                     deps_type=dict)


@ledger_agent.tool
def first(ctx: RunContext[dict[str, Any]], token: str) -> str:
    """The first tool: marks the ledger with the attempt whose deps it got."""
    mark(f"{token}-ledger", f"tool first attempt={ctx.deps['attempt']}")
    return f"first result for {token}"


@ledger_agent.tool
def second(ctx: RunContext[dict[str, Any]], token: str) -> str:
    """The second tool: the first time it runs it lingers (the test SIGKILLs the worker
    there); the next time it returns at once."""
    lingered = any("tool second start" in line for line in marks(f"{token}-ledger"))
    mark(f"{token}-ledger", f"tool second start attempt={ctx.deps['attempt']}")
    if not lingered:
        time.sleep(60)
    mark(f"{token}-ledger", "tool second end")
    return "second result"


ledger_research = AgentStep(ledger_agent, prompt=lambda state: f"ledger {state['token']}",
                            deps=build_deps, output_key="answer")


async def slow_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Answer after 0.3 s, marking when the request started and ended."""
    token = _token(messages)
    mark(f"{token}-limited", f"start {time.time()}")
    await asyncio.sleep(0.3)
    mark(f"{token}-limited", f"end {time.time()}")
    return ModelResponse(parts=[TextPart("ok")])


limited_agent = Agent(FunctionModel(slow_model, model_name="limited"), name="limited_agent")
limited_agent_step = AgentStep(limited_agent, prompt=lambda state: f"ledger {state['token']}",
                               output_key="reply", name="limited_agent_step")


def chatty_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A long answer (many tokens), marked in the ledger."""
    mark(f"{_token(messages)}-chatty", "model")
    return ModelResponse(parts=[TextPart("words " * 200)])


chatty_agent = Agent(FunctionModel(chatty_model, model_name="chatty"), name="chatty_agent")
chatty_agent_step = AgentStep(chatty_agent, prompt=lambda state: f"ledger {state['token']}",
                              output_key="reply", name="chatty_agent_step")


def traced_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for ``lookup``, then ``flaky_tool``, then answer."""
    n = _answered(messages) + 1
    if n == 1:
        return ModelResponse(parts=[ToolCallPart("lookup", {"q": "a"}, tool_call_id="t1")])
    if n == 2:
        return ModelResponse(parts=[ToolCallPart("flaky_tool", {"q": "b"}, tool_call_id="t2")])
    return ModelResponse(parts=[TextPart("traced")])


def attempt_deps(context: queuety.StepContext) -> int:
    """The attempt number, as the deps."""
    return context.attempt


traced_agent = Agent(FunctionModel(traced_model, model_name="traced"), name="traced_agent",
                     deps_type=int)


@traced_agent.tool_plain
def lookup(q: str) -> str:
    """Always answers."""
    return f"looked up {q}"


@traced_agent.tool
def flaky_tool(ctx: RunContext[int], q: str) -> str:
    """Fails on the step's first attempt (the step is retried and replays what completed)."""
    if ctx.deps == 1:
        raise ConnectionError("the first attempt's tool call fails")
    return f"flaky {q}"


traced_agent_step = AgentStep(traced_agent, prompt="ledger traced", deps=attempt_deps,
                              output_key="reply", name="traced_agent_step")


def picky_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Call ``picky`` (which asks for a retry), then ``fragile``, then answer; the ledger
    counts each real request."""
    token = _token(messages)
    mark(f"{token}-retry-ledger", f"request {len(messages)}")
    last = messages[-1].parts if isinstance(messages[-1], ModelRequest) else []
    # The retry prompt: a RetryPromptPart, or (this version) a ToolReturnPart 'retried'.
    if any(isinstance(part, RetryPromptPart) or getattr(part, "outcome", None) == "retried"
           for part in last):
        return ModelResponse(parts=[ToolCallPart("fragile", {"token": token},
                                                 tool_call_id="f1")])
    if any(isinstance(part, ToolReturnPart) and part.tool_name == "fragile" for part in last):
        return ModelResponse(parts=[TextPart(f"careful {token}")])
    return ModelResponse(parts=[ToolCallPart("picky", {"token": token}, tool_call_id="p1")])


picky_agent = Agent(FunctionModel(picky_model, model_name="picky"), name="picky_agent",
                    deps_type=int)


@picky_agent.tool_plain
def picky(token: str) -> str:
    """Always asks the model to try again (ModelRetry)."""
    mark(f"{token}-retry-ledger", "picky")
    raise ModelRetry(f"ask again with care, {token}")


@picky_agent.tool
def fragile(ctx: RunContext[int], token: str) -> str:
    """Fails on the step's first attempt: the second replays up to here."""
    mark(f"{token}-retry-ledger", "fragile")
    if ctx.deps == 1:
        raise ConnectionError("the first attempt's fragile call fails")
    return "fine"


picky_agent_step = AgentStep(picky_agent, prompt=lambda state: f"ledger {state['token']}",
                             deps=attempt_deps, output_key="answer", name="picky_agent_step")
