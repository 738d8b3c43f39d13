"""Starting workflows from a step, and waiting for other workflows to finish.

Pure Python. ``start_workflows`` turns a list in the state into child payloads;
``wait_for_workflows`` parks a run until other runs finish, by mode: ``all`` of them completed,
``any`` one, a ``quorum`` of n, or ``settled``: every one finished, either way (it never
fails; batches of jobs wait so). Finished means ``completed``, ``failed`` or ``cancelled``; a
run that cannot be found (purged, or never existed) counts as failed, so a wait on it can never
hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from queuety import exceptions
from queuety.core import fanout, waits
from queuety.core.status import RunStatus

ALL, ANY, QUORUM = "all", "any", "quorum"
#: Every awaited run finished, whatever its outcome: never impossible.
SETTLED = "settled"
COMPLETED, FAILED, CANCELLED = RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED
#: Join modes of fan-outs that mean the same as these wait modes.
_AS_FANOUT = {ALL: fanout.ALL, ANY: fanout.FIRST_SUCCESS, QUORUM: fanout.QUORUM}


@dataclass(frozen=True, slots=True, kw_only=True)
class StartSpec:
    """What a ``start_workflows`` step starts: one child run per item of ``state[items_key]``."""

    items_key: str
    result_key: str
    payload_key: str = "item"
    inherit_state: bool = True
    group: str | None = None

    def __post_init__(self) -> None:
        for field_name in ("items_key", "result_key", "payload_key"):
            value = getattr(self, field_name)
            if not isinstance(value, str) or not value.strip() or value.startswith("_"):
                raise exceptions.WorkflowDefinitionError(
                    f"start_workflows() needs a non-empty {field_name} that does not start "
                    f"with '_' (got {value!r}).")
        if self.group is not None and (not isinstance(self.group, str) or not self.group.strip()):
            raise exceptions.WorkflowDefinitionError(
                f"start_workflows() group_key must be a non-blank string (got {self.group!r}).")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"items_key": self.items_key, "result_key": self.result_key,
                "payload_key": self.payload_key, "inherit_state": self.inherit_state,
                "group": self.group}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StartSpec:
        """Rebuild from :meth:`to_dict` output."""
        return cls(**data)


def child_payloads(spec: StartSpec, step: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the initial state of each child, in item order.

    A child gets the parent's public state (without the items and result keys) when
    ``inherit_state``; a dict item's keys go over it, any other item goes under
    ``payload_key``; ``start_item_index`` is the item's position.

    Raises:
        InvalidStepOutput: ``state[items_key]`` is not a list.
    """
    items = state.get(spec.items_key)
    if not isinstance(items, list):
        raise exceptions.InvalidStepOutput(
            f"Start step {step!r} needs state[{spec.items_key!r}] to be a list of items "
            f"(got {type(items).__name__}).")
    base = ({k: v for k, v in state.items() if k not in (spec.items_key, spec.result_key)}
            if spec.inherit_state else {})
    payloads = []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            extra = {k: v for k, v in item.items() if isinstance(k, str) and not k.startswith("_")}
        else:
            extra = {spec.payload_key: item}
        payloads.append({**base, **extra, "start_item_index": index})
    return payloads


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitWorkflowsSpec:
    """What a ``wait_for_workflows`` step waits for.

    Exactly one source of run ids: literal ``ids``, a ``state_key`` holding an id or a list of
    ids, or a ``group`` of runs this run started with ``start_workflows(group_key=...)``.
    """

    ids: tuple[int, ...] | None = None
    state_key: str | None = None
    group: str | None = None
    mode: str = ALL
    quorum: int | None = None
    result_key: str | None = None
    timeout: float | None = None
    """Seconds the run waits before the sweeper settles the wait by timeout (None: forever);
    the runs it waited for go on either way."""
    on_timeout: str = waits.ON_TIMEOUT_FAIL
    """What a timeout does: ``fail`` the run, ``continue`` to the next step, or a step name
    to jump to (as on signal waits)."""
    remind_after: float | None = None
    """Seconds after the run parks here before its first reminder."""
    remind_every: float | None = None
    """Seconds between reminders while the run stays parked here."""

    def __post_init__(self) -> None:
        waits.check_timing(self.timeout, self.on_timeout, self.remind_after, self.remind_every)
        sources = [s for s in (self.ids, self.state_key, self.group) if s is not None]
        if len(sources) != 1:
            raise exceptions.WorkflowDefinitionError(
                "A workflow wait needs exactly one of: a list of run ids, a state key, or a "
                "group key.")
        if self.ids is not None and not all(_is_id(i) for i in self.ids):
            raise exceptions.WorkflowDefinitionError(
                f"Workflow ids to wait for must be positive integers (got {list(self.ids)!r}).")
        for name in ("state_key", "group"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise exceptions.WorkflowDefinitionError(
                    f"A workflow wait's {name} must be a non-blank string (got {value!r}).")
        if self.mode not in (ALL, ANY, QUORUM, SETTLED):
            raise exceptions.WorkflowDefinitionError(
                "Workflow waits support mode 'all', 'any', 'quorum' or 'settled' (got "
                f"{self.mode!r}).")
        if self.mode == QUORUM and (not _is_id(self.quorum)):
            raise exceptions.WorkflowDefinitionError(
                f"Workflow quorum waits need quorum=n with n >= 1 (got {self.quorum!r}).")
        if self.mode != QUORUM and self.quorum is not None:
            raise exceptions.WorkflowDefinitionError(
                f"quorum={self.quorum!r} only applies to mode='quorum' (mode is {self.mode!r}).")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"ids": None if self.ids is None else list(self.ids),
                "state_key": self.state_key, "group": self.group, "mode": self.mode,
                "quorum": self.quorum, "result_key": self.result_key,
                **waits.timing_dict(self.timeout, self.on_timeout, self.remind_after,
                                    self.remind_every)}

    @property
    def timeout_target(self) -> str | None:
        """The step a timeout jumps to, when ``on_timeout`` names one."""
        return waits.jump_target(self.on_timeout)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WaitWorkflowsSpec:
        """Rebuild from :meth:`to_dict` output."""
        ids = data.get("ids")
        return cls(**{**data, "ids": None if ids is None else tuple(ids)})


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def ids_from_state(spec: WaitWorkflowsSpec, step: str, state: dict[str, Any]) -> list[int]:
    """Return the run ids held by ``state[spec.state_key]``, without duplicates, in order.

    Raises:
        InvalidStepOutput: the key is missing or holds something other than run ids.
    """
    # __post_init__ keeps exactly one source of ids: here (no ids, no group) it is state_key.
    assert spec.state_key is not None
    value = state.get(spec.state_key)
    values = value if isinstance(value, list) else [value]
    if not all(_is_id(v) for v in values):
        raise exceptions.InvalidStepOutput(
            f"Workflow wait {step!r} needs state[{spec.state_key!r}] to hold a run id or a "
            f"list of run ids (got {value!r}).")
    return list(dict.fromkeys(values))


