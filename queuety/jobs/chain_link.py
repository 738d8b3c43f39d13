"""The step a chain's run takes for each of its tasks, and the chain's ``catch``.

A chain is a run of a workflow whose step ``link<i>_<name>`` calls the chain's i-th task
(``queuety.jobs.chains``). The first task gets the arguments the chain was enqueued with; each
later task gets the return value of the one before as its only argument. A link's step is a
step like any other: claimed, beating, recovered when its worker dies, retried by its task's
job options; so a chain resumes at the link that was running, and a link that succeeded is
never run again.

A chain's ``catch`` is enqueued by ``queuety.jobs.callbacks``.
"""

from __future__ import annotations

import re
from typing import Any

from queuety.core.handlers import StepContext
from queuety.jobs import callbacks, results
from queuety.jobs.execute import stored_value

#: What a chain's workflow name starts with.
PREFIX = callbacks.CHAIN_PREFIX
#: A link's step name: ``link<index>_<the task's name>``.
STEP_NAME = re.compile(r"^link(\d+)_")
HANDLER = "queuety.jobs.chain_link.call_link"
ASYNC_HANDLER = "queuety.jobs.chain_link.acall_link"


def step_name(index: int, task_name: str) -> str:
    """The name of the step of the chain's ``index``-th task (0-based)."""
    return f"link{index}_{task_name}"


def index_of(name: str) -> int:
    """The index of the link a step named ``name`` runs.

    Raises:
        ValueError: ``name`` is not a link's step name.
    """
    found = STEP_NAME.match(name)
    if found is None:
        raise ValueError(f"Step {name!r} is not a chain link's step (link<i>_<name>).")
    return int(found.group(1))


def link_arguments(state: dict[str, Any], index: int) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of the chain's ``index``-th task: the chain's own for the first, the
    previous task's return value for the others."""
    if index == 0:
        return list(state.get("args", [])), dict(state.get("kwargs", {}))
    return [state["link_results"][index - 1]], {}


def call_link(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Run one attempt of a chain's link: call its task; record its return value."""
    index, task, args, kwargs = _link(state, context)
    return _recorded(state, context, index, task, task.func(*args, **kwargs))


async def acall_link(state: dict[str, Any], context: StepContext) -> dict[str, Any]:
    """Run one attempt of a chain's ``async def`` link (on the I/O lane's event loop when its
    queue is a lane's)."""
    index, task, args, kwargs = _link(state, context)
    return _recorded(state, context, index, task, await task.func(*args, **kwargs))


def _link(state: dict[str, Any], context: StepContext) -> tuple[int, Any, list[Any],
                                                                 dict[str, Any]]:
    index = index_of(context.step_name)
    task = results.task_of({"task": state["chain"]["links"][index]}, context.run_id)
    return (index, task, *link_arguments(state, index))


def _recorded(state: dict[str, Any], context: StepContext, index: int, task: Any,
              returned: Any) -> dict[str, Any]:
    value = stored_value(task, returned, f" (link {index} of chain {context.run_id})")
    done = list(state.get("link_results", []))[:index] + [value]
    return {"link_results": done, "return_value": value}
