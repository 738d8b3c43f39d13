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


def _bump(state):
    """Add one to the run's row of ``qbench_counter`` (``qbench.txn_bench`` creates it)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("UPDATE qbench_counter SET value = value + 1 WHERE id = %s",
                       [state["i"]])


def bump(state):
    """A counter step; run with ``transactional=True``, its write commits with its outcome."""
    _bump(state)


def bump2(state):
    """A second counter step (step names must be unique within a workflow)."""
    _bump(state)


def bump3(state):
    """A third counter step."""
    _bump(state)


def plain_bump(state):
    """The plain step's way: its own ``transaction.atomic()``, committed before the
    transition (which commits by itself)."""
    from django.db import transaction

    with transaction.atomic():
        _bump(state)


def plain_bump2(state):
    """A second plain counter step."""
    plain_bump(state)


def plain_bump3(state):
    """A third plain counter step."""
    plain_bump(state)
