"""Stored definitions compared, and drained: what changed between two ``WorkflowDefinition``
rows, and which definitions of a workflow still have live runs.

A definition with no live run is drained: no run will execute it again, so code that only it
names can be removed by the next deploy. The diff reads the rows' stored JSON, so a definition
that no longer loads (its code is already gone) is still compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet

from queuety.core import diff, status
from queuety.models import WorkflowDefinition, WorkflowRun
from queuety.store import definitions


def diff_definitions(a: str | int, b: str | int) -> diff.DefinitionDiff:
    """Return what changed from stored definition ``a`` to stored definition ``b``.

    Each is a definition id, a hash, or a unique prefix of at least 8 characters of one. They
    may be definitions of two different workflows (the diff's ``same_workflow`` is then False).

    Raises:
        UnknownDefinition: ``a`` or ``b`` matches no stored definition, or a prefix matches
            more than one; the message names it.
    """
    return diff_rows(definitions.find_definition(a), definitions.find_definition(b))


def diff_rows(old: WorkflowDefinition, new: WorkflowDefinition) -> diff.DefinitionDiff:
    """Return what changed from row ``old`` to row ``new``, from their stored JSON."""
    return diff.diff_documents(old.definition, new.definition, old_id=old.pk, new_id=new.pk,
                               old_hash=old.definition_hash, new_hash=new.definition_hash)


def previous_definition(definition: WorkflowDefinition) -> WorkflowDefinition | None:
    """Return the definition of the same workflow stored just before ``definition`` (the
    highest id below its own), or None when it is the workflow's first."""
    return (WorkflowDefinition.objects.filter(name=definition.name, pk__lt=definition.pk)
            .order_by("-pk").first())


def live_count(counts: Mapping[str, int]) -> int:
    """Return how many of the runs counted per status (``{"running": 3, ...}``) are live:
    running, waiting for signals or workflows, or paused."""
    return sum(counts.get(each, 0) for each in status.UNFINISHED)


@dataclass(frozen=True, slots=True, kw_only=True)
class Drain:
    """One stored definition of a workflow, with the runs that still need it."""

    id: int
    definition_hash: str
    version: str | None
    created_at: datetime
    live_runs: int
    """Its runs that are not finished (:data:`queuety.core.status.UNFINISHED`)."""
    total_runs: int
    newest: bool
    """True for the workflow's newest definition: the one new runs get while its code is
    deployed unchanged, so it is never called drained."""

    @property
    def drained(self) -> bool:
        """True when no live run uses it and a newer definition replaced it: code that only
        it names can go."""
        return self.live_runs == 0 and not self.newest

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (``created_at`` in ISO 8601)."""
        return {"id": self.id, "definition_hash": self.definition_hash,
                "version": self.version, "created_at": self.created_at.isoformat(),
                "live_runs": self.live_runs, "total_runs": self.total_runs,
                "newest": self.newest, "drained": self.drained}


def drain(name: str, runs: QuerySet[WorkflowRun] | None = None) -> list[Drain]:
    """Return every stored definition of workflow ``name``, newest first, with its live and
    total runs (two queries, whatever the number of definitions); counted among ``runs``
    when given (a user's scope)."""
    rows = list(WorkflowDefinition.objects.filter(name=name).order_by("-pk")
                .only("pk", "definition_hash", "created_at", "definition"))
    counts: dict[int, dict[str, int]] = {}
    for definition_pk, run_status, n in (
            (WorkflowRun.objects.all() if runs is None else runs)
            .filter(definition_id__in=[row.pk for row in rows])
            .values_list("definition_id", "status").annotate(n=Count("pk")).order_by()):
        counts.setdefault(definition_pk, {})[run_status] = n
    return [Drain(id=row.pk, definition_hash=row.definition_hash,
                  version=(row.definition or {}).get("version"), created_at=row.created_at,
                  live_runs=live_count(counts.get(row.pk, {})),
                  total_runs=sum(counts.get(row.pk, {}).values()), newest=position == 0)
            for position, row in enumerate(rows)]
