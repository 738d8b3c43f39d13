"""A run's outputs outside its state: artifacts, and the chunks of its streaming steps.

``queuety.put_artifact()``, ``artifacts()``, ``artifact()``, ``delete_artifact()`` and
``chunks()`` are these functions. Inside a step, ``context.put_artifact()`` writes through the
attempt instead (see ``queuety.runtime.artifacts`` for when such a write becomes visible).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from queuety import exceptions
from queuety.conf import settings
from queuety.core import artifacts as rules
from queuety.core.status import FINISHED
from queuety.models import Artifact, StepChunk, StepRun, StepStatus, WorkflowRun
from queuety.runtime import artifacts as rows
from queuety.store.definitions import load_spec

#: The columns of an artifact without its content (lists never load content).
SUMMARY_FIELDS = ("key", "kind", "size", "metadata", "step_index", "step_name", "created_at",
                  "updated_at")


def _run(run_id: int) -> WorkflowRun:
    run = WorkflowRun.objects.filter(pk=run_id).only("pk", "definition_id", "status").first() \
        if isinstance(run_id, int) and 0 < run_id < 2**63 else None
    if run is None:
        raise exceptions.RunNotFound(run_id)
    return run


def put_artifact(run_id: int, key: str, content: Any, kind: str = "json",
                 metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Store (or replace) artifact ``key`` of run ``run_id`` from outside a step; it is
    visible at once. Return its summary (no content).

    Raises:
        RunNotFound: no run has that id.
        InvalidArtifact: a bad key, kind, content or metadata, or content over
            ``QUEUETY["MAX_ARTIFACT_BYTES"]``; nothing is written.
    """
    _run(run_id)
    encoded = rules.encode(key, content, kind, metadata, limit=settings.MAX_ARTIFACT_BYTES,
                           run_id=run_id)
    rows.write_visible(run_id, encoded)
    return _summary(Artifact.objects.filter(run_id=run_id, key=key, visible=True)
                    .values(*SUMMARY_FIELDS).get())


def artifacts(run_id: int, *, with_content: bool = False,
              limit: int | None = None) -> list[dict[str, Any]]:
    """The run's visible artifacts by key: ``key``, ``kind``, ``size``, ``metadata``,
    ``step_index``, ``step_name``, ``created_at``, ``updated_at`` (and ``content`` when
    ``with_content``); the first ``limit`` keys only, when given.

    Raises:
        RunNotFound: no run has that id.
    """
    _run(run_id)
    found = Artifact.objects.filter(run_id=run_id, visible=True).order_by("key")
    if limit is not None:
        found = found[:limit]
    if not with_content:
        return [_summary(row) for row in found.values(*SUMMARY_FIELDS)]
    return [{**_summary(row), "content": rules.decode(row["kind"], row["content"])}
            for row in found.values(*SUMMARY_FIELDS, "content")]


def artifact(run_id: int, key: str) -> dict[str, Any]:
    """Artifact ``key`` of the run with its ``content`` (a JSON value, a string, or bytes).

    Raises:
        RunNotFound: no run has that id.
        ArtifactNotFound: the run has no visible artifact of that key.
    """
    _run(run_id)
    row = Artifact.objects.filter(run_id=run_id, key=key, visible=True).values(
        *SUMMARY_FIELDS, "content").first()
    if row is None:
        raise exceptions.ArtifactNotFound(run_id, key)
    return {**_summary(row), "content": rules.decode(row["kind"], row["content"])}


def artifact_bytes(run_id: int, key: str) -> tuple[str, bytes]:
    """The kind and stored bytes of artifact ``key`` (for downloads).

    Raises:
        RunNotFound, ArtifactNotFound: as :func:`artifact`.
    """
    _run(run_id)
    row = Artifact.objects.filter(run_id=run_id, key=key, visible=True).values_list(
        "kind", "content").first()
    if row is None:
        raise exceptions.ArtifactNotFound(run_id, key)
    return row[0], bytes(row[1])


def delete_artifact(run_id: int, key: str) -> None:
    """Delete artifact ``key`` of the run.

    Raises:
        RunNotFound: no run has that id.
        ArtifactNotFound: the run has no visible artifact of that key.
    """
    _run(run_id)
    deleted, _ = Artifact.objects.filter(run_id=run_id, key=key, visible=True).delete()
    if not deleted:
        raise exceptions.ArtifactNotFound(run_id, key)


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    return {field: row[field] for field in SUMMARY_FIELDS}


