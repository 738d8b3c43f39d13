"""Export and replay: a run as a versioned JSON document, and a new run continuing from one.

The document carries the run, its definition, its step rows, its timeline, its signals, its
artifacts and the chunks of its streaming steps (``format_version`` 2; documents of version 1,
which have neither, are still read);
``replay`` validates it against :data:`EXPORT_SCHEMA`, checks the definition's hash and that
this site trusts the code it names, and only then writes a row.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

import jsonschema
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from queuety import exceptions, operations, outputs
from queuety.conf import settings
from queuety.core import artifacts as artifact_rules
from queuety.core import budget as budgets
from queuety.core import tags as tag_rules
from queuety.core.definition import WorkflowSpec, canonical_json
from queuety.core.handlers import resolve_handler
from queuety.core.machine import table_paths
from queuety.core.status import FINISHED
from queuety.models import (
    Event,
    RunStatus,
    Signal,
    StepRun,
    WorkflowDefinition,
    WorkflowDependency,
    WorkflowRun,
)
from queuety.queries import workflow_status
from queuety.runtime import artifacts as artifact_rows
from queuety.store import rows
from queuety.store.definitions import definition_id, load_spec
from queuety.timeline import event_dict
from queuety.version import __version__

#: Version of the export document's shape; bumped on incompatible changes. 2 added
#: ``artifacts`` and ``chunks``.
EXPORT_FORMAT = 2
#: The versions replay reads.
READABLE_FORMATS = (1, 2)


# -- export -----------------------------------------------------------------------------------

def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def export(run_id: int) -> dict[str, Any]:
    """Return run ``run_id`` as a versioned JSON document (``queuety.export_workflow()``)."""
    run = rows.get_run(run_id)
    spec = load_spec(run.definition_id)
    status = workflow_status(run_id)
    steps = StepRun.objects.filter(run_id=run_id).order_by("pk")
    artifacts, chunks = outputs.export_rows(run_id)
    return {
        "format_version": EXPORT_FORMAT,
        "queuety_version": __version__,
        "exported_at": timezone.now().isoformat(),
        "run": {
            "id": run.pk, "name": run.name, "status": run.status, "state": run.state,
            "current_step": run.current_step, "total_steps": run.total_steps,
            "current_step_name": status.current_step_name,
            "definition_version": spec.version, "definition_hash": spec.definition_hash,
            "idempotency_key": run.idempotency_key, "budget": status.budget,
            "counters": {"transitions": run.transitions, "cost_units": run.cost_units,
                         "started_workflows": run.started_workflows},
            "error": run.error, "deadline_at": _iso(run.deadline_at),
            "created_at": _iso(run.created_at), "finished_at": _iso(run.finished_at),
            "parent_run": run.parent_id, "started_by": run.started_by_id,
            "group": run.group or None, "groups": run.groups,
            # Only when set: a run without tags exports as before tags existed.
            **({"tags": run.tags} if run.tags else {}),
            # Only when set: the compensations queued after its failure or cancel, and how
            # far they got (an archive import restores it, so they never run twice).
            **({"cleanup": run.cleanup} if run.cleanup else {}),
        },
        "definition": spec.to_dict(),
        "steps": [{
            "id": s.pk, "kind": s.kind, "seq": s.seq, "branch": s.branch,
            "step_index": s.step_index, "step_name": s.step_name, "status": s.status,
            "attempt": s.attempt, "max_attempts": s.max_attempts, "timeout": s.timeout,
            "available_at": _iso(s.available_at), "claimed_at": _iso(s.claimed_at),
            "finished_at": _iso(s.finished_at), "output": s.output, "error": s.error,
        } for s in steps],
        "events": [event_dict(e) for e in Event.objects.filter(run_id=run_id).order_by("pk")],
        "signals": [{
            "id": s.pk, "name": s.name, "payload": s.payload, "sent_by": s.sent_by,
            "received_at": _iso(s.received_at), "consumed_at": _iso(s.consumed_at),
            "consumed_by_step": s.consumed_by_step,
            **({"dedupe_key": s.dedupe_key} if s.dedupe_key else {}),
        } for s in Signal.objects.filter(run_id=run_id).order_by("pk")],
        "wait_dependencies": [{"step_index": d.step_index, "depends_on": d.depends_on}
                              for d in WorkflowDependency.objects.filter(run_id=run_id)
                              .order_by("pk")],
        "artifacts": artifacts,
        "chunks": chunks,
    }


# -- replay -----------------------------------------------------------------------------------

_NULLABLE_STRING = {"type": ["string", "null"]}

#: The shape replay accepts; anything else is refused before a row is written.
EXPORT_SCHEMA = {
    "type": "object",
    "required": ["format_version", "run", "definition", "events", "signals"],
    "properties": {
        "format_version": {"enum": list(READABLE_FORMATS)},
        "run": {
            "type": "object",
            "required": ["name", "status", "state", "current_step", "definition_hash",
                         "counters"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "status": {"enum": [status.value for status in RunStatus]},
                "state": {"type": "object"},
                "current_step": {"type": "integer", "minimum": 0},
                "definition_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "counters": {"type": "object", "properties": {
                    name: {"type": "integer", "minimum": 0}
                    for name in ("transitions", "cost_units", "started_workflows")}},
                "error": {"type": ["object", "null"]},
                # Optional: documents exported before tags have none (queuety.core.tags
                # checks each pair at replay).
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "definition": {"type": "object", "required": ["name", "steps"]},
        "events": {"type": "array", "items": {
            "type": "object", "required": ["kind", "data"],
            "properties": {"kind": {"type": "string"}, "data": {"type": ["object", "null"]},
                           "step_name": _NULLABLE_STRING, "created_at": _NULLABLE_STRING}}},
        "signals": {"type": "array", "items": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1},
                           "consumed_at": _NULLABLE_STRING}}},
        "artifacts": {"type": "array", "items": {
            "type": "object", "required": ["key", "kind", "content"],
            "properties": {"key": {"type": "string", "minLength": 1},
                           "kind": {"enum": list(artifact_rules.KINDS)},
                           "metadata": {"type": ["object", "null"]},
                           "step_index": {"type": ["integer", "null"], "minimum": 0},
                           "step_name": _NULLABLE_STRING}}},
        "chunks": {"type": "array"},
    },
}


def _refuse(problem: str) -> exceptions.WorkflowDefinitionError:
    return exceptions.WorkflowDefinitionError(f"Invalid export document: {problem}")


def read_document(document: Any) -> tuple[dict[str, Any], WorkflowSpec]:
    """Validate an export document; return it with its definition, or raise naming the fault."""
    if isinstance(document, str | bytes):
        try:
            document = json.loads(document)
        except ValueError as error:
            raise _refuse(f"not JSON ({error}).") from None
        except RecursionError:
            raise _refuse("not JSON this site can read: it is nested too deeply.") from None
    try:
        errors = sorted(jsonschema.Draft202012Validator(EXPORT_SCHEMA).iter_errors(document),
                        key=lambda e: list(e.absolute_path))
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
            raise _refuse(f"at {where}: {errors[0].message}.")
        state_size = budgets.state_bytes(document["run"]["state"])
    except RecursionError:
        raise _refuse("it is nested too deeply to be stored as JSON.") from None
    run = document["run"]
    # Checked on the raw JSON, before anything in the document is imported.
    try:
        digest = hashlib.sha256(canonical_json(document["definition"]).encode("ascii"))
    except (TypeError, ValueError) as error:
        raise _refuse(f"its definition is not canonical JSON ({error}).") from None
    if digest.hexdigest() != run["definition_hash"]:
        raise _refuse(f"the definition's hash is {digest.hexdigest()}, not the "
                      f"{run['definition_hash']} the run names; the document was altered.")
    _check_trusted(document["definition"], run["definition_hash"])
    try:
        spec = WorkflowSpec.from_dict(document["definition"])
    except (exceptions.WorkflowDefinitionError, KeyError, TypeError, ValueError) as error:
        raise _refuse(f"its definition cannot be read ({error}).") from None
    if spec.name != run["name"]:
        raise _refuse(f"the run is named {run['name']!r} but its definition {spec.name!r}.")
    limit = spec.budget.max_state_bytes
    if limit is not None and state_size > limit:
        raise _refuse(f"its state is {state_size} bytes, over the workflow's max_state_bytes "
                      f"budget of {limit}.")
    for position, item in enumerate(document.get("artifacts") or []):
        try:
            artifact_rules.encode(item["key"], artifact_rules.from_portable(
                item["kind"], item["content"]), item["kind"], item.get("metadata"),
                limit=settings.MAX_ARTIFACT_BYTES)
        except exceptions.InvalidArtifact as error:
            raise _refuse(f"artifact {position} ({item['key']!r}): {error}") from None
    if run["current_step"] > len(spec.steps):
        raise _refuse(f"current_step {run['current_step']} is past the definition's "
                      f"{len(spec.steps)} steps.")
    for step in spec.steps:
        for path in filter(None, (step.handler, step.compensation)):
            try:
                resolve_handler(path)
            except exceptions.WorkflowDefinitionError as error:
                raise _refuse(f"step {step.name!r} names a handler this site cannot run: "
                              f"{error}") from None
    return document, spec


def _dotted_paths(definition: dict[str, Any]) -> list[str]:
    """Every dotted path a definition would make this site import."""
    paths = [definition.get("on_cancel"), definition.get("on_deadline")]
    for policy in [definition.get("retry")] + [s.get("retry") for s in definition["steps"]]:
        paths += (policy or {}).get("retry_on") or []
    for step in definition["steps"]:
        paths += [step.get("handler"), step.get("compensation")]
    paths += table_paths(definition.get("machine"))
    return [p for p in paths if p]


def _check_trusted(definition: dict[str, Any], definition_hash: str) -> None:
    """Refuse to import code a document names unless this site trusts that definition.

    Trusted: a definition this site has stored itself (it built or dispatched it), or one whose
    every dotted path lies under a module prefix of ``QUEUETY["REPLAY_MODULES"]``. Anything else
    could make a worker import and call arbitrary functions.
    """
    if WorkflowDefinition.objects.filter(definition_hash=definition_hash,
                                         name=definition.get("name")).exists():
        return
    allowed = tuple(settings.REPLAY_MODULES)
    untrusted = [p for p in _dotted_paths(definition)
                 if not any(p == m or p.startswith(m + ".") for m in allowed)]
    if untrusted:
        raise _refuse(
            f"this site has never stored definition {definition_hash[:12]} of workflow "
            f"{definition.get('name')!r}, and it names code outside QUEUETY['REPLAY_MODULES']: "
            f"{', '.join(untrusted[:3])}. Dispatch that workflow here once, or list its "
            "modules in QUEUETY['REPLAY_MODULES'].")


def replay(document: Any) -> int:
    """Start a new run that continues where an exported run stood; return its id.

    A waiting run waits again (its unconsumed signals come along); a running run gets its
    current step scheduled; paused, failed, completed and cancelled runs keep their status.
    The timeline, the artifacts and the tags are copied, then a ``workflow_replayed`` event is
    added.
    The chunks of streaming steps are not: they belong to the source run's step rows, and a
    step the new run runs again streams afresh. The idempotency key stays with the original
    run.

    Raises:
        WorkflowDefinitionError: the document is malformed, altered, or names handlers this
            site cannot import; nothing is written.
    """
    document, spec = read_document(document)
    source = document["run"]
    # Uncapped: the engine's own runs can carry more than a dispatch sets (queuety.core.tags).
    tags = tag_rules.check_tags(source.get("tags"), f"the exported run of {spec.name!r}",
                                most=None)
    now = timezone.now()
    definition_pk = definition_id(spec)
    counters = source["counters"]
    status = source["status"]
    with transaction.atomic():
        run = WorkflowRun.objects.create(
            definition_id=definition_pk, name=spec.name, state=source["state"],
            total_steps=len(spec.steps), current_step=source["current_step"],
            status=RunStatus.PAUSED if status in _RESUMED else status,
            error=source.get("error"), transitions=counters.get("transitions", 0),
            cost_units=counters.get("cost_units", 0),
            started_workflows=counters.get("started_workflows", 0),
            groups=run_groups(source.get("groups")), tags=tags,
            finished_at=now if status in FINISHED else None,
            deadline_at=(now + _deadline_left(source, document.get("exported_at"), now))
            if spec.deadline_seconds else None,
        )
        Event.objects.bulk_create([Event(
            run_id=run.pk, kind=e["kind"], step_index=e.get("step_index"),
            step_name=e.get("step_name") or "", attempt=e.get("attempt"),
            duration_ms=e.get("duration_ms"), data=e.get("data") or {},
        ) for e in document["events"]])
        Signal.objects.bulk_create([Signal(
            run_id=run.pk, name=s["name"], payload=s.get("payload"),
            sent_by=s.get("sent_by") or "", consumed_at=_when(s.get("consumed_at")),
            consumed_by_step=s.get("consumed_by_step") or "",
        ) for s in document["signals"]])
        for item in document.get("artifacts") or []:
            artifact_rows.write_visible(run.pk, artifact_rules.encode(
                item["key"], artifact_rules.from_portable(item["kind"], item["content"]),
                item["kind"], item.get("metadata"), limit=settings.MAX_ARTIFACT_BYTES),
                item.get("step_index"), item.get("step_name") or "")
        Event.objects.create(run=run, kind="workflow_replayed", data={
            "source_run_id": source.get("id"), "source_status": status,
            "definition_hash": spec.definition_hash, "state": source["state"]})
        if status in _RESUMED:
            # Created paused, then resumed: resuming lands the run on its current step
            # (a task gets its row and message, a wait is evaluated, a run_workflow step
            # starts its child afresh), exactly once.
            operations.resume(run.pk, actor="replay")
    return run.pk


def run_groups(value: Any) -> dict[str, list[int]]:
    """The ``groups`` of an exported run, checked: ``{group key: [run ids]}``."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(
                isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in v)
            for k, v in value.items()):
        raise exceptions.WorkflowDefinitionError(
            "The document's run.groups must map group keys to lists of run ids "
            f"(got {str(value)[:200]!r}); nothing was replayed.")
    return value


#: Statuses a replayed run resumes from (the others are kept as they were).
_RESUMED = (RunStatus.RUNNING, RunStatus.WAITING_FOR_SIGNAL, RunStatus.WAITING_FOR_WORKFLOWS)


def _when(text: str | None) -> datetime | None:
    return parse_datetime(text) if text else None


def _deadline_left(source: dict[str, Any], exported_at: str | None,
                   now: datetime) -> timedelta:
    """Time the exported run had left before its deadline (kept across the replay)."""
    deadline = _when(source.get("deadline_at"))
    exported = _when(exported_at) or now
    return max(deadline - exported, timedelta(0)) if deadline else timedelta(0)
