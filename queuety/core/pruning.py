"""``prune_state_after(n)``: which state keys a transition drops.

Pure Python. A run of a workflow built with ``.prune_state_after(n)`` keeps, beside its
state, the transition that last wrote each key (``WorkflowRun.state_writes``). After every
transition, a key last written ``n`` or more transitions ago leaves the public state; a key a
later step wrote again counts from that write. Keys of the dispatch payload were written by
no step and stay. The transition's timeline event lists the keys it dropped (``pruned``), and
the earlier events keep their values, so ``state_at()`` rebuilds the state exactly as it was.
"""

from __future__ import annotations

from typing import Any


def apply(steps: int | None, state: dict[str, Any], writes: dict[str, int] | None,
          output: dict[str, Any], transition: int
          ) -> tuple[dict[str, Any], dict[str, int], list[str]]:
    """Record that transition number ``transition`` wrote the keys of ``output`` into
    ``state`` (already merged), then drop the keys due for pruning.

    Returns the pruned state, the updated writes (key -> transition) and the dropped keys,
    sorted. With ``steps`` None (no pruning) everything is returned unchanged.
    """
    writes = dict(writes or {})
    if steps is None:
        return state, writes, []
    writes.update({key: transition for key in output if not key.startswith("_")})
    cutoff = transition - steps
    pruned = sorted(key for key, written in writes.items() if written <= cutoff)
    if not pruned:
        return state, writes, []
    dropped = set(pruned)
    return ({k: v for k, v in state.items() if k not in dropped},
            {k: v for k, v in writes.items() if k not in dropped},
            [key for key in pruned if key in state])


def event_data(pruned: list[str]) -> dict[str, Any]:
    """What a transition's event adds for the keys it dropped: ``{"pruned": [...]}``, or
    nothing (events of workflows without pruning are unchanged)."""
    return {"pruned": pruned} if pruned else {}


def replay(state: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the keys a timeline event says its transition dropped."""
    pruned = data.get("pruned")
    if not pruned:
        return state
    return {k: v for k, v in state.items() if k not in set(pruned)}