@dataclass(frozen=True, slots=True)
class WaitResult:
    """Where a workflow wait stands: ``verdict`` is satisfied, impossible or pending."""

    verdict: str
    matched: list[int]
    failed: list[int]
    remaining: list[int]
    output: dict[str, Any] | None = None

    @property
    def details(self) -> dict[str, list[int]]:
        """The lists shown by status and the timeline."""
        return {"matched": self.matched, "failed": self.failed, "remaining": self.remaining}


def evaluate(spec: WaitWorkflowsSpec, ids: list[int],
             runs: dict[int, tuple[str, dict[str, Any]]]) -> WaitResult:
    """Decide a workflow wait from the runs found: ``{id: (status, public state)}``.

    A missing id counts as failed. Results are collected in the order of ``ids`` (for ``any``:
    the first completed run in that order), so the output never depends on which run finished
    first.
    """
    matched = [i for i in ids if i in runs and runs[i][0] == COMPLETED]
    failed = [i for i in ids if i not in runs or runs[i][0] in (FAILED, CANCELLED)]
    remaining = [i for i in ids if i not in matched and i not in failed]
    if spec.mode == SETTLED:
        return _settled(spec, matched, failed, remaining, runs)
    verdict = fanout.progress(_AS_FANOUT[spec.mode], spec.quorum, len(ids), len(matched),
                              len(failed))
    if verdict != fanout.SATISFIED:
        return WaitResult(verdict, matched, failed, remaining)
    used = matched[:1] if spec.mode == ANY else matched
    states = [(i, runs[i][1]) for i in used]
    if spec.result_key is None:
        output: dict[str, Any] = {}
        for _, state in states:
            output.update(state)
    elif len(ids) == 1 and len(states) == 1:
        output = {spec.result_key: states[0][1]}
    else:
        output = {spec.result_key: {str(i): state for i, state in states}}
    return WaitResult(verdict, matched, failed, remaining, output)


def _settled(spec: WaitWorkflowsSpec, matched: list[int], failed: list[int],
             remaining: list[int], runs: dict[int, tuple[str, dict[str, Any]]]) -> WaitResult:
    """A ``settled`` wait: satisfied once nothing remains. The outcomes differ, so no state is
    merged: with a ``result_key`` the completed runs' states go under it, as for ``all``."""
    if remaining:
        return WaitResult(fanout.PENDING, matched, failed, remaining)
    output = {} if spec.result_key is None else {
        spec.result_key: {str(i): runs[i][1] for i in matched}}
    return WaitResult(fanout.SATISFIED, matched, failed, remaining, output)


def awaited_ids(wait: WaitWorkflowsSpec, step: str, state: dict[str, Any],
                groups: dict[str, list[int]]) -> list[int]:
    """The run ids a ``wait_for_workflows`` step waits for, in order: its own list, a group
    a ``start_workflows`` step filled, or the ids a state key holds.

    Raises:
        InvalidStepOutput: the state key does not hold run ids.
    """
    if wait.ids is not None:
        return list(dict.fromkeys(wait.ids))
    if wait.group is not None:
        return list(groups.get(wait.group, []))
    return ids_from_state(wait, step, state)
