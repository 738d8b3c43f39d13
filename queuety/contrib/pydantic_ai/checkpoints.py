"""The checkpoints of one agent step row: read once per attempt, written one by one.

Each completed model request (its ``ModelResponse``, dumped with Pydantic AI's own
``ModelMessagesTypeAdapter``) and each tool call's result is written as an
:class:`~queuety.models.AgentCheckpoint` row in a short transaction of its own the moment it
completes, so a SIGKILL loses at most the call in progress. A later attempt of the same step
row (a retry, or a recovery after its worker died) reads them all back at its start and
replays them in order instead of calling the model or the tool again. Dependencies are never
written: only what the model answered and what the tools returned.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_core import to_jsonable_python

from queuety import exceptions
from queuety.core.status import StepStatus
from queuety.models import AgentCheckpoint, StepRun, WorkflowRun

MODEL, TOOL, RETRY = (AgentCheckpoint.KIND_MODEL, AgentCheckpoint.KIND_TOOL,
                      AgentCheckpoint.KIND_RETRY)
#: A checkpoint keeps this much of a model's or tool's name (its column's length); a replay
#: compares as much.
NAME_LENGTH = 255
T = TypeVar("T")


def dump_response(response: ModelResponse) -> Any:
    """A ``ModelResponse`` as JSON, in Pydantic AI's own message format."""
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def load_response(payload: Any) -> ModelResponse:
    """The ``ModelResponse`` :func:`dump_response` wrote."""
    message = ModelMessagesTypeAdapter.validate_python([payload])[0]
    if not isinstance(message, ModelResponse):
        raise TypeError(f"An agent checkpoint holds a {type(message).__name__}, "
                        "not a model response.")
    return message


def dump_messages(messages: list[ModelMessage]) -> list[Any]:
    """Messages as JSON (the history a run keeps in its state)."""
    dumped: list[Any] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    return dumped


def load_messages(data: list[Any]) -> list[ModelMessage]:
    """The messages :func:`dump_messages` wrote."""
    return list(ModelMessagesTypeAdapter.validate_python(data))


def request_fingerprint(messages: list[ModelMessage]) -> str:
    """What a model request asks, as far as a replay must ask the same: each part's kind and,
    for tool calls and returns, the tool, call id and outcome (a return, or a retry), and the
    text of user prompts. Times and tool return values (a replayed tool returns its JSON form)
    are left out."""
    shape = []
    for message in messages:
        for part in message.parts:
            content = getattr(part, "content", None) if part.part_kind == "user-prompt" else None
            shape.append([part.part_kind, getattr(part, "tool_name", None),
                          getattr(part, "tool_call_id", None),
                          content if isinstance(content, str) else None,
                          getattr(part, "outcome", None)])
    return _digest(shape)


def tool_fingerprint(name: str, args: Any) -> str:
    """What a tool call asks: the tool and its arguments."""
    return _digest([name, to_jsonable_python(args)])


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Recorded:
    """One checkpoint as read back."""

    name: str
    fingerprint: str
    payload: Any


