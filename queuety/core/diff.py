"""What changed between two workflow definitions: steps added, removed and moved, each step's
options and handlers, the child workflows it runs, and the workflow's own fields.

The diff compares the definitions' JSON documents (:meth:`WorkflowSpec.to_dict`, which is what a
``WorkflowDefinition`` row stores), field by named field. Working on the documents rather than
on rebuilt specs is deliberate: a definition whose code a deploy removed no longer loads as a
:class:`~queuety.core.definition.WorkflowSpec`, and that is exactly the definition an operator
wants to compare with the one that replaced it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from queuety.core.definition import WorkflowSpec, canonical_json

#: The workflow's own fields, in the order a diff lists their changes (``steps`` are compared
#: apart); a field not named here (from another format) is compared after these.
WORKFLOW_FIELDS = ("name", "version", "budget", "retry", "deadline_seconds", "queue", "priority",
                   "compensate_on_failure", "prune_state_after", "on_cancel", "on_deadline",
                   "format")

#: A step's fields, in the order a diff lists their changes. ``name`` identifies the step;
#: ``child`` (a whole workflow document) is diffed as a workflow of its own.
STEP_FIELDS = ("kind", "handler", "compensation", "retry", "timeout", "transactional",
               "cost_units", "queue", "priority", "concurrency_group", "concurrency_limit",
               "rate_limit", "wait", "delay_seconds", "routes", "default_route", "fanout",
               "repeat", "start", "workflows")

#: The workflow fields that name handlers: its hooks.
WORKFLOW_HOOKS = frozenset({"on_cancel", "on_deadline"})

#: The step fields (as dotted paths) that name handlers: the task or item handler, the
#: compensation, a for_each reducer, a repeat condition; parallel branches are
#: ``fanout.branches[i]``.
HANDLER_FIELDS = frozenset({"handler", "compensation", "fanout.reducer", "repeat.condition"})

#: Lists compared position by position, since each position is one parallel branch.
_PER_POSITION = frozenset({"fanout.branches", "fanout.branch_timeouts",
                           "fanout.branch_retries"})

#: Characters of one value shown in the text rendering before it is cut.
TEXT_VALUE_CHARS = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldChange:
    """One field whose value differs."""

    field: str
    """Its dotted path: ``timeout``, ``retry.max_attempts``, ``fanout.branches[1]``,
    ``budget.max_transitions``."""
    old: Any
    """The value before (``None``: unset, or absent from that definition)."""
    new: Any
    """The value after."""

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"field", "old", "new"}``."""
        return {"field": self.field, "old": self.old, "new": self.new}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepChanges:
    """The changed fields of one step present in both definitions."""

    step: str
    changes: tuple[FieldChange, ...]

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"step", "changes": [...]}``."""
        return {"step": self.step, "changes": [change.to_dict() for change in self.changes]}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEntry:
    """A step only one definition has."""

    step: str
    kind: str
    position: int
    """Its position (from 0) in the definition that has it."""

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"step", "kind", "position"}``."""
        return {"step": self.step, "kind": self.kind, "position": self.position}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepMove:
    """A step both definitions have, at different positions."""

    step: str
    old_position: int
    new_position: int
    reordered: bool
    """True when its order among the steps both have changed; False when it was only shifted
    by steps added, removed or moved around it."""

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"step", "old_position", "new_position", "reordered"}``."""
        return {"step": self.step, "old_position": self.old_position,
                "new_position": self.new_position, "reordered": self.reordered}


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildChange:
    """A child workflow (of a ``run_workflow`` or ``start_workflows`` step) that changed."""

    step: str
    diff: DefinitionDiff

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"step", "diff": {...}}``."""
        return {"step": self.step, "diff": self.diff.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """One of the two definitions compared."""

    name: str
    version: str | None
    hash: str
    """As stored, when the definition is stored; else the sha256 of its canonical JSON."""
    id: int | None = None
    """The ``WorkflowDefinition`` row's id; ``None`` for a definition not read from a row."""

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"id", "name", "version", "hash"}``."""
        return {"id": self.id, "name": self.name, "version": self.version, "hash": self.hash}

    def label(self) -> str:
        """Return a one-line description: ``definition 12 of 'order' (version 'v2', hash
        a1b2c3d4e5f6)``."""
        what = "definition" if self.id is None else f"definition {self.id}"
        version = "no version" if self.version is None else f"version {self.version!r}"
        return f"{what} of {self.name!r} ({version}, hash {self.hash[:12]})"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffRow:
    """One line of a diff as a table shows it (see :meth:`DefinitionDiff.rows`)."""

    change: str
    """``workflow``, ``added``, ``removed``, ``moved``, ``option`` or ``handler``."""
    step: str
    """The step (``"ship › charge"`` inside child workflow ``ship``); ``""`` for the
    workflow's own fields."""
    field: str
    """The field's dotted path; ``""`` for a step added or removed."""
    before: str
    """The old value as text (as :func:`show_value` or :func:`show_handler` show it)."""
    after: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DefinitionDiff:
    """What changed from definition :attr:`old` to definition :attr:`new`.

    Steps are matched by name. Every tuple is empty when the two definitions are the same.
    """

    old: Side
    new: Side
    workflow_changes: tuple[FieldChange, ...] = ()
    """The workflow's own fields: version, budgets, retry, deadline, queue, hooks, ..."""
    steps_added: tuple[StepEntry, ...] = ()
    steps_removed: tuple[StepEntry, ...] = ()
    steps_moved: tuple[StepMove, ...] = ()
    options_changed: tuple[StepChanges, ...] = ()
    """Per step, the options that changed: retry, timeout, cost_units, queue, wait, delay,
    fan-out, resource hints, routes, ..."""
    handlers_changed: tuple[StepChanges, ...] = ()
    """Per step, the handlers whose dotted path changed (see :data:`HANDLER_FIELDS`)."""
    children_changed: tuple[ChildChange, ...] = ()
    """Per ``run_workflow`` or ``start_workflows`` step, the diff of its child workflow."""

    @property
    def same_workflow(self) -> bool:
        """True when both definitions are of the same workflow name."""
        return self.old.name == self.new.name

    @property
    def identical(self) -> bool:
        """True when nothing differs, the workflow name included."""
        return self.same_workflow and not (
            self.workflow_changes or self.steps_added or self.steps_removed
            or self.steps_moved or self.options_changed or self.handlers_changed
            or self.children_changed)

    def to_dict(self) -> dict[str, Any]:
        """Return the diff as JSON-ready data (the command line's ``--json``)."""
        return {
            "old": self.old.to_dict(), "new": self.new.to_dict(),
            "same_workflow": self.same_workflow, "identical": self.identical,
            "workflow_changes": [change.to_dict() for change in self.workflow_changes],
            "steps_added": [entry.to_dict() for entry in self.steps_added],
            "steps_removed": [entry.to_dict() for entry in self.steps_removed],
            "steps_moved": [move.to_dict() for move in self.steps_moved],
            "options_changed": [step.to_dict() for step in self.options_changed],
            "handlers_changed": [step.to_dict() for step in self.handlers_changed],
            "children_changed": [child.to_dict() for child in self.children_changed],
        }

    def to_text(self) -> str:
        """Return the diff as readable text, one change a line, grouped by kind of change."""
        head = [f"From: {self.old.label()}", f"To:   {self.new.label()}"]
        if not self.same_workflow:
            head.append(f"These are definitions of two different workflows, {self.old.name!r} "
                        f"and {self.new.name!r}; their steps are compared by name.")
        if self.identical:
            return "\n".join([*head, "No differences: the definitions are identical."])
        return "\n".join([*head, *self._sections()])

    def _sections(self, indent: str = "") -> Iterator[str]:
        inner = indent + "  "
        if self.workflow_changes:
            yield f"{indent}Workflow:"
            yield from (f"{inner}{_line(change)}" for change in self.workflow_changes)
        if self.steps_added:
            yield f"{indent}Steps added:"
            yield from (f"{inner}+ {e.step} ({e.kind}) at position {e.position}"
                        for e in self.steps_added)
        if self.steps_removed:
            yield f"{indent}Steps removed:"
            yield from (f"{inner}- {e.step} ({e.kind}), was at position {e.position}"
                        for e in self.steps_removed)
        if self.steps_moved:
            yield f"{indent}Steps moved:"
            yield from (f"{inner}{m.step}: position {m.old_position} → {m.new_position} "
                        + ("(reordered)" if m.reordered else "(shifted)")
                        for m in self.steps_moved)
        for title, groups in (("Options changed:", self.options_changed),
                              ("Handlers changed:", self.handlers_changed)):
            if groups:
                yield f"{indent}{title}"
            for group in groups:
                yield f"{inner}{group.step}:"
                yield from (f"{inner}  {_line(change)}" for change in group.changes)
        if self.children_changed:
            yield f"{indent}Child workflows changed:"
        for child in self.children_changed:
            yield f"{inner}{child.step} (workflow {child.diff.new.name!r}):"
            yield from child.diff._sections(inner + "  ")

    def rows(self) -> list[DiffRow]:
        """Return every change as one row of text, the child workflows' too (their steps
        named ``"<step> › <child step>"``): what a table of the diff shows."""
        rows = [_row("workflow", "", change) for change in self.workflow_changes]
        rows += [DiffRow(change="added", step=e.step, field="", before="",
                         after=f"{e.kind} step at position {e.position}")
                 for e in self.steps_added]
        rows += [DiffRow(change="removed", step=e.step, field="",
                         before=f"{e.kind} step at position {e.position}", after="")
                 for e in self.steps_removed]
        rows += [DiffRow(change="moved", step=m.step, field="position",
                         before=str(m.old_position),
                         after=f"{m.new_position} ({'reordered' if m.reordered else 'shifted'})")
                 for m in self.steps_moved]
        for change, groups in (("option", self.options_changed),
                               ("handler", self.handlers_changed)):
            rows += [_row(change, group.step, c) for group in groups for c in group.changes]
        for child in self.children_changed:
            rows += [replace(row, step=f"{child.step} › {row.step or 'workflow'}")
                     for row in child.diff.rows()]
        return rows


