"""Fan-out steps: ``parallel`` branches and ``for_each`` items, and how their join settles.

Pure Python. Each branch or item is its own step row and Celery task, so blocking branches run
in parallel across worker processes. The join is decided under the run's row lock by counting
the rows of the current pass of the step, so a retried or re-entered fan-out cannot complete
early with an older pass's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from queuety import exceptions
from queuety.core.retry import RetryPolicy

ALL, FIRST_SUCCESS, QUORUM = "all", "first_success", "quorum"
SATISFIED, IMPOSSIBLE, PENDING = "satisfied", "impossible", "pending"


@dataclass(frozen=True, slots=True, kw_only=True)
class FanOutSpec:
    """What a ``parallel`` or ``for_each`` step fans out to."""

    branches: tuple[str, ...] = ()
    """``parallel``: the branch handlers' dotted paths, in declaration order."""
    items_key: str | None = None
    """``for_each``: the state key holding the list of items."""
    result_key: str | None = None
    mode: str = ALL
    quorum: int | None = None
    reducer: str | None = None
    """``for_each``: dotted path of ``f(state, aggregate) -> dict`` merged after the join."""
    max_concurrency: int | None = None
    """At most this many branches or items run at once; the others wait their turn."""
    branch_timeouts: tuple[float | None, ...] = ()
    """``parallel``: each branch's timeout, by position (its options', the step's keyword, or
    its class's); empty when no branch has one. Stored only when set, so definitions without
    them keep their hash."""
    branch_retries: tuple[RetryPolicy | None, ...] = ()
    """``parallel``: each branch's own retry policy, by position; empty when none has one."""

    def __post_init__(self) -> None:
        if self.mode not in (ALL, FIRST_SUCCESS, QUORUM):
            raise exceptions.WorkflowDefinitionError(
                f"for_each mode must be 'all', 'first_success' or 'quorum' (got {self.mode!r}).")
        if self.mode == QUORUM and (not isinstance(self.quorum, int) or self.quorum < 1):
            raise exceptions.WorkflowDefinitionError(
                f"for_each(mode='quorum') needs quorum=n with n >= 1 (got {self.quorum!r}).")
        if self.max_concurrency is not None and (
                isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, int)
                or self.max_concurrency < 1):
            raise exceptions.WorkflowDefinitionError(
                f"max_concurrency must be a whole number of at least 1, or None for no limit "
                f"(got {self.max_concurrency!r}).")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"branches": list(self.branches), "items_key": self.items_key,
                "result_key": self.result_key, "mode": self.mode, "quorum": self.quorum,
                "reducer": self.reducer,
                **({} if self.max_concurrency is None else
                   {"max_concurrency": self.max_concurrency}),
                **({} if not self.branch_timeouts else
                   {"branch_timeouts": list(self.branch_timeouts)}),
                **({} if not self.branch_retries else
                   {"branch_retries": [None if policy is None else policy.to_dict()
                                       for policy in self.branch_retries]})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FanOutSpec:
        """Rebuild from :meth:`to_dict` output."""
        return cls(**{
            **data, "branches": tuple(data.get("branches") or ()),
            "branch_timeouts": tuple(data.get("branch_timeouts") or ()),
            "branch_retries": tuple(None if policy is None else RetryPolicy.from_dict(policy)
                                    for policy in data.get("branch_retries") or ())})

    def timeout_of(self, branch: int, default: float | None) -> float | None:
        """The timeout of ``parallel`` branch ``branch`` (``default``: the step's)."""
        return self.branch_timeouts[branch] if self.branch_timeouts else default

    def retry_of(self, branch: int) -> RetryPolicy | None:
        """The retry policy of ``parallel`` branch ``branch`` itself, if it has one."""
        return self.branch_retries[branch] if self.branch_retries else None


def progress(mode: str, quorum: int | None, total: int, succeeded: int, failed: int) -> str:
    """Say whether a join is satisfied, impossible, or still pending (the original's rules)."""
    remaining = total - succeeded - failed
    if mode == ALL:
        return IMPOSSIBLE if failed else SATISFIED if succeeded >= total else PENDING
    if mode == FIRST_SUCCESS:
        return SATISFIED if succeeded >= 1 else IMPOSSIBLE if remaining == 0 else PENDING
    need = max(1, quorum or 1)
    if succeeded >= need:
        return SATISFIED
    return IMPOSSIBLE if succeeded + remaining < need else PENDING


def merge_branches(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge branch outputs in declaration order (later branches win), reserved keys dropped."""
    merged: dict[str, Any] = {}
    for output in outputs:
        merged.update({k: v for k, v in (output or {}).items() if not k.startswith("_")})
    return merged


def aggregate(spec: FanOutSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The original's for_each aggregate from item rows ``{index, item, status, output, error,
    finished_at}``: results and failures sorted by index; the winner is the first to succeed."""
    results = sorted(({"index": r["index"], "item": r["item"], "output": r["output"]}
                      for r in rows if r["status"] == "completed"), key=lambda r: r["index"])
    failures = sorted(({"index": r["index"], "item": r["item"], "error": r["error"]}
                       for r in rows if r["status"] == "failed"), key=lambda r: r["index"])
    done = [r for r in rows if r["status"] == "completed"]
    winner = min(done, key=lambda r: (r["finished_at"], r["index"])) if done else None
    return {"mode": spec.mode, "quorum": spec.quorum, "total": len(rows),
            "succeeded": len(results), "failed": len(failures), "settled": True,
            "winner": None if winner is None else {"index": winner["index"],
                                                   "item": winner["item"],
                                                   "output": winner["output"]},
            "results": results, "failures": failures}