@dataclass
class Journal:
    """The checkpoints of one step row, for one attempt of it.

    ``replays`` counts what this attempt answered from records; ``calls`` what it really
    sent (both by kind), so a test or a status can tell a replay from a call.
    """

    run_id: int
    step_run_id: int
    step_index: int
    step_name: str
    attempt: int
    max_cost_units: int | None = None
    workflow: str = ""
    records: dict[tuple[str, int, str], Recorded] = field(default_factory=dict)
    replays: dict[str, int] = field(default_factory=lambda: {MODEL: 0, TOOL: 0, RETRY: 0})
    calls: dict[str, int] = field(default_factory=lambda: {MODEL: 0, TOOL: 0, RETRY: 0})

    @classmethod
    def load(cls, run_id: int, step_run_id: int, step_index: int, step_name: str, attempt: int,
             *, max_cost_units: int | None = None, workflow: str = "") -> Journal:
        """Read the step row's checkpoints (one query)."""
        journal = cls(run_id, step_run_id, step_index, step_name, attempt, max_cost_units,
                      workflow)
        for kind, seq, key, name, fingerprint, payload in AgentCheckpoint.objects.filter(
                step_run_id=step_run_id).values_list("kind", "seq", "key", "name",
                                                     "fingerprint", "payload"):
            journal.records[(kind, seq, key)] = Recorded(name, fingerprint, payload)
        return journal

    def replay(self, kind: str, seq: int, key: str, name: str, fingerprint: str) -> Any:
        """The recorded payload of checkpoint ``(kind, seq, key)``, or None when it was never
        recorded (the call must really be made).

        Raises:
            AgentReplayMismatch: it was recorded for another request or tool call.
        """
        found = self.records.get((kind, seq, key))
        if found is None:
            return None
        if found.name != name[:NAME_LENGTH] or found.fingerprint != fingerprint:
            asked = "request" if kind == MODEL else f"call {key!r}"
            raise exceptions.AgentReplayMismatch(
                self.run_id, self.step_name, seq,
                f"{kind} {asked} was to {found.name!r}, now to {name!r} with "
                f"{'the same' if found.fingerprint == fingerprint else 'different'} "
                f"{'messages' if kind == MODEL else 'arguments'}")
        self.replays[kind] += 1
        return found.payload

    def record(self, kind: str, seq: int, key: str, name: str, fingerprint: str, payload: Any,
               tokens: int = 0) -> Any:
        """Write one checkpoint (and charge ``tokens`` as cost units to the step row and the
        run) in a transaction of its own, if this attempt still owns its row. Returns None
        when ``payload`` was written, or the payload already stored for that checkpoint (a
        stalled earlier attempt wrote it first): the agent goes on with the journal's answer.

        Raises:
            BudgetExceeded: the run's cost units now exceed its ``max_cost_units``.
            WorkerLost: the attempt no longer owns its row (taken for lost); nothing written.
        """
        self.calls[kind] += 1
        row = {"run_id": self.run_id, "step_run_id": self.step_run_id,
               "step_index": self.step_index, "seq": seq, "kind": kind, "key": key,
               "name": name[:NAME_LENGTH], "fingerprint": fingerprint, "payload": payload,
               "tokens": tokens, "attempt": self.attempt, "created_at": timezone.now()}
        if connection.vendor == "postgresql" and not connection.in_atomic_block:
            owns, saved, used = _record_postgres(row)
        else:
            with transaction.atomic():
                owns, saved, used = _record_orm(row)
        if not owns:
            raise exceptions.WorkerLost(
                f"Attempt {self.attempt} of step {self.step_name!r} of run {self.run_id} (step "
                f"row {self.step_run_id}) was taken for lost and may not record checkpoint "
                f"{seq} of its agent: it stops here; the row's current attempt does the work.")
        if not saved:
            return AgentCheckpoint.objects.values_list("payload", flat=True).get(
                step_run_id=self.step_run_id, kind=kind, seq=seq, key=key)
        if used is not None and self.max_cost_units is not None and used > self.max_cost_units:
            raise exceptions.BudgetExceeded("max_cost_units", self.max_cost_units, used,
                                            self.run_id, self.workflow)
        return None

    async def arecord(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`record` from async code (the ORM call runs on the sync thread)."""
        return await in_sync_thread(self.record, *args, **kwargs)

    @classmethod
    async def aload(cls, *args: Any, **kwargs: Any) -> Journal:
        """:meth:`load` from async code."""
        return await in_sync_thread(cls.load, *args, **kwargs)


async def in_sync_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ORM code from the event loop, on ``asgiref``'s sync thread.

    With Django's connection pool (an I/O lane worker's), the thread hands its connection back
    after each call: it would otherwise keep one of the pool's few connections for good, and
    the worker's heartbeats wait for one.
    """
    def call() -> T:
        close_old_connections()  # a connection PostgreSQL dropped (a restart) is replaced
        try:
            return function(*args, **kwargs)
        finally:
            if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
                connection.close()

    return await sync_to_async(call, thread_sensitive=True)()


#: The SQL type of each column a checkpoint's statement writes.
_CASTS = {"run_id": "bigint", "step_run_id": "bigint", "step_index": "integer",
          "seq": "integer", "kind": "varchar", "key": "varchar", "name": "varchar",
          "fingerprint": "varchar", "payload": "jsonb", "tokens": "integer",
          "attempt": "integer", "created_at": "timestamptz"}


def _record_postgres(row: dict[str, Any]) -> tuple[bool, bool, int | None]:
    """One statement, its own transaction: the checkpoint, and the tokens charged to the step
    row and the run, only while the attempt owns its row (processing that attempt). Returns
    (owns its row, checkpoint written, the run's cost units after it or None).

    Its commit does not wait for the WAL flush (``synchronous_commit`` off for this
    transaction, as for the claim's): a worker killed after it loses nothing, since the server
    has the row; only a crash of PostgreSQL itself within its WAL writer delay (200 ms by
    default) could lose the checkpoint, and the call is then made again, as one in progress
    would be.
    """
    columns = list(_CASTS)
    values = ", ".join(f"%s::{_CASTS[column]}" for column in columns)
    params = [json.dumps(row[c]) if c == "payload" else row[c] for c in columns]
    step_table, run_table = StepRun._meta.db_table, WorkflowRun._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH config AS MATERIALIZED ("
            "SELECT set_config('synchronous_commit', 'off', true) AS value), "
            f"owner AS MATERIALIZED (SELECT 1 FROM {step_table} "
            "WHERE id = %s AND attempt = %s AND status = %s), "
            f"saved AS (INSERT INTO {AgentCheckpoint._meta.db_table} ({', '.join(columns)}) "
            f"SELECT {values} FROM config, owner "
            # A live attempt may find the checkpoint written by a stalled earlier one (taken
            # for lost, still running): the first one written stays, and is adopted.
            "ON CONFLICT DO NOTHING RETURNING 1), "
            f"step AS (UPDATE {step_table} SET cost_units = cost_units + %s "
            "WHERE id = %s AND %s > 0 AND EXISTS (SELECT 1 FROM saved)), "
            f"spent AS (UPDATE {run_table} SET cost_units = cost_units + %s "
            "WHERE id = %s AND %s > 0 AND EXISTS (SELECT 1 FROM saved) RETURNING cost_units) "
            "SELECT EXISTS (SELECT 1 FROM owner), EXISTS (SELECT 1 FROM saved), "
            "(SELECT cost_units FROM spent)",
            [row["step_run_id"], row["attempt"], StepStatus.PROCESSING, *params,
             row["tokens"], row["step_run_id"], row["tokens"], row["tokens"],
             row["run_id"], row["tokens"]])
        owns, saved, used = cursor.fetchone()
    return bool(owns), bool(saved), None if used is None else int(used)


def _record_orm(row: dict[str, Any]) -> tuple[bool, bool, int | None]:
    if not StepRun.objects.filter(pk=row["step_run_id"], attempt=row["attempt"],
                                  status=StepStatus.PROCESSING).exists():
        return False, False, None
    if AgentCheckpoint.objects.filter(step_run_id=row["step_run_id"], kind=row["kind"],
                                      seq=row["seq"], key=row["key"]).exists():
        return True, False, None
    AgentCheckpoint.objects.create(**row)
    tokens = row["tokens"]
    if not tokens:
        return True, True, None
    StepRun.objects.filter(pk=row["step_run_id"]).update(cost_units=F("cost_units") + tokens)
    WorkflowRun.objects.filter(pk=row["run_id"]).update(cost_units=F("cost_units") + tokens)
    used: int = WorkflowRun.objects.values_list("cost_units", flat=True).get(pk=row["run_id"])
    return True, True, used
