"""Queuety step handlers of the benchmark workflows (imported by the workers by dotted path)."""

from __future__ import annotations

_redis = None


def noop(state):
    """A step that does nothing and returns nothing."""
    return None


def noop2(state):
    """A second no-op (step names must be unique within a workflow)."""
    return None


def noop3(state):
    """A third no-op."""
    return None


def notify(state):
    """LPUSH to ``state["done_key"]``: the latency client BLPOPs on it."""
    global _redis
    if _redis is None:
        import redis

        from qbench import env

        _redis = redis.Redis.from_url(env.REDIS_URL)
    _redis.lpush(state["done_key"], 1)
    return None


def stream_tokens(state):
    """A streaming step: yields ``state["n"]`` short tokens as fast as it can, so the figure
    is the cost of storing chunks, not of producing them."""
    for i in range(state["n"]):
        yield f"tok{i} "
    return {"streamed": state["n"]}


async def await_one(state):
    """An I/O-bound step: awaits one second, as an LLM call or a webhook would."""
    import asyncio

    await asyncio.sleep(state.get("wait", 1.0))
    return None