# -- chunks of streaming steps ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ChunkPage:
    """Chunks of one step after a position, and whether more can come."""

    step_name: str
    step_run_id: int | None
    """The step row streamed (the step's latest visit); None before the step first starts."""
    step_status: str | None
    """That row's status: ``pending`` (not started, or waiting for a retry), ``processing``,
    ``completed``, ``failed``, ``cancelled``."""
    chunks: list[dict[str, Any]]
    """``index``, ``content`` (the yielded JSON value), ``attempt``, ``created_at``."""
    finished: bool
    """True once no chunk can be added: the step row or the run is finished."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps in ISO 8601)."""
        return {"step_name": self.step_name, "step_run_id": self.step_run_id,
                "step_status": self.step_status, "finished": self.finished,
                "chunks": [{**c, "created_at": c["created_at"].isoformat()}
                           for c in self.chunks]}


def step_name_of(run_id: int, step: int | str) -> str:
    """The name of step ``step`` (its name, or its position) of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
        UnknownStep: the run's workflow has no such step.
    """
    run = _run(run_id)
    spec = load_spec(run.definition_id)
    names = [s.name for s in spec.steps]
    if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < len(names):
        return names[step]
    if isinstance(step, str) and step in names:
        return step
    if isinstance(step, str) and step.isdigit() and int(step) < len(names):
        return names[int(step)]
    raise exceptions.UnknownStep(f"Workflow {spec.name!r} (run {run_id}) has no step "
                                 f"{step!r}; its steps are {', '.join(names)}.")


def can_stream(run_id: int, step_name: str) -> bool:
    """Whether step ``step_name`` of the run's workflow can yield chunks (a then() step;
    waits, delays, fan-outs and child runs cannot)."""
    spec = load_spec(_run(run_id).definition_id)
    return any(s.name == step_name and s.kind == "task" for s in spec.steps)


def chunks(run_id: int, step: int | str, *, after: int = -1,
           limit: int | None = None) -> ChunkPage:
    """The chunks a streaming step stored, readable while it runs.

    ``step`` is the step's name or position; its latest visit is read (a step a loop visits
    again streams afresh). ``after``: only chunks whose ``index`` is greater (the last index
    a reader has). The chunks of every attempt of that visit are included, in order.

    Raises:
        RunNotFound: no run has that id.
        UnknownStep: the run's workflow has no such step.
    """
    name = step_name_of(run_id, step)
    return read_chunks(run_id, name, after=after, limit=limit)


def read_chunks(run_id: int, step_name: str, *, after: int = -1,
                limit: int | None = None) -> ChunkPage:
    """:func:`chunks` for a step name already checked."""
    step_run_id, status, finished = latest_step_row(run_id, step_name)
    if step_run_id is None:
        return ChunkPage(step_name, None, None, [], finished)
    found = raw_chunks(run_id, step_name, step_run_id, after, limit)
    listed = [{"index": index, "content": json.loads(text), "attempt": attempt,
               "created_at": created} for index, text, attempt, created in found]
    if finished and limit is not None and len(listed) == limit:
        finished = False  # a reader with a limit has more to read first
    return ChunkPage(step_name, step_run_id, status, listed, finished)


def latest_step_row(run_id: int, step_name: str) -> tuple[int | None, str | None, bool]:
    """The id and status of the step's latest row (None before the step first starts), and
    whether no chunk can be added to it any more (the row or the run is finished)."""
    row = (StepRun.objects.filter(run_id=run_id, kind="step", step_name=step_name)
           .order_by("-pk").values_list("pk", "status", "run__status").first())
    if row is None:
        status = WorkflowRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        return None, None, status is None or status in FINISHED
    live = (StepStatus.PENDING, StepStatus.PROCESSING, StepStatus.HELD)
    return row[0], row[1], row[1] not in live or row[2] in FINISHED


def raw_chunks(run_id: int, step_name: str, step_run_id: int, after: int,
               limit: int | None = 500) -> list[tuple[int, str, int, datetime]]:
    """``(index, JSON text, attempt, created_at)`` of one step row's chunks after ``after``,
    the text unparsed (the stream endpoint sends it as it is stored)."""
    found = (StepChunk.objects.filter(run_id=run_id, step_name=step_name,
                                      step_run_id=step_run_id, index__gt=after)
             .order_by("index").values_list("index", "content", "attempt", "created_at"))
    return list(found if limit is None else found[:limit])


def export_rows(run_id: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's visible artifacts (content portable: ``bytes`` as base64) and its chunks,
    for an export document."""
    documents = [{**_summary(row), "content": rules.portable(row["kind"], row["content"]),
                  "created_at": row["created_at"].isoformat(),
                  "updated_at": row["updated_at"].isoformat()}
                 for row in Artifact.objects.filter(run_id=run_id, visible=True)
                 .order_by("key").values(*SUMMARY_FIELDS, "content")]
    streamed = [{**row, "content": json.loads(row["content"]),
                 "created_at": row["created_at"].isoformat()}
                for row in StepChunk.objects.filter(run_id=run_id)
                .order_by("step_run_id", "index").values(
                    "step_run_id", "step_index", "step_name", "index", "attempt", "content",
                    "created_at")]
    return documents, streamed