def diff_specs(old: WorkflowSpec, new: WorkflowSpec) -> DefinitionDiff:
    """Return what changed from ``old`` to ``new``, two built definitions."""
    return diff_documents(old.to_dict(), new.to_dict(), old_hash=old.definition_hash,
                          new_hash=new.definition_hash)


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any], *,
                   old_id: int | None = None, new_id: int | None = None,
                   old_hash: str | None = None, new_hash: str | None = None) -> DefinitionDiff:
    """Return what changed from ``old`` to ``new``, two definitions' JSON documents (as
    :meth:`WorkflowSpec.to_dict` returns and ``WorkflowDefinition.definition`` stores them).

    ``old_id`` and ``new_id`` are the rows' ids, ``old_hash`` and ``new_hash`` their stored
    hashes (by default the sha256 of each document's canonical JSON). The documents are not
    loaded as specs: handlers are compared as the dotted paths stored, never imported.
    """
    old_steps, new_steps = _steps(old), _steps(new)
    options: list[StepChanges] = []
    handlers: list[StepChanges] = []
    children: list[ChildChange] = []
    for name, new_step in new_steps.items():
        if (old_step := old_steps.get(name)) is None:
            continue
        changes = list(_compare(old_step, new_step, STEP_FIELDS, skip=("name", "child")))
        child = _child_change(name, old_step.get("child"), new_step.get("child"))
        if isinstance(child, ChildChange):
            children.append(child)
        elif child is not None:
            changes.append(child)
        if own := [c for c in changes if not names_handler(c.field)]:
            options.append(StepChanges(step=name, changes=tuple(own)))
        if named := [c for c in changes if names_handler(c.field)]:
            handlers.append(StepChanges(step=name, changes=tuple(named)))
    return DefinitionDiff(
        old=_side(old, old_id, old_hash), new=_side(new, new_id, new_hash),
        workflow_changes=tuple(_compare(old, new, WORKFLOW_FIELDS, skip=("steps",))),
        steps_added=_only_in(new_steps, old_steps), steps_removed=_only_in(old_steps, new_steps),
        steps_moved=_moves(list(old_steps), list(new_steps)),
        options_changed=tuple(options), handlers_changed=tuple(handlers),
        children_changed=tuple(children))


