"""Durable Pydantic AI agents: an ``Agent`` run as a workflow step whose every model request
and tool call is checkpointed as it completes (docs/guide/durable-agents.md).

Install the extra: ``pip install "queuety-django[pydantic-ai]"``.
"""

from __future__ import annotations

try:
    import pydantic_ai as _pydantic_ai  # noqa: F401
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        "queuety.contrib.pydantic_ai needs Pydantic AI, which is not installed: "
        'install the extra with pip install "queuety-django[pydantic-ai]" '
        "(or pip install pydantic-ai-slim plus the provider you use)."
    ) from error

from queuety.contrib.pydantic_ai.checkpoints import Journal
from queuety.contrib.pydantic_ai.step import AgentStep
from queuety.exceptions import AgentReplayMismatch

__all__ = ["AgentReplayMismatch", "AgentStep", "Journal"]
