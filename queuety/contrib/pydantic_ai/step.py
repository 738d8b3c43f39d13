"""``AgentStep``: a Pydantic AI agent run as one durable workflow step.

::

    research = AgentStep(research_agent, prompt=lambda state: state["question"],
                         deps=build_deps, output_key="answer")

    queuety.workflow("research").then(research).then(publish)

Inside the step every model request and tool call is checkpointed as it completes
(:mod:`~queuety.contrib.pydantic_ai.checkpoints`), so an attempt that is retried, or recovered
after its worker was killed, replays them and calls neither the model nor the tool again. The
step's outcome lands at the step boundary as any step's: the agent's output at ``output_key``,
the conversation at ``history_key`` and the token usage at ``usage_key``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic_ai.agent.abstract import AbstractAgent
from pydantic_core import to_jsonable_python

from queuety import exceptions
from queuety.contrib.pydantic_ai import checkpoints
from queuety.contrib.pydantic_ai.capability import Checkpointing
from queuety.contrib.pydantic_ai.checkpoints import Journal
from queuety.core.handlers import Step, StepContext

_OPTIONS = ("prompt", "deps", "output_key", "history_key", "usage_key", "retry", "timeout",
            "cost_units", "queue", "priority")


class AgentStep(Step):
    """A workflow step that runs a Pydantic AI agent durably.

    Define one at module level, either by calling it::

        research = AgentStep(agent, prompt=..., deps=..., output_key="answer")

    (the agent needs a ``name``, or pass ``name=``: the step is importable by a worker as
    ``<module>.<name>``), or by subclassing it and setting the same class attributes.

    Attributes:
        agent: the Pydantic AI agent (any ``AbstractAgent``).
        prompt: the user prompt: a string, or ``f(state) -> str``; None continues the
            conversation at ``history_key`` without a new prompt.
        deps: ``f(context) -> deps``, called once per attempt with the step's
            :class:`~queuety.StepContext`; the deps object is passed to the agent by
            reference and never stored.
        output_key: the state key of the agent's output (as JSON).
        history_key: the state key of the conversation: a list of turns ``{"transition",
            "step", "messages"}``; the next agent step with the same key continues it. Under
            ``prune_state_after(n)`` a turn leaves the history ``n`` transitions after the one
            that wrote it, as a state key would.
        usage_key: the state key of the run's token usage, summed over its agent steps.
    """

    agent: ClassVar[AbstractAgent[Any, Any]]
    prompt: ClassVar[str | Callable[[dict[str, Any]], str] | None] = None
    deps: ClassVar[Callable[[StepContext], Any] | None] = None
    output_key: ClassVar[str] = "output"
    history_key: ClassVar[str] = "agent_history"
    usage_key: ClassVar[str] = "agent_usage"

    def __new__(cls, agent: AbstractAgent[Any, Any] | None = None, /, *,
                name: str | None = None, **options: Any) -> Any:
        if agent is None:  # a worker instantiating the step class to run it
            if options or name is not None:
                raise TypeError("AgentStep() takes the agent first: AgentStep(agent, ...).")
            return super().__new__(cls)
        return _define(cls, agent, name, options, sys._getframe(1).f_globals)

    async def handle(self, state: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        """Run the agent, replaying what earlier attempts of this step row recorded.

        (An ``async def`` handle: the worker runs it on an event loop, as any async step.)
        """
        context = self.context
        given, build = type(self).prompt, type(self).deps
        prompt = await _call(given, state) if callable(given) else given
        deps = None if build is None else await _call(build, context)
        turns = _turns(state.get(self.history_key), self.history_key)
        history = [message for turn in turns
                   for message in checkpoints.load_messages(turn["messages"])]
        capabilities = []
        if context is not None and context.step_run_id is not None:
            journal = await Journal.aload(
                context.run_id, context.step_run_id, context.step_index or 0,
                context.step_name, context.attempt,
                max_cost_units=context.budget.limits.get("max_cost_units"),
                workflow=context.workflow)
            capabilities.append(Checkpointing(journal))
        result = await self.agent.run(prompt, deps=deps, message_history=history or None,
                                      capabilities=capabilities)
        transition = 1 if context is None else context.budget.usage.transitions + 1
        turns.append({"transition": transition,
                      "step": None if context is None else context.step_name,
                      "messages": checkpoints.dump_messages(result.new_messages())})
        keep = None if context is None else context.prune_state_after
        if keep is not None:
            turns = [turn for turn in turns if turn["transition"] > transition - keep]
        return {self.output_key: to_jsonable_python(result.output),
                self.history_key: turns,
                self.usage_key: _add_usage(state.get(self.usage_key), result.usage)}


def _define(base: type[AgentStep], agent: AbstractAgent[Any, Any], name: str | None,
            options: dict[str, Any], caller: dict[str, Any]) -> type[AgentStep]:
    """Make the step class of ``AgentStep(agent, ...)``, importable from the caller's module
    under ``name`` (default: the agent's)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"AgentStep() got unexpected options {unknown!r}; it takes "
                        f"{', '.join(_OPTIONS)} and name.")
    if not isinstance(agent, AbstractAgent):
        raise exceptions.WorkflowDefinitionError(
            f"AgentStep() needs a Pydantic AI agent first (got {agent!r}).")
    name = name or agent.name
    if not name or not name.isidentifier():
        raise exceptions.WorkflowDefinitionError(
            f"AgentStep() needs a step name that is a Python identifier: give the agent a "
            f"name (Agent(..., name='research')) or pass name='research' (got {name!r}).")
    module = caller.get("__name__", "__main__")
    taken = caller.get(name)
    if taken is not None and not (isinstance(taken, type) and issubclass(taken, AgentStep)):
        raise exceptions.WorkflowDefinitionError(
            f"AgentStep() would be importable as {module}.{name}, but the module already "
            f"defines {name!r} as {taken!r}; pass another name, such as "
            f"name='{name}_step', and assign the step to it ({name}_step = AgentStep(...)).")
    attributes: dict[str, Any] = {"agent": agent, "__module__": module, "__qualname__": name}
    for key, value in options.items():
        # A function stored as a class attribute would become a method: keep it plain.
        attributes[key] = staticmethod(value) if key in ("prompt", "deps") and callable(
            value) else value
    made = type(name, (base,), attributes)
    # The worker imports the step as <module>.<name>: define it under that name there too
    # (``research = AgentStep(...)`` then rebinds the same object).
    caller[name] = made
    return made


def _turns(value: Any, key: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
            isinstance(turn, dict) and isinstance(turn.get("messages"), list) for turn in value):
        raise exceptions.InvalidStepOutput(
            f"state[{key!r}] is not an agent history (a list of turns with 'messages'); "
            "give the agent step another history_key.")
    return list(value)


def _add_usage(before: Any, usage: Any) -> dict[str, int]:
    totals = {"requests": usage.requests, "tool_calls": usage.tool_calls,
              "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
              "total_tokens": usage.total_tokens}
    if isinstance(before, dict):
        for key in totals:
            if isinstance(before.get(key), int):
                totals[key] += before[key]
    return totals


async def _call(function: Callable[[Any], Any], argument: Any) -> Any:
    """Call a ``prompt`` or ``deps`` callable from the event loop: an ``async def`` here, a
    plain function on the ORM's sync thread (it may query the database, which Django refuses
    on an event loop); a coroutine it returns is awaited."""
    if inspect.iscoroutinefunction(function):
        return await function(argument)
    value = await checkpoints.in_sync_thread(function, argument)
    return await value if inspect.isawaitable(value) else value
