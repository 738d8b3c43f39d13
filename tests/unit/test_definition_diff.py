"""Definition diffs (queuety.core.diff): what changed between two definitions, built with the
builder, compared as the JSON documents the database stores."""

from __future__ import annotations

import json

import pytest

import queuety
from queuety import exceptions
from queuety.core.definition import WorkflowSpec
from queuety.core.diff import FieldChange, StepEntry, StepMove, diff_documents, diff_specs

W = "tests.workflows"


def base() -> queuety.WorkflowBuilder:
    return queuety.workflow("order").version("v1").then(f"{W}.step_a").then(f"{W}.step_b")


def changes_of(groups, step: str) -> list[tuple[str, object, object]]:
    group = next(g for g in groups if g.step == step)
    return [(c.field, c.old, c.new) for c in group.changes]


def test_diff__identical_definitions_give_an_empty_diff():
    diff = diff_specs(base().build(), base().build())

    assert diff.identical and diff.same_workflow
    assert diff.old.hash == diff.new.hash == base().build().definition_hash
    data = diff.to_dict()
    for key in ("workflow_changes", "steps_added", "steps_removed", "steps_moved",
                "options_changed", "handlers_changed", "children_changed"):
        assert data[key] == [], key
    assert diff.rows() == []
    assert diff.to_text().endswith("No differences: the definitions are identical.")


def test_diff__a_step_added_at_the_end():
    diff = diff_specs(base().build(), base().then(f"{W}.step_c").build())

    assert diff.steps_added == (StepEntry(step="step_c", kind="task", position=2),)
    assert not (diff.steps_removed or diff.steps_moved or diff.options_changed
                or diff.handlers_changed or diff.workflow_changes)
    assert not diff.identical
    assert "Steps added:\n  + step_c (task) at position 2" in diff.to_text()


def test_diff__a_step_removed():
    old = base().wait_for_signal("go").then(f"{W}.step_c").build()
    new = base().then(f"{W}.step_c").build()

    diff = diff_specs(old, new)

    assert diff.steps_removed == (StepEntry(step="wait_for_go", kind="wait", position=2),)
    assert diff.steps_moved == (StepMove(step="step_c", old_position=3, new_position=2,
                                         reordered=False),)
    assert not diff.steps_added
    assert "  - wait_for_go (wait), was at position 2" in diff.to_text()
    assert "  step_c: position 3 → 2 (shifted)" in diff.to_text()


def test_diff__moved_steps_tell_a_reorder_from_a_shift():
    old = base().then(f"{W}.step_c").build()                    # step_a, step_b, step_c
    new = (queuety.workflow("order").version("v1").then(f"{W}.step_c")
           .then(f"{W}.step_a").then(f"{W}.step_b").build())    # step_c, step_a, step_b

    diff = diff_specs(old, new)

    assert diff.steps_moved == (
        StepMove(step="step_c", old_position=2, new_position=0, reordered=True),
        StepMove(step="step_a", old_position=0, new_position=1, reordered=False),
        StepMove(step="step_b", old_position=1, new_position=2, reordered=False))
    assert not (diff.steps_added or diff.steps_removed or diff.options_changed)
    assert "  step_c: position 2 → 0 (reordered)" in diff.to_text()


def test_diff__option_changes_per_step_name_the_field_and_both_values():
    old = (queuety.workflow("order")
           .then(f"{W}.step_a", retry=queuety.RetryPolicy(max_attempts=3), timeout=10)
           .then(f"{W}.step_b", cost_units=1)
           .wait_for_signal("go", timeout=60)
           .delay(minutes=5, name="pause")
           .for_each("items", f"{W}.run_task", max_concurrency=2)
           .build())
    new = (queuety.workflow("order")
           .then(f"{W}.step_a", retry=queuety.RetryPolicy(max_attempts=5), timeout=10,
                 queue="io", concurrency_group="openai", rate_limit=(10, 60))
           .then(f"{W}.step_b", cost_units=4)
           .wait_for_signal("go", timeout=120, on_timeout="continue")
           .delay(minutes=10, name="pause")
           .for_each("items", f"{W}.run_task", max_concurrency=8, mode="quorum", quorum=2)
           .build())

    diff = diff_specs(old, new)

    assert changes_of(diff.options_changed, "step_a") == [
        ("retry.max_attempts", 3, 5), ("queue", None, "io"),
        ("concurrency_group", None, "openai"), ("rate_limit", None, [10, 60.0])]
    assert changes_of(diff.options_changed, "step_b") == [("cost_units", 1, 4)]
    assert changes_of(diff.options_changed, "wait_for_go") == [
        ("wait.on_timeout", "fail", "continue"), ("wait.timeout", 60.0, 120.0)]
    assert changes_of(diff.options_changed, "pause") == [("delay_seconds", 300.0, 600.0)]
    assert changes_of(diff.options_changed, "items_for_each") == [
        ("fanout.max_concurrency", 2, 8), ("fanout.mode", "all", "quorum"),
        ("fanout.quorum", None, 2)]
    assert not (diff.handlers_changed or diff.steps_added or diff.steps_moved)
    text = diff.to_text()
    assert "Options changed:\n  step_a:\n    retry.max_attempts: 3 → 5\n" in text
    assert "    queue: unset → \"io\"\n" in text


