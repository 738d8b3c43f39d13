"""Definitions are immutable rows, so every process may cache them forever."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from django.db import transaction

from queuety import exceptions
from queuety.conf import settings
from queuety.core.definition import ParallelStep, WorkflowSpec
from queuety.core.retry import RetryPolicy
from queuety.models import WorkflowDefinition

_definition_ids: dict[tuple[str, str], int] = {}
_specs: dict[int, WorkflowSpec] = {}
# ``WorkflowSpec.definition_hash`` digests the canonical JSON on every access, too slow for
# every row of an admin changelist.
_hashes: dict[int, str] = {}
# What each definition waits for at which step: {step index: "approval" | "decision" |
# "input" | "signal"}.
_wait_kinds: dict[int, dict[int, str]] = {}


def definition_id(spec: WorkflowSpec) -> int:
    """Return the id of the ``WorkflowDefinition`` row for ``spec``, creating it if needed.

    The id is remembered once the row is known to be committed: a row created inside a
    transaction that rolls back (a view under ``ATOMIC_REQUESTS`` that fails after
    dispatching, a test in pytest-django's ``db`` fixture) is gone, and a remembered id would
    make every later dispatch of ``spec`` in this process fail on the foreign key.
    """
    key = (spec.name, spec.definition_hash)
    found = _definition_ids.get(key)
    if found is None:
        row, _ = WorkflowDefinition.objects.get_or_create(
            name=spec.name, definition_hash=key[1], defaults={"definition": spec.to_dict()}
        )
        found = row.pk
        # Keyed by id: a rolled-back id is never handed out again. Without the builder's
        # tags, which are no part of the stored definition (a loaded spec carries none).
        _specs[found] = replace(spec, tags=()) if spec.tags else spec
        remember = partial(_definition_ids.__setitem__, key, found)
        if transaction.get_connection().in_atomic_block:
            transaction.on_commit(remember)
        else:
            remember()
    return found


def load_spec(definition_pk: int) -> WorkflowSpec:
    """Return the definition stored under ``definition_pk`` (cached per process).

    Raises:
        WorkflowDefinitionError: the stored definition no longer loads here (a class its
            retry policies name was removed by a deploy, say).
    """
    spec = _specs.get(definition_pk)
    if spec is None:
        row = WorkflowDefinition.objects.only("definition").get(pk=definition_pk)
        spec = _specs[definition_pk] = WorkflowSpec.from_dict(row.definition)
    return spec


def effective_policy(spec: WorkflowSpec, step_index: int, branch: int = 0) -> RetryPolicy:
    """Return the retry policy of a step (of its ``parallel`` branch ``branch``): the branch's
    own, else the step's, else its workflow's, else the global one."""
    step = spec.steps[step_index]
    own = step.fanout.retry_of(branch) if isinstance(step, ParallelStep) else None
    policy: RetryPolicy = own or step.retry or spec.retry or settings.DEFAULT_RETRY
    return policy


def definition_hash(definition_pk: int) -> str:
    """Return the hash of a stored definition (as stored: also for one that no longer
    loads here)."""
    found = _hashes.get(definition_pk)
    if found is None:
        found = _hashes[definition_pk] = WorkflowDefinition.objects.values_list(
            "definition_hash", flat=True).get(pk=definition_pk)
    return found


def wait_kinds() -> dict[int, dict[int, str]]:
    """Return, for every definition, the kind of each of its wait steps (``approval``,
    ``decision``, ``input`` or ``signal``).

    One query for the definition ids; definitions not seen before are read in one more query.
    A definition this version cannot read waits for nothing it knows.
    """
    ids = set(WorkflowDefinition.objects.values_list("pk", flat=True))
    missing = ids - _wait_kinds.keys()
    if missing:
        for pk, document in (WorkflowDefinition.objects.filter(pk__in=missing)
                             .values_list("pk", "definition")):
            try:
                spec: WorkflowSpec | None = WorkflowSpec.from_dict(document)
            except (exceptions.WorkflowDefinitionError, KeyError, TypeError, ValueError):
                spec = None
            _wait_kinds[pk] = {} if spec is None else {
                index: step.wait.human or "signal"
                for index, step in enumerate(spec.steps) if step.wait is not None}
    return {pk: _wait_kinds[pk] for pk in ids}


#: The shortest hash prefix :func:`find_definition` accepts (the admin shows 12 characters).
MIN_PREFIX = 8


def find_definition(ref: str | int, *, name: str | None = None) -> WorkflowDefinition:
    """Return the stored definition ``ref`` names: an ``int`` (or a string of up to 7 digits)
    is its id; any other string is its hash or a unique prefix of it (at least
    :data:`MIN_PREFIX` characters). With ``name``, it must be a definition of that workflow.

    Raises:
        UnknownDefinition: nothing matches, the prefix is too short or matches more than one
            definition, or the definition is of another workflow than ``name``.
    """
    text = str(ref).strip()
    found: list[WorkflowDefinition]
    if isinstance(ref, int) or (text.isdigit() and len(text) < MIN_PREFIX):
        found = list(WorkflowDefinition.objects.filter(pk=int(text)))
    elif len(text) < MIN_PREFIX:
        raise exceptions.UnknownDefinition(text, (
            f"{text!r} is neither a definition id nor a hash: give the id, the full hash, or "
            f"at least {MIN_PREFIX} characters of it."))
    else:
        found = list(WorkflowDefinition.objects.filter(
            definition_hash__startswith=text.lower()).order_by("pk")[:2])
    if len(found) > 1:
        raise exceptions.UnknownDefinition(text, (
            f"The hash prefix {text!r} matches more than one definition (ids {found[0].pk} "
            f"and {found[1].pk}); give more of the hash."))
    if not found:
        raise exceptions.UnknownDefinition(text)
    row = found[0]
    if name is not None and row.name != name:
        raise exceptions.UnknownDefinition(text, (
            f"Definition {text!r} (id {row.pk}) is of workflow {row.name!r}, not {name!r}."))
    return row
