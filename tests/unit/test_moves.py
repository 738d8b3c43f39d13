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
    """Decide for a run of OLD at ``step``."""
    return moves.decide(OLD, NEW, status=status, current_step=OLD.index_of(step),
                        step_map=step_map or {}, processing=processing)


@pytest.mark.parametrize(
    ("step", "status", "processing", "step_map", "action", "target", "words"), [
        # At rest: a task not started moves now, running or paused.
        ("step_a", "running", False, {}, moves.NOW, "step_a", "moves now"),
        ("step_a", "paused", False, {}, moves.NOW, "step_a", "moves now"),
        # Mid-step: it moves when the step ends, onto its next step (in order), mapped.
        ("step_a", "running", True, {}, moves.AT_BOUNDARY, "review", "attempt of 'step_a'"),
        ("step_a", "paused", True, {}, moves.AT_BOUNDARY, "review", "attempt of 'step_a'"),
        ("fan", "running", False, {}, moves.AT_BOUNDARY, "payment",
         "its fan-out at 'fan' joins"),
        ("nap", "running", False, {"fan": "audit"}, moves.AT_BOUNDARY, "audit",
         "its delay at 'nap' ends"),
        # ... so the step it is in need not map, but the next one must.
        ("nap", "running", False, {}, moves.CANNOT, None,
         "its next step, and that step 'fan' is not a step of the new definition"),
        ("step_c", "running", True, {}, moves.CANNOT, None, "is its last"),
        # A wait is kept in place only onto the same kind of wait, the same signals.
        ("review", "waiting_for_signal", False, {}, moves.IN_PLACE, "review", "keeps its wait"),
        ("review", "paused", False, {}, moves.IN_PLACE, "review", "keeps its wait"),
        ("payment", "waiting_for_signal", False, {}, moves.CANNOT, None,
         "waits for a decision (approval, rejection) instead"),
        # Finished runs do not move.
        ("step_a", "completed", False, {}, moves.CANNOT, None, "only live runs move"),
        ("step_a", "failed", False, {}, moves.CANNOT, None, "only live runs move"),
    ])
def test_decide(step, status, processing, step_map, action, target, words):
    verdict = decide(step, status, processing, step_map)
    assert verdict.action == action, verdict
    assert words in verdict.reason
    assert verdict.target == (None if target is None else NEW.index_of(target))
    assert verdict.moves == (action != moves.CANNOT)


def test_an_unmapped_step_cannot_move_and_the_reason_shows_the_step_map_to_give():
    # A task at rest that NEW lacks (OLD's last step, step_c, is "nap" there).
    verdict = moves.decide(OLD, NEW, status="running", current_step=OLD.index_of("step_c"),
                           step_map={}, processing=False)
    assert verdict.action == moves.CANNOT
    assert "'step_c' is not a step of the new definition" in verdict.reason
    assert "step_map={'step_c':" in verdict.reason
    verdict = moves.decide(OLD, NEW, status="running", current_step=OLD.index_of("step_c"),
                           step_map={"step_c": "nap"}, processing=False)
    assert verdict.action == moves.NOW and verdict.target == NEW.index_of("nap")


def test_a_wait_mapped_onto_a_task_cannot_move():
    verdict = decide("review", "waiting_for_signal", step_map={"review": "nap"})
    assert verdict.action == moves.CANNOT
    assert "'nap', the step it maps to, is a task, not a wait" in verdict.reason


def test_waits_on_other_runs_move_at_their_boundary_onto_the_same_kind_of_wait():
    kid = queuety.workflow("kid").then(workflows.step_a)
    parent = queuety.workflow("parent").run_workflow("kid", kid).then(workflows.step_b).build()
    again = queuety.workflow("parent").run_workflow("kid", kid).then(workflows.step_c).build()
    verdict = moves.decide(parent, again, status="waiting_for_workflows", current_step=0,
                           step_map={}, processing=False)
    assert verdict.action == moves.AT_BOUNDARY and "the runs it waits for" in verdict.reason
    joined = (queuety.workflow("parent").wait_for_workflows("ids", name="join")
              .then(workflows.step_c)).build()
    onto_task = (queuety.workflow("parent").then(workflows.step_b, name="join")
                 .then(workflows.step_c)).build()
    verdict = moves.decide(joined, onto_task, status="waiting_for_workflows", current_step=0,
                           step_map={}, processing=False)
    assert verdict.action == moves.CANNOT
    assert "is a task step, not a wait_workflows step" in verdict.reason


def test_a_wait_in_another_mode_is_not_the_same_wait():
    both = queuety.workflow("w").wait_for_signals(["a", "b"], name="w").build()
    either = queuety.workflow("w").wait_for_signals(["a", "b"], mode="any", name="w").build()
    assert not moves.same_wait(both.steps[0], either.steps[0])
    assert moves.same_wait(both.steps[0], both.steps[0])


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