def test_diff__routes_and_a_changed_kind_are_options():
    routed = {"left": "step_b", queuety.DEFAULT: "step_b"}
    old = (queuety.workflow("order").route(f"{W}.classify", routed, name="router")
           .then(f"{W}.step_b").then(f"{W}.step_c", name="last").build())
    new = (queuety.workflow("order")
           .route(f"{W}.classify", {**routed, "right": "last"}, name="router")
           .then(f"{W}.step_b").wait_for_signal("go", name="last").build())

    diff = diff_specs(old, new)

    assert changes_of(diff.options_changed, "router") == [("routes.right", None, "last")]
    last = changes_of(diff.options_changed, "last")
    assert last[0] == ("kind", "task", "wait")
    assert last[1:] == [("cost_units", 1, 0), ("wait.mode", None, "all"),
                        ("wait.signals", None, ["go"])]
    assert changes_of(diff.handlers_changed, "last") == [("handler", f"{W}.step_c", "")]


def test_diff__handler_changes_cover_every_handler_a_step_names():
    old = (queuety.workflow("order")
           .then(f"{W}.step_a").compensate_with(f"{W}.undo")
           .parallel([f"{W}.step_a", f"{W}.step_b"], name="fan")
           .for_each("items", f"{W}.run_task", reducer=f"{W}.summarise", name="each")
           .repeat_until("step_a", condition=f"{W}.counter_at_least_3", name="again")
           .build())
    new = (queuety.workflow("order")
           .then(f"{W}.StepB", name="step_a").compensate_with(f"{W}.broken_undo")
           .parallel([f"{W}.step_a", f"{W}.step_c"], name="fan")
           .for_each("items", f"{W}.occupy_item", reducer=None, name="each")
           .repeat_until("step_a", condition=f"{W}.always", name="again")
           .build())

    diff = diff_specs(old, new)

    assert changes_of(diff.handlers_changed, "step_a") == [
        ("handler", f"{W}.step_a", f"{W}.StepB"),
        ("compensation", f"{W}.undo", f"{W}.broken_undo")]
    assert changes_of(diff.handlers_changed, "fan") == [
        ("fanout.branches[1]", f"{W}.step_b", f"{W}.step_c")]
    assert changes_of(diff.handlers_changed, "each") == [
        ("handler", f"{W}.run_task", f"{W}.occupy_item"),
        ("fanout.reducer", f"{W}.summarise", None)]
    assert changes_of(diff.handlers_changed, "again") == [
        ("repeat.condition", f"{W}.counter_at_least_3", f"{W}.always")]
    assert not diff.options_changed  # a handler is not an option
    text = diff.to_text()
    assert (f"Handlers changed:\n  step_a:\n    handler: {W}.step_a → {W}.StepB\n"
            f"    compensation: {W}.undo → {W}.broken_undo\n") in text
    assert f"    fanout.reducer: {W}.summarise → none\n" in text


def test_diff__a_parallel_branch_added_is_a_handler_change_at_its_position():
    old = queuety.workflow("order").parallel([f"{W}.step_a", f"{W}.step_b"], name="fan")
    new = queuety.workflow("order").parallel([f"{W}.step_a", f"{W}.step_b", f"{W}.step_c"],
                                             name="fan")

    diff = diff_specs(old.build(), new.build())

    assert changes_of(diff.handlers_changed, "fan") == [
        ("fanout.branches[2]", None, f"{W}.step_c")]
    assert changes_of(diff.options_changed, "fan") == [("cost_units", 2, 3)]


def test_diff__workflow_level_changes():
    old = base().max_transitions(10).build()
    new = (queuety.workflow("order").version("v2").max_transitions(20).max_cost_units(5)
           .retry(max_attempts=7).on_queue("llm").with_priority("high")
           .must_complete_within(minutes=5).on_deadline(f"{W}.hook").on_cancel(f"{W}.hook")
           .compensate_on_failure().prune_state_after(3)
           .then(f"{W}.step_a").then(f"{W}.step_b").build())

    diff = diff_specs(old, new)

    fields = [(c.field, c.old, c.new) for c in diff.workflow_changes]
    assert fields[:3] == [("version", "v1", "v2"), ("budget.max_cost_units", None, 5),
                          ("budget.max_transitions", 10, 20)]
    assert ("retry.max_attempts", None, 7) in fields and ("retry.max_delay", None, 60.0) in fields
    for change in (("deadline_seconds", None, 300.0), ("queue", None, "llm"),
                   ("priority", None, "high"), ("compensate_on_failure", False, True),
                   ("prune_state_after", None, 3), ("on_cancel", None, f"{W}.hook"),
                   ("on_deadline", None, f"{W}.hook")):
        assert change in fields, change
    assert not (diff.steps_added or diff.options_changed or diff.handlers_changed)
    text = diff.to_text()
    assert 'Workflow:\n  version: "v1" → "v2"\n' in text
    assert f"  on_cancel: none → {W}.hook\n" in text


