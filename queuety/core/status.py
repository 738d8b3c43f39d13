"""The status vocabulary of runs and step rows, and the snapshot ``queuety.workflow_status()``
returns.

``queuety.models`` takes its ``choices`` from these enums, so the core and the storage speak
one vocabulary; the status sets below are the only definitions of "finished", "live" and
"live or held".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import EnumType, StrEnum
from typing import Any


class _Vocabulary(EnumType):
    """Gives the status enums the lists Django's ``TextChoices`` offers (``values``,
    ``labels``, ``choices``), so code written against the models' choices keeps working."""

    @property
    def values(cls) -> list[str]:
        return [str(cls[name].value) for name in cls.__members__]

    @property
    def labels(cls) -> list[str]:
        return [name.replace("_", " ").title() for name in cls.__members__]

    @property
    def choices(cls) -> list[tuple[str, str]]:
        return list(zip(cls.values, cls.labels, strict=True))


class RunStatus(StrEnum, metaclass=_Vocabulary):
    """Status of a workflow run (the original plugin's words)."""

    RUNNING = "running"
    WAITING_FOR_SIGNAL = "waiting_for_signal"
    WAITING_FOR_WORKFLOWS = "waiting_for_workflows"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepStatus(StrEnum, metaclass=_Vocabulary):
    """Status of one step execution row: the queue's truth."""

    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    HELD = "held"
    """A fan-out branch or item waiting for a free slot under its step's max_concurrency:
    not claimable and never published until released."""
    THROTTLED = "throttled"
    """A step its concurrency group, rate limit or cost budget did not let start: it waits
    here, holding no worker and no message, until a slot frees (``throttled_by`` says why)."""


#: Runs that can make no more progress by themselves.
FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
#: Runs that are not finished: a failure, a deadline or a cancel may still end them.
UNFINISHED = tuple(status for status in RunStatus if status not in FINISHED)
#: Step rows being worked on or due. ``LIVE_OR_HELD`` adds the rows a fan-out holds back
#: and the rows a concurrency group throttles: an operation that stops a run stops those too,
#: one that publishes rows must not.
LIVE = (StepStatus.PENDING, StepStatus.PROCESSING)
LIVE_OR_HELD = (*LIVE, StepStatus.HELD, StepStatus.THROTTLED)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowStatus:
    """A snapshot of one workflow run."""

    id: int
    name: str
    status: str
    current_step: int
    """Position of the step being run; equals ``total_steps`` once the run completed."""
    total_steps: int
    current_step_name: str | None
    """``None`` once the run completed."""
    state: dict[str, Any]
    """Public state (reserved ``_`` keys are never stored)."""
    error: dict[str, Any] | None
    """Why the run failed: ``type``, ``message``, ``step``, ``attempt``; ``None`` otherwise."""
    definition_hash: str
    definition_version: str | None
    """The ``.version()`` label of the definition, if any."""
    idempotency_key: str | None
    budget: dict[str, int] | None
    """Configured limits then usage (``transitions``, ``cost_units``, ``started_workflows``,
    ``public_state_bytes``); ``None`` when the workflow sets no limit."""
    retry_policy: str | None
    """The current step's effective retry policy, described in one line."""
    wait_type: str | None = None
    """``signal`` while the run is parked at a wait."""
    waiting_for: list[str] | None = None
    """The signal names the current wait listens for."""
    wait_mode: str | None = None
    """``all`` or ``any``."""
    wait_details: dict[str, Any] | None = None
    """``step_name``, ``matched`` and ``remaining`` names, ``human_wait``, ``schema``, ...;
    for a wait with a timeout, ``expires_at`` (ISO 8601), ``timeout_seconds``, ``on_timeout``."""
    progress: dict[str, Any] | None = None
    """While a step runs and has reported progress: ``step_name``, ``branch``, ``data`` (what
    the handler reported), ``text`` (``"450/1000 (45%)"``) and ``reported_at`` (ISO 8601)."""
    artifact_count: int = 0
    """How many artifacts the run has (``queuety.artifacts(run_id)`` lists them)."""
    artifact_keys: list[str] = field(default_factory=list)
    """Their keys, sorted."""
    throttled_by: dict[str, Any] | None = None
    """While the current step waits for resources: ``group``, ``reason`` (``concurrency``,
    ``rate``, ``group_cost``, ``queue_cost``, or ``memory`` for a worker's deferral) and the
    numbers behind it; ``None`` otherwise."""
    tags: dict[str, str] = field(default_factory=dict)
    """The run's tags (given at dispatch, by ``.with_tags()`` and by ``context.tag()``)."""
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (timestamps in ISO 8601)."""
        data = asdict(self)
        for key in ("created_at", "updated_at", "finished_at"):
            if data[key] is not None:
                data[key] = data[key].isoformat()
        return data

    @property
    def is_finished(self) -> bool:
        """Return True once the run can make no more progress by itself."""
        return self.status in FINISHED