def document_hash(document: Mapping[str, Any]) -> str:
    """Return the sha256 of a definition document's canonical JSON (its
    :attr:`WorkflowSpec.definition_hash`)."""
    return hashlib.sha256(canonical_json(document).encode("ascii")).hexdigest()


# -- comparing documents -------------------------------------------------------------------------

def _side(document: Mapping[str, Any], id: int | None, hash: str | None) -> Side:
    return Side(name=str(document.get("name", "")), version=document.get("version"),
                hash=hash or document_hash(document), id=id)


def _steps(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The document's steps by name, in order (names are unique in a valid definition; a
    stored one is trusted to be, and a repeated name keeps its first step)."""
    steps: dict[str, dict[str, Any]] = {}
    for step in document.get("steps") or ():
        steps.setdefault(str(step.get("name")), step)
    return steps


def _only_in(steps: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]
             ) -> tuple[StepEntry, ...]:
    """The steps of ``steps`` (with their positions there) whose name ``other`` lacks."""
    return tuple(StepEntry(step=name, kind=str(step.get("kind", "task")), position=position)
                 for position, (name, step) in enumerate(steps.items()) if name not in other)


def _compare(old: Mapping[str, Any], new: Mapping[str, Any], order: tuple[str, ...], *,
             skip: tuple[str, ...]) -> Iterator[FieldChange]:
    """The changed fields of two JSON objects: the ``order`` fields first, then any other
    (sorted), except the ``skip`` ones."""
    others = sorted((old.keys() | new.keys()) - set(order) - set(skip))
    for key in (*order, *others):
        yield from _changes(old.get(key), new.get(key), key)


def _changes(old: Any, new: Any, path: str) -> Iterator[FieldChange]:
    """The changes from ``old`` to ``new`` at ``path``: objects field by field (a field absent
    on one side reads as unset, as does an empty one), branch lists position by position,
    other values whole."""
    if old == new or (old in (None, {}) and new in (None, {})):
        return
    if _opened(old, dict, path) and _opened(new, dict, path):
        old, new = old or {}, new or {}
        for key in sorted(old.keys() | new.keys()):
            yield from _changes(old.get(key), new.get(key), f"{path}.{key}")
    elif path in _PER_POSITION and _opened(old, list, path) and _opened(new, list, path):
        old, new = old or [], new or []
        for position in range(max(len(old), len(new))):
            yield from _changes(old[position] if position < len(old) else None,
                                new[position] if position < len(new) else None,
                                f"{path}[{position}]")
    else:
        yield FieldChange(field=path, old=old, new=new)


def _opened(value: Any, kind: type, path: str) -> bool:
    """Whether the value at ``path`` is compared item by item as a ``kind``: it is one, or it
    is unset where a definition's own objects stand (a top-level field such as a step's
    ``retry`` or ``fanout``, or a fan-out's branch lists), so a policy set where there was
    none lists its fields. A deeper value added or removed whole (a wait's schema) stays
    whole."""
    if isinstance(value, kind):
        return True
    if value is not None:
        return False
    return "." not in path if kind is dict else path in _PER_POSITION


def _child_change(step: str, old: Any, new: Any) -> ChildChange | FieldChange | None:
    """The change of a step's child workflow: a diff of its own when both sides run one, a
    field change when only one does (the step changed kind)."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        return ChildChange(step=step, diff=diff_documents(old, new))
    return FieldChange(field="child", old=old, new=new)


def _moves(old: list[str], new: list[str]) -> tuple[StepMove, ...]:
    """The steps both lists have at different positions; a step outside the longest common
    subsequence of the shared steps is ``reordered``, the others were only shifted."""
    shared_old = [name for name in old if name in set(new)]
    shared_new = [name for name in new if name in set(old)]
    kept = _longest_common(shared_old, shared_new)
    return tuple(StepMove(step=name, old_position=old.index(name), new_position=position,
                          reordered=name not in kept)
                 for position, name in enumerate(new)
                 if name in set(old) and old.index(name) != position)


def _longest_common(a: list[str], b: list[str]) -> set[str]:
    """The names of a longest common subsequence of ``a`` and ``b`` (dynamic programming:
    definitions have tens of steps, not thousands)."""
    lengths = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            lengths[i][j] = (lengths[i + 1][j + 1] + 1 if a[i] == b[j]
                             else max(lengths[i + 1][j], lengths[i][j + 1]))
    kept, i, j = set(), 0, 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            kept.add(a[i])
            i, j = i + 1, j + 1
        elif lengths[i + 1][j] >= lengths[i][j + 1]:
            i += 1
        else:
            j += 1
    return kept


# -- the text rendering ------------------------------------------------------------------------

def show_value(value: Any) -> str:
    """A value as the text rendering shows it: ``unset`` for None, else compact JSON, cut at
    :data:`TEXT_VALUE_CHARS` characters."""
    if value is None:
        return "unset"
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "),
                      default=str)
    return text if len(text) <= TEXT_VALUE_CHARS else text[:TEXT_VALUE_CHARS - 1] + "…"


def show_handler(value: Any) -> str:
    """A handler's dotted path as the text rendering shows it (``none`` when unset)."""
    return str(value) if value else "none"


def names_handler(field: str) -> bool:
    """True when the step or workflow field at dotted path ``field`` names a handler (its
    values are dotted paths): see :data:`HANDLER_FIELDS` and :data:`WORKFLOW_HOOKS`."""
    return (field in HANDLER_FIELDS or field in WORKFLOW_HOOKS
            or field.startswith("fanout.branches["))


def _line(change: FieldChange) -> str:
    show = show_handler if names_handler(change.field) else show_value
    return f"{change.field}: {show(change.old)} → {show(change.new)}"


def _row(kind: str, step: str, change: FieldChange) -> DiffRow:
    show = show_handler if names_handler(change.field) else show_value
    return DiffRow(change=kind, step=step, field=change.field, before=show(change.old),
                   after=show(change.new))
