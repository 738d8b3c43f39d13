"""Will the live runs get past the code at hand? ``manage.py queuety deploy-check`` and the
system checks ``queuety.E005`` / ``E006`` ask here.

A run is pinned to its stored definition, whose handlers are dotted paths; the code under
them changes with every deploy. For every stored definition that still has live runs, the
check imports every path it names (its child workflows' too) as a worker would, through the
handler aliases, and checks that each still fits its call site
(``queuety.core.handler_refs``). It reads three statements whatever the number of runs: the
live runs counted per definition and status in one grouped query, the oldest of each, and
the definitions themselves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Min

from queuety.conf import settings
from queuety.core import handler_refs, imports
from queuety.core.handler_refs import DefinitionCheck, Importer
from queuety.core.status import RunStatus
from queuety.models import WorkflowDefinition, WorkflowRun

#: The statuses whose runs will still run a step: each may reach any step it has not passed.
LIVE = (RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS,
        RunStatus.PAUSED)


@dataclass(frozen=True, slots=True, kw_only=True)
class DefinitionReport:
    """One stored definition with live runs, and what its paths do in this code."""

    id: int
    name: str
    hash: str
    version: str | None
    live: dict[str, int]
    """Its live runs by status (only the statuses it has)."""
    oldest_run_id: int
    oldest_created_at: datetime
    check: DefinitionCheck

    @property
    def ok(self) -> bool:
        """Whether every live run of it gets past every path it names."""
        return not self.check.failures

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``deploy-check --json``)."""
        return {"id": self.id, "name": self.name, "hash": self.hash, "version": self.version,
                "ok": self.ok, "live_runs": self.live, "live_total": sum(self.live.values()),
                "oldest_run": {"id": self.oldest_run_id,
                               "created_at": self.oldest_created_at.isoformat()},
                "failures": self.check.failures,
                "failing": [f.to_dict() for f in self.check.findings if not f.ok],
                "aliased": [f.to_dict() for f in self.check.aliased]}


@dataclass(frozen=True, slots=True, kw_only=True)
class AliasReport:
    """One handler alias in force, and whether its target imports."""

    old: str
    new: str
    source: str
    """``settings`` (``QUEUETY["HANDLER_ALIASES"]``) or ``code`` (``queuety.alias()``)."""
    target: str | None
    """The end of its chain (``new``, unless ``new`` is aliased too); ``None``: it loops."""
    problem: str | None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"from": self.old, "to": self.new, "source": self.source,
                "resolves_to": self.target, "ok": self.problem is None,
                "problem": self.problem}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeployReport:
    """The whole check: each definition with live runs, and each alias."""

    definitions: list[DefinitionReport] = field(default_factory=list)
    aliases: list[AliasReport] = field(default_factory=list)

    @property
    def failures(self) -> int:
        """Problems found: failing paths and unloadable definitions, and broken aliases."""
        return sum(len(d.check.failures) for d in self.definitions) + sum(
            1 for a in self.aliases if a.problem is not None)

    @property
    def ok(self) -> bool:
        """Whether no live run would fail on the code at hand (the exit status, 0 or 1)."""
        return self.failures == 0

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON document ``deploy-check --json`` prints."""
        return {"ok": self.ok, "failures": self.failures,
                "live_runs": sum(sum(d.live.values()) for d in self.definitions),
                "definitions": [d.to_dict() for d in self.definitions],
                "aliases": [a.to_dict() for a in self.aliases]}


def deploy_check(importer: Importer | None = None) -> DeployReport:
    """Check every stored definition that has live runs, and every alias, against the code
    this process imports. Reads only; three statements whatever the number of runs.

    ``importer`` imports one dotted path exactly (default: ``queuety.core.imports``'s, which
    caches what it imported; a process that edited code on disk calls
    ``imports.forget_imports()`` first).
    """
    importer = _remembering(importer or imports.import_exact)
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    first: dict[int, int] = {}
    # One grouped scan of the live runs (the status index reads only those): counts and the
    # first id per definition and status. Ids grow with created_at, so the lowest is the
    # oldest run.
    for definition_id, status, count, lowest in (
            WorkflowRun.objects.filter(status__in=LIVE).order_by()
            .values_list("definition_id", "status").annotate(Count("id"), Min("id"))):
        counts[definition_id][status] = count
        first[definition_id] = min(lowest, first.get(definition_id, lowest))
    created = dict(WorkflowRun.objects.filter(pk__in=first.values())
                   .values_list("pk", "created_at"))
    reports = []
    for pk, name, digest, data in (WorkflowDefinition.objects.filter(pk__in=counts)
                                   .order_by("name", "pk")
                                   .values_list("pk", "name", "definition_hash", "definition")):
        reports.append(DefinitionReport(
            id=pk, name=name, hash=digest,
            version=data.get("version") if isinstance(data, dict) else None,
            live={status: counts[pk][status] for status in LIVE if status in counts[pk]},
            oldest_run_id=first[pk], oldest_created_at=created[first[pk]],
            check=_check(data, importer)))
    return DeployReport(definitions=reports, aliases=list(alias_reports(importer)))


def alias_reports(importer: Importer) -> Iterable[AliasReport]:
    """Each alias in force, with whether the end of its chain imports (an alias to nothing
    would fail every run that needs it)."""
    configured = settings.HANDLER_ALIASES
    for old, new in sorted(imports.aliases().items()):
        source = "settings" if old in configured else "code"
        said = (f"The handler alias {old!r} -> {new!r} ("
                + ("QUEUETY['HANDLER_ALIASES']" if source == "settings" else "queuety.alias()")
                + ")")
        try:
            target: str | None = imports.resolve(old)
        except ImportError as error:
            yield AliasReport(old=old, new=new, source=source, target=None,
                              problem=f"{said} is refused: {error}")
            continue
        problem = None
        try:
            importer(str(target))
        except Exception as error:  # noqa: BLE001 - a module that raises on import, too
            lead = "leads to" if target != new else "points to"
            problem = (f"{said} {lead} {target!r}, which does not import in this code "
                       f"({type(error).__name__}: {str(error).rstrip('.')}).")
        yield AliasReport(old=old, new=new, source=source, target=target, problem=problem)


def _check(data: Any, importer: Importer) -> DefinitionCheck:
    if not isinstance(data, dict):
        return DefinitionCheck((), (f"The stored definition is {type(data).__name__}, not a "
                                    "JSON object, so its runs fail at their next step.",))
    return handler_refs.check_definition(data, importer, imports.resolve)


def _remembering(importer: Importer) -> Importer:
    """``importer``, trying each path once: many definitions name the same handlers, and a
    module that is missing is looked for on the whole ``sys.path`` each time."""
    done: dict[str, tuple[Any, Exception | None]] = {}

    def imported(path: str) -> Any:
        if path not in done:
            try:
                done[path] = (importer(path), None)
            except Exception as refused:  # noqa: BLE001 - raised again to each caller below
                done[path] = (None, refused)
        found, error = done[path]
        if error is not None:
            raise error
        return found

    return imported

