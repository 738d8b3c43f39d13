"""What moving a run onto another definition does (``queuety.core.moves``): a table of where
runs stand against what they map to, the step map's checks, and the state diff. No database."""

from __future__ import annotations

import pytest

import queuety
from queuety.core import moves
from tests import workflows

OLD = (queuety.workflow("moves").then(workflows.step_a).wait_for_approval(name="review")
       .delay(seconds=5, name="nap").parallel([workflows.step_b, workflows.step_c], name="fan")
       .wait_for_signal("paid", name="payment").then(workflows.step_c)).build()
NEW = (queuety.workflow("moves").then(workflows.step_a).then(workflows.step_b, name="audit")
       .wait_for_approval(name="review").wait_for_decision(name="payment")
       .then(workflows.step_c, name="nap")).build()


def decide(step, status="running", processing=False, step_map=None):
    return moves.decide(OLD, NEW, status=status, current_step=OLD.index_of(step),
                        step_map=step_map or {}, processing=processing)


@pytest.mark.parametrize(("step", "status", "processing", "action", "target", "words"), [
    # At rest: a task not started moves now, running or paused.
    ("step_a", "running", False, moves.NOW, "step_a", "moves now"),
    ("step_a", "paused", False, moves.NOW, "step_a", "moves now"),
    # Mid-step: an attempt running, a delay sleeping, a fan-out joining.
    ("step_a", "running", True, moves.AT_BOUNDARY, None, "attempt of 'step_a'"),
    ("step_a", "paused", True, moves.AT_BOUNDARY, None, "attempt of 'step_a'"),
    ("nap", "running", False, moves.AT_BOUNDARY, None, "its delay at 'nap' ends"),
    ("fan", "running", False, moves.AT_BOUNDARY, None, "its fan-out at 'fan' joins"),
    # A wait is kept in place only onto the same kind of wait, the same signals.
    ("review", "waiting_for_signal", False, moves.IN_PLACE, "review", "keeps its wait"),
    ("review", "paused", False, moves.IN_PLACE, "review", "keeps its wait"),
    ("payment", "waiting_for_signal", False, moves.CANNOT, None,
     "waits for a decision (approval, rejection) instead"),
    # Finished runs and unmapped steps do not move.
    ("step_a", "completed", False, moves.CANNOT, None, "only live runs move"),
    ("step_a", "failed", False, moves.CANNOT, None, "only live runs move"),
])
def test_decide(step, status, processing, action, target, words):
    if step == "fan":  # "fan" is not in NEW: map it, as a caller would
        verdict = decide(step, status, processing, {"fan": "audit"})
    else:
        verdict = decide(step, status, processing)
    assert verdict.action == action, verdict
    assert words in verdict.reason
    assert verdict.target == (None if target is None else NEW.index_of(target))
    assert verdict.moves == (action != moves.CANNOT)


def test_an_unmapped_step_cannot_move_and_the_reason_shows_the_step_map_to_give():
    verdict = decide("fan")
    assert verdict.action == moves.CANNOT
    assert "'fan' is not a step of the new definition" in verdict.reason
    assert "step_map={'fan':" in verdict.reason


def test_a_wait_mapped_onto_a_task_cannot_move():
    verdict = decide("review", "waiting_for_signal", step_map={"review": "nap"})
    assert verdict.action == moves.CANNOT
    assert "'nap', the step it maps to, is a task, not a wait" in verdict.reason


def test_waits_on_other_runs_move_at_their_boundary():
    parent = (queuety.workflow("parent").run_workflow(
        "kid", queuety.workflow("kid").then(workflows.step_a))).build()
    verdict = moves.decide(parent, parent, status="waiting_for_workflows", current_step=0,
                           step_map={}, processing=False)
    assert verdict.action == moves.AT_BOUNDARY and "the runs it waits for" in verdict.reason


def test_check_step_map_names_the_unknown_side_and_lists_the_steps():
    moves.check_step_map([OLD], NEW, {"fan": "audit"})  # fine
    with pytest.raises(queuety.InvalidMigration, match="names 'ghost'.*their steps are fan"):
        moves.check_step_map([OLD], NEW, {"ghost": "audit"})
    with pytest.raises(queuety.InvalidMigration, match="maps onto 'nowhere'.*its steps are "
                                                        "step_a, audit, review"):
        moves.check_step_map([OLD], NEW, {"fan": "nowhere"})
    moves.check_step_map([], NEW, {"anything": "audit"})  # no runs: keys cannot be checked


def test_index_map_maps_positions_by_name_and_step_map():
    assert moves.index_map(OLD, NEW, {}) == {0: 0, 1: 2, 2: 4, 4: 3}
    assert moves.index_map(OLD, NEW, {"fan": "audit", "nap": "review"}) == \
        {0: 0, 1: 2, 2: 2, 3: 1, 4: 3}


def test_state_diff():
    assert moves.state_diff({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "d": 4}) == {
        "added": {"d": 4}, "removed": ["c"], "changed": {"b": [2, 5]}}
    assert moves.state_diff({"a": 1}, {"a": 1}) == {"added": {}, "removed": [], "changed": {}}
