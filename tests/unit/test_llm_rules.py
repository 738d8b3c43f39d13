"""Pure rules of progress reports, prune_state_after and wait timeouts (no services)."""

from __future__ import annotations

from datetime import timedelta

import pytest

import queuety
from queuety.core import pruning, waits
from queuety.core.definition import WorkflowSpec
from queuety.core.handlers import StepContext
from queuety.core.progress import check_progress, progress_text
from tests import workflows


def test_progress_text__done_over_total_percent_and_other_keys():
    assert progress_text({"processed": 450, "total": 1000}) == "450/1000 (45%)"
    assert progress_text({"done": 3.0, "total": 4, "stage": "embed"}) == "3/4 (75%) stage=embed"
    assert progress_text({"percent": 45}) == "45%"
    assert progress_text({"stage": "embedding", "nested": {"a": 1}}) == "stage=embedding"
    assert progress_text(None) == "" and progress_text({}) == ""
    assert progress_text({"done": 0, "total": 0}) == "0/0"


@pytest.mark.parametrize(("progress", "message"), [
    (["done", 1], "reported progress list; report a dict"),
    ({1: "a"}, "report a dict with string keys"),
    ({"x": float("nan")}, "not JSON"),
    ({"x": object()}, "not JSON"),
    ({"x": "y" * 5000}, "5008 bytes of progress; the limit is 4096"),
])
def test_check_progress__refuses_what_is_not_a_small_json_dict(progress, message):
    with pytest.raises(queuety.InvalidProgress, match=message) as caught:
        check_progress(7, "embed", progress, 4096)
    assert "Step 'embed' of run 7" in str(caught.value)


def test_step_context_heartbeat__hands_checked_reports_to_the_worker():
    seen = []
    context = StepContext(1, "wf", "embed", 1, None, seen.append)  # type: ignore[arg-type]
    context.heartbeat(progress={"done": 1, "total": 2})
    context.heartbeat()
    assert seen == [{"done": 1, "total": 2}, None]
    # Outside a worker it only checks.
    StepContext(1, "wf", "embed", 1, None).heartbeat(progress={"ok": True})  # type: ignore[arg-type]
    with pytest.raises(queuety.InvalidProgress):
        StepContext(1, "wf", "embed", 1, None).heartbeat(progress="half")  # type: ignore[arg-type]


def test_pruning__drops_keys_n_transitions_after_their_last_write():
    writes: dict[str, int] = {}
    state = {"payload": True}
    history = []
    for transition, output in enumerate(
            [{"one": 1}, {"two": 2}, {"three": 3, "one": "again"}, {"four": 4}, {"five": 5}],
            start=1):
        state, writes, pruned = pruning.apply(2, {**state, **output}, writes, output, transition)
        history.append(pruned)
    assert history == [[], [], [], ["two"], ["one", "three"]]
    assert state == {"payload": True, "four": 4, "five": 5}
    assert writes == {"four": 4, "five": 5}


def test_pruning__off_changes_nothing_and_replay_drops_what_an_event_lists():
    state, writes, pruned = pruning.apply(None, {"a": 1}, None, {"a": 1}, 9)
    assert (state, writes, pruned) == ({"a": 1}, {}, [])
    assert pruning.event_data([]) == {}
    assert pruning.replay({"a": 1, "b": 2}, {"pruned": ["a"]}) == {"b": 2}
    assert pruning.replay({"a": 1}, {}) == {"a": 1}


def test_prune_state_after__validated_and_covered_by_the_hash():
    base = queuety.workflow("prune_h").then(workflows.step_a).then(workflows.step_b)
    plain, pruned = base.build(), base.prune_state_after(2).build()
    assert "prune_state_after" not in plain.to_dict()  # older definitions keep their hash
    assert pruned.prune_state_after == 2 and plain.definition_hash != pruned.definition_hash
    assert base.prune_state_after(3).build().definition_hash != pruned.definition_hash
    assert base.prune_state_after().build().prune_state_after == 2
    assert WorkflowSpec.from_dict(pruned.to_dict()) == pruned
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(queuety.WorkflowDefinitionError,
                           match="prune_state_after of workflow 'prune_h' must be a whole"):
            base.prune_state_after(bad).build()


def test_wait_timeout__builder_takes_timedelta_or_seconds_and_the_hash_covers_it():
    base = queuety.workflow("timed").then(workflows.step_a)
    spec = base.wait_for_approval(timeout=timedelta(minutes=5), on_timeout="continue").build()
    wait = spec.steps[1].wait
    assert (wait.timeout, wait.on_timeout) == (300.0, "continue")
    assert base.wait_for_approval(timeout=300).build().steps[1].wait.on_timeout == "fail"
    untimed = base.wait_for_approval().build()
    assert "timeout" not in untimed.steps[1].to_dict()["wait"]
    assert len({untimed.definition_hash, spec.definition_hash,
                base.wait_for_approval(timeout=300).build().definition_hash}) == 3
    assert WorkflowSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"timeout": 0}, "timeout of wait 'wait_for_approval' must be a positive timedelta"),
    ({"timeout": timedelta(seconds=-1)}, "must be a positive timedelta"),
    ({"timeout": "5m"}, "must be a positive timedelta"),
    ({"on_timeout": "continue"}, "on_timeout='continue' is given without a timeout"),
    ({"timeout": 5, "on_timeout": ""}, "on_timeout must be 'fail', 'continue' or the name"),
])
def test_wait_timeout__bad_options_name_what_is_wrong(kwargs, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        queuety.workflow("bad").wait_for_approval(**kwargs).build()


def test_wait_timeout__jump_target_must_be_a_step_and_counts_as_reachable():
    with pytest.raises(queuety.WorkflowDefinitionError,
                       match="on_timeout='escalate', which is neither 'fail', 'continue' nor"):
        queuety.workflow("jump").wait_for_input(timeout=5, on_timeout="escalate") \
            .then(workflows.step_a).build()
    spec = (queuety.workflow("jump").route(workflows.step_a, {"x": "review"}, name="pick")
            .wait_for_input(name="review", timeout=5, on_timeout="escalate")
            .route(workflows.step_b, {"y": "review"}, name="after")
            .then(workflows.step_c, name="escalate").build())
    assert spec.steps[1].wait.timeout_target == "escalate"


def test_timeout_output__what_continue_records():
    decision = queuety.workflow("d").wait_for_decision(timeout=1).build().steps[0].wait
    assert waits.timeout_output(decision) == {
        "decision": {"outcome": "timed_out", "signal": None, "data": None}}
    approval = queuety.workflow("a").wait_for_approval(timeout=1).build().steps[0].wait
    assert waits.timeout_output(approval) == {"approval": None}
    bare = queuety.workflow("s").wait_for_signal("go", timeout=1).build().steps[0].wait
    assert waits.timeout_output(bare) == {}
