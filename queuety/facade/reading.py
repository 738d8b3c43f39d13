"""Reading runs back: status, lists, resource overviews, the timeline, export and replay,
definition diffs, artifacts and chunks (re-exported by ``queuety``).

Importing this module does not import Django: each function imports the module that does
the work when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from queuety.core.diff import DefinitionDiff
from queuety.core.status import WorkflowStatus

if TYPE_CHECKING:  # for annotations only: importing it would import Django

    from queuety.outputs import ChunkPage


def machine_status(run_id: int) -> Any:
    """Return the ``MachineStatus`` of state machine run ``run_id``: ``.state``,
    ``.history``, ``.status``, ``.data`` (docs/guide/state-machines.md).

    Raises:
        RunNotFound: no run has that id.
        NotAMachine: the run is not a state machine's.
    """
    from queuety import machines

    return machines.machine_status(run_id)


def workflow_status(run_id: int) -> WorkflowStatus:
    """Return a :class:`WorkflowStatus` snapshot of run ``run_id``.

    Raises:
        RunNotFound: no run has that id.
    """
    from queuety import queries

    return queries.workflow_status(run_id)


def list_workflows(status: str | None = None, limit: int = 50) -> list[WorkflowStatus]:
    """Return up to ``limit`` runs, newest first, optionally only those with ``status``."""
    from queuety import queries

    return queries.list_workflows(status=status, limit=limit)


def resource_groups() -> list[dict[str, Any]]:
    """Every concurrency group with a step in flight or waiting: ``group``, ``in_flight``,
    ``limit``, ``waiting``, ``woken``, ``running_cost``, ``cost_budget``, ``rate_limit`` and
    ``recent_starts`` (docs/guide/resources.md)."""
    from queuety import queries

    return queries.resource_groups()


def queue_budgets() -> list[dict[str, Any]]:
    """Every queue with a cost budget, or with a step still holding or waiting for one:
    ``queue``, ``budget``, ``running``, ``running_cost`` and ``waiting``
    (docs/guide/resources.md)."""
    from queuety import queries

    return queries.queue_budgets()


def workflow_timeline(run_id: int, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
    """Return the run's events, oldest first."""
    from queuety import timeline

    return timeline.timeline(run_id, limit, offset)


def workflow_state_at(run_id: int, step: int | str) -> dict[str, Any]:
    """Return the public state right after ``step`` (index or name) last completed."""
    from queuety import timeline

    return timeline.state_at(run_id, step)


def export_workflow(run_id: int) -> dict[str, Any]:
    """Return the run as a versioned JSON document (``format_version`` 2: with its
    artifacts and chunks)."""
    from queuety import export

    return export.export(run_id)


def replay_workflow(document: Any) -> int:
    """Start a run that continues where an exported one stood; return its id."""
    from queuety import export

    return export.replay(document)


def diff_definitions(a: str | int, b: str | int) -> DefinitionDiff:
    """Return what changed from stored definition ``a`` to stored definition ``b``: steps
    added, removed and moved, options and handlers changed per step, child workflows, and the
    workflow's own fields (version, budgets, retry, deadline, queue, hooks, ...).

    ``a`` and ``b`` are definition ids, hashes, or unique hash prefixes of at least 8
    characters. The stored JSON is compared, so a definition whose code is gone is still
    diffable; two definitions of different workflows are too (``same_workflow`` is False).
    The diff has ``to_dict()`` (JSON-ready) and ``to_text()``.

    Raises:
        UnknownDefinition: ``a`` or ``b`` matches no stored definition, or a prefix matches
            more than one.
    """
    from queuety import definition_diff

    return definition_diff.diff_definitions(a, b)


def put_artifact(run_id: int, key: str, content: Any, kind: str = "json",
                 metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Store (or replace) artifact ``key`` of run ``run_id`` from outside a step; return its
    summary. Inside a step, use ``context.put_artifact(key, content, kind, metadata)``.

    ``kind``: ``json`` (any JSON value), ``text`` or ``markdown`` (a string), ``bytes``.

    Raises:
        RunNotFound, InvalidArtifact: nothing is written.
    """
    from queuety import outputs

    return outputs.put_artifact(run_id, key, content, kind, metadata)


def artifacts(run_id: int, *, with_content: bool = False) -> list[dict[str, Any]]:
    """Return the run's artifacts by key (without their content unless ``with_content``)."""
    from queuety import outputs

    return outputs.artifacts(run_id, with_content=with_content)


def artifact(run_id: int, key: str) -> dict[str, Any]:
    """Return artifact ``key`` of the run, with its ``content``.

    Raises:
        RunNotFound, ArtifactNotFound.
    """
    from queuety import outputs

    return outputs.artifact(run_id, key)


def delete_artifact(run_id: int, key: str) -> None:
    """Delete artifact ``key`` of the run.

    Raises:
        RunNotFound, ArtifactNotFound.
    """
    from queuety import outputs

    outputs.delete_artifact(run_id, key)


def chunks(run_id: int, step: int | str, *, after: int = -1) -> ChunkPage:
    """Return the chunks streaming step ``step`` (name or position) stored so far, readable
    while it runs; ``after``: only those past that index.

    Raises:
        RunNotFound, UnknownStep.
    """
    from queuety import outputs

    return outputs.chunks(run_id, step, after=after)