def test_diff__a_child_workflow_is_diffed_as_a_workflow_of_its_own():
    def parent(child):
        return queuety.workflow("order").then(f"{W}.step_a").run_workflow("ship", child)

    old = parent(queuety.workflow("x").then(f"{W}.step_a").then(f"{W}.step_b"))
    new = parent(queuety.workflow("x").then(f"{W}.step_c", name="step_a", timeout=5))

    diff = diff_specs(old.build(), new.build())

    (child,) = diff.children_changed
    assert child.step == "ship" and child.diff.same_workflow
    assert child.diff.steps_removed == (StepEntry(step="step_b", kind="task", position=1),)
    assert changes_of(child.diff.handlers_changed, "step_a") == [
        ("handler", f"{W}.step_a", f"{W}.step_c")]
    assert changes_of(child.diff.options_changed, "step_a") == [("timeout", None, 5)]
    assert not (diff.options_changed or diff.handlers_changed)
    assert [(r.change, r.step, r.field, r.before, r.after) for r in diff.rows()] == [
        ("removed", "ship › step_b", "", "task step at position 1", ""),
        ("option", "ship › step_a", "timeout", "unset", "5.0"),
        ("handler", "ship › step_a", "handler", f"{W}.step_a", f"{W}.step_c")]
    assert ("Child workflows changed:\n  ship (workflow 'ship'):\n    Steps removed:\n"
            "      - step_b (task), was at position 1\n") in diff.to_text()


def test_diff__definitions_of_two_workflows_say_so():
    other = queuety.workflow("invoice").version("v1").then(f"{W}.step_a").then(f"{W}.step_b")

    diff = diff_specs(base().build(), other.build())

    assert not diff.same_workflow and not diff.identical
    assert diff.to_dict()["same_workflow"] is False
    assert (diff.old.name, diff.new.name) == ("order", "invoice")
    assert [(c.field, c.old, c.new) for c in diff.workflow_changes] == [
        ("name", "order", "invoice")]
    assert diff.steps_added == diff.steps_removed == diff.options_changed == ()
    assert "two different workflows, 'order' and 'invoice'" in diff.to_text()
    assert 'Workflow:\n  name: "order" → "invoice"' in diff.to_text()


def test_diff__a_document_that_no_longer_loads_is_still_diffable():
    # A deploy removed the exception class its retry policy names: it does not load as a spec.
    stored = base().build().to_dict()
    stored["steps"][1]["retry"] = {"max_attempts": 2, "initial_delay": 1.0,
                                   "backoff_factor": 2.0, "max_delay": 60.0, "jitter": 0.0,
                                   "retry_on": ["gone.module.Flaky"]}
    with pytest.raises((exceptions.WorkflowDefinitionError, ImportError, ValueError)):
        WorkflowSpec.from_dict(stored)

    diff = diff_documents(stored, base().build().to_dict(), old_id=3, new_id=9,
                          old_hash="e" * 64)

    assert changes_of(diff.options_changed, "step_b") == [
        ("retry.backoff_factor", 2.0, None), ("retry.initial_delay", 1.0, None),
        ("retry.jitter", 0.0, None), ("retry.max_attempts", 2, None),
        ("retry.max_delay", 60.0, None), ("retry.retry_on", ["gone.module.Flaky"], None)]
    assert (diff.old.id, diff.old.hash, diff.new.id) == (3, "e" * 64, 9)
    assert diff.new.hash == base().build().definition_hash
    assert diff.to_text().startswith("From: definition 3 of 'order' (version 'v1', hash "
                                     "eeeeeeeeeeee)\nTo:   definition 9 of 'order'")


def test_diff__to_dict_is_json_ready_and_complete():
    new = base().max_transitions(5).then(f"{W}.step_c").build()

    data = json.loads(json.dumps(diff_specs(base().build(), new).to_dict()))

    assert data["old"] == {"id": None, "name": "order", "version": "v1",
                           "hash": base().build().definition_hash}
    assert data["workflow_changes"] == [{"field": "budget.max_transitions", "old": None,
                                         "new": 5}]
    assert data["steps_added"] == [{"step": "step_c", "kind": "task", "position": 2}]
    assert data["identical"] is False and data["same_workflow"] is True


def test_field_change__values_render_compactly_and_are_cut():
    long = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(20)}}
    old = queuety.workflow("order").wait_for_input(schema=None, name="ask").build()
    new = queuety.workflow("order").wait_for_input(schema=long, name="ask").build()

    diff = diff_specs(old, new)

    assert FieldChange(field="wait.schema", old=None, new=long) in \
        diff.options_changed[0].changes
    line = next(line for line in diff.to_text().splitlines() if "wait.schema" in line)
    assert line.startswith("    wait.schema: unset → {") and line.endswith("…")
