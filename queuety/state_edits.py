"""Editing a paused or failed run's state by hand (``queuety.edit_state()``).

An edit is a JSON merge patch (RFC 7396, :mod:`queuety.core.state_patch`) applied in one
transaction with the run's row (and its live step rows) locked, recorded as a ``state_edited``
event naming who, why, the patch, the changes and the whole new state (stored with the real
values, as every event stores the state; ``queuety.masking.mask`` hides secret keys' values
on read, in the changes too). The run's status does
not change: a paused run edited is resumed, a failed one retried, with the edited state.

The edit amends the state the run's current step starts from: ``retry(from_step=)`` of that
step, and a rewind to the step before it, start from the edited state too (``timeline``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from queuety import exceptions
from queuety.core import budget as budgets
from queuety.core import state_patch
from queuety.masking import mask_changes
from queuety.models import Event, RunStatus, StepRun, StepStatus, WorkflowRun
from queuety.store import rows
from queuety.store.definitions import load_spec

#: The statuses whose state may be edited: nothing runs that could merge over the edit.
EDITABLE = (RunStatus.PAUSED, RunStatus.FAILED)


def editable(run: WorkflowRun) -> bool:
    """Whether ``run``'s state may be edited as it stands (paused or failed, compensations
    not run); a step still running refuses the edit too, found when it is tried."""
    return run.status in EDITABLE and not run.cleanup


@dataclass(frozen=True)
class StateEdit:
    """What an edit makes of a run's state: the new state and the changes (each
    ``{"path", "before", "after"}``, a JSON Pointer path; values unmasked)."""

    run_id: int
    state: dict[str, Any]
    changes: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """The edit as the API answers it: secret keys' values masked."""
        return {"run_id": self.run_id, "changes": mask_changes(self.changes)}


def preview_edit(run_id: int, patch: Any) -> StateEdit:
    """Return what ``edit_state(run_id, patch)`` would make of the run's state, writing
    nothing (the admin's "Preview"). Raises what :func:`edit_state` raises, but a run's
    status may still change before the edit is saved."""
    run = rows.get_run(run_id)
    return _edited(run, patch)


def edit_state(run_id: int, patch: Any, *, reason: str, actor: str = "") -> StateEdit:
    """Apply the JSON merge patch ``patch`` to paused or failed run ``run_id``'s state.

    Raises:
        InvalidTransition: the run is not paused or failed, a step of it is still running
            (a paused run's step in flight), or its compensations already ran.
        InvalidStateEdit: no ``reason``, the patch is not a JSON object of plain JSON values,
            names a reserved ``_`` key, changes nothing, or the new state is over the
            workflow's ``max_state_bytes``. Nothing is changed.
        RunNotFound: no such run.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise exceptions.InvalidStateEdit(
            f"A state edit of workflow run {run_id} needs a reason (who reads the timeline "
            "later learns why the state changed); nothing was changed.")
    with transaction.atomic():
        # Live step rows first (a finishing worker's lock order): no step is claimed while
        # the edit is checked and written.
        run = rows.lock_run(run_id, steps_first=True)
        edit = _edited(run, patch)
        now = timezone.now()
        _fence_claims(run.pk, now)
        WorkflowRun.objects.filter(pk=run.pk).update(
            state=edit.state, updated_at=now, revision=F("revision") + 1)
        Event.objects.create(
            run_id=run.pk, kind="state_edited", data={
                "by": actor, "reason": reason.strip(), "patch": patch,
                "changes": edit.changes, "state": edit.state,
                "at_step": run.current_step, "status": run.status})
    return edit


#: How far an edit moves its run's due pending step rows ahead: more than the clocks of the
#: site's hosts disagree, far less than anything a person notices (a resume or retry sets
#: them due at once anyway).
CLAIM_FENCE = timedelta(seconds=30)


def _fence_claims(run_id: int, now: datetime) -> None:
    """Write the run's due pending step rows, moving them ``CLAIM_FENCE`` ahead.

    A claim statement that read the run as running before it was paused may be waiting on
    those rows' locks (held here): under READ COMMITTED it then re-checks only the step
    row, not the run it read before, and would claim the step with the state from before
    the edit. A row this transaction wrote is re-checked as written, and is not due at the
    waiting claim's time, so that claim takes nothing.
    """
    StepRun.objects.filter(run_id=run_id, kind="step", status=StepStatus.PENDING,
                           available_at__lt=now + CLAIM_FENCE).update(
        available_at=now + CLAIM_FENCE)


def _edited(run: WorkflowRun, patch: Any) -> StateEdit:
    """The checked edit of ``run`` by ``patch`` (see :func:`edit_state`'s errors)."""
    if run.status not in EDITABLE:
        raise exceptions.InvalidTransition(
            run.pk, f"Cannot edit the state of workflow run {run.pk}: it is {run.status}; "
            "only a paused or failed run's state can be edited (pause it first).")
    running = (StepRun.objects.filter(run_id=run.pk, status=StepStatus.PROCESSING)
               .values_list("step_name", flat=True).first())
    if running is not None:
        raise exceptions.InvalidTransition(
            run.pk, f"Cannot edit the state of workflow run {run.pk}: its step {running!r} is "
            "still running and would merge its output over the edit; wait for it to finish "
            "and edit then.")
    if run.cleanup:
        raise exceptions.InvalidTransition(
            run.pk, f"Cannot edit the state of workflow run {run.pk}: its compensations "
            "already ran, so it can never run again.")
    state_patch.check_patch(patch)
    before = dict(run.state or {})
    after = state_patch.apply_patch(before, patch)
    changes = state_patch.diff(before, after)
    if not changes:
        raise exceptions.InvalidStateEdit(
            f"The patch changes nothing in workflow run {run.pk}'s state; nothing was "
            "changed.")
    limit = load_spec(run.definition_id).budget.max_state_bytes
    if limit is not None:
        size = budgets.state_bytes(after)
        if size > limit:
            raise exceptions.InvalidStateEdit(
                f"The edited state of workflow run {run.pk} would be {size} bytes, over its "
                f"workflow's max_state_bytes budget of {limit}; nothing was changed.")
    return StateEdit(run.pk, after, changes)
