"""The shared pressure on a model: a slot of its concurrency group around each request that
really goes to it (``QUEUETY["AGENT_LIMITS"]``, ``queuety.core.agent_limits``).

A request waits here, inside its step's attempt (the attempt's heartbeat goes on), until its
model's group has a free slot and its rate window a free start; a replayed request takes no
slot at all. The slot is a :class:`~queuety.models.GroupLease` row, so the admin's groups
page, ``manage.py queuety status`` and ``queuety.resource_groups()`` show the requests in
flight.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from django.utils import timezone
from pydantic_ai.models import Model

from queuety.conf import settings
from queuety.contrib.pydantic_ai import checkpoints
from queuety.core import agent_limits
from queuety.runtime.claim import worker_id
from queuety.store import leases

#: The longest pause between two asks of a waiting request for a slot (seconds).
MAX_POLL = 0.5


def model_id(model: Model) -> str:
    """A model's name as ``AGENT_LIMITS`` keys it: ``system:model_name`` (``openai:gpt-4o``)."""
    return f"{model.system}:{model.model_name}"


def limit_of(model: Model) -> agent_limits.AgentLimit:
    """The limit the site set for ``model``'s requests."""
    return agent_limits.limit_for(settings.AGENT_LIMITS, model_id(model))


def _acquire(limit: agent_limits.AgentLimit, step_run_id: int,
             attempt: int) -> tuple[int | None, float]:
    return leases.try_acquire(limit.group, limit.concurrency, limit.rate, step_run_id, attempt,
                              timezone.now(), worker_id())


@asynccontextmanager
async def slot(limit: agent_limits.AgentLimit, step_run_id: int | None,
               attempt: int) -> AsyncIterator[None]:
    """Hold a slot of ``limit``'s group for the block (nothing when it is ungated, or outside
    a worker's attempt)."""
    if not limit.gated or step_run_id is None:
        yield
        return
    backoff = 0.0
    while True:
        lease, wait = await checkpoints.in_sync_thread(_acquire, limit, step_run_id, attempt)
        if lease is not None:
            break
        # A waiter asks less and less often (up to every MAX_POLL seconds), with jitter that
        # spreads the waiters of a full group: polling costs the database, and the process.
        backoff = min(max(wait, backoff * 2), MAX_POLL)
        await asyncio.sleep(backoff * (0.5 + random.random()))  # noqa: S311 - not for secrets
    try:
        yield
    finally:
        await checkpoints.in_sync_thread(leases.release, lease)
