"""The pure rules of chains (and the job layer's other compositions)."""

from __future__ import annotations

import pytest

import queuety
from queuety.core import dependencies
from queuety.jobs import batches, chain_link, chains
from tests import job_tasks


def test_link_step_names__carry_the_links_index():
    assert chain_link.step_name(3, "send") == "link3_send"
    assert chain_link.index_of("link12_send_receipt") == 12
    with pytest.raises(ValueError, match="'send' is not a chain link's step"):
        chain_link.index_of("send")


def test_link_arguments__the_chains_for_the_first_the_previous_return_value_after():
    state = {"args": ["t", 1], "kwargs": {"k": 2}, "link_results": [{"a": 1}, [2]]}

    assert chain_link.link_arguments(state, 0) == (["t", 1], {"k": 2})
    assert chain_link.link_arguments(state, 1) == ([{"a": 1}], {})
    assert chain_link.link_arguments(state, 2) == ([[2]], {})


def test_chain__refuses_what_it_cannot_run_naming_it():
    with pytest.raises(TypeError, match="at least one task"):
        queuety.chain()
    with pytest.raises(TypeError, match="takes tasks .* not <function not_a_task"):
        queuety.chain(job_tasks.chain_start, job_tasks.not_a_task)
    with pytest.raises(TypeError, match="tests.job_tasks.attempts takes a context"):
        queuety.chain(job_tasks.attempts)
    with pytest.raises(TypeError, match="tests.job_tasks.attempts takes a context"):
        queuety.chain(job_tasks.chain_start, job_tasks.attempts, catch=job_tasks.chain_catch)
    with pytest.raises(TypeError, match="takes tasks"):
        queuety.chain(job_tasks.chain_start, catch="tests.job_tasks.chain_catch")


def test_chain__takes_async_links_and_a_catch_that_takes_a_context():
    assert queuety.chain(job_tasks.chain_start, job_tasks.chain_double_async).tasks
    # A catch is a job of its own, with a TaskResult of its own.
    assert queuety.chain(job_tasks.chain_start, catch=job_tasks.attempts).catch is not None


def test_chain_result__return_value_only_once_completed():
    done = chains.ChainResult(id="7", status="completed", total=2, done=2, results=[1, 2],
                              error=None)
    running = chains.ChainResult(id="8", status="running", total=2, done=1, results=[1],
                                 error=None)

    assert done.return_value == 2 and done.is_finished and not running.is_finished
    with pytest.raises(ValueError, match="Chain 8 has not completed"):
        _ = running.return_value


def test_chain_spec__one_step_per_task_with_its_queue_and_priority():
    spec = chains.spec_of((job_tasks.chain_start, job_tasks.urgent,
                            job_tasks.chain_double.using(queue_name="io")))

    assert spec.name == "chain:tests.job_tasks.chain_start+2"
    assert [step.name for step in spec.steps] == [
        "link0_chain_start", "link1_urgent", "link2_chain_double"]
    assert [step.handler for step in spec.steps] == [chain_link.HANDLER] * 3


# -- batches ------------------------------------------------------------------------------------

def test_batch__refuses_what_it_cannot_run_naming_it():
    with pytest.raises(TypeError, match="non-empty list of jobs"):
        queuety.batch([])
    with pytest.raises(TypeError, match="Item 1 of queuety.batch\\(\\) is 'x'"):
        queuety.batch([job_tasks.add, "x"])
    with pytest.raises(TypeError, match="Item 0 of queuety.batch\\(\\) has arguments of the"):
        queuety.batch([(job_tasks.add, "t", {})])
    with pytest.raises(TypeError, match="Item 0 of queuety.batch\\(\\) is not a task"):
        queuety.batch([(job_tasks.not_a_task, ["t"])])
    with pytest.raises(TypeError, match="queuety.batch\\(\\)'s finally_ is not a task"):
        queuety.batch([job_tasks.add], finally_=job_tasks.not_a_task)


def test_batch_result__progress_and_pending():
    result = batches.BatchResult(id="5", status="waiting_for_workflows", total=8, done=3,
                                 failed=1, job_ids=[], failed_job_ids=[])

    assert (result.pending, result.progress, result.is_finished) == (4, 50, False)


def test_settled_wait__goes_on_when_every_run_finished_either_way_merging_nothing():
    spec = dependencies.WaitWorkflowsSpec(state_key="ids", mode="settled")
    keyed = dependencies.WaitWorkflowsSpec(state_key="ids", mode="settled", result_key="r")
    runs = {1: ("completed", {"a": 1}), 2: ("failed", {"b": 2}), 3: ("running", {})}

    pending = dependencies.evaluate(spec, [1, 2, 3], runs)
    assert pending.verdict == "pending" and pending.details == {
        "matched": [1], "failed": [2], "remaining": [3]}
    runs[3] = ("cancelled", {})
    done = dependencies.evaluate(spec, [1, 2, 3, 4], runs)   # 4: gone, counts as failed
    assert done.verdict == "satisfied" and done.output == {} and done.failed == [2, 3, 4]
    assert dependencies.evaluate(keyed, [1, 2], runs).output == {"r": {"1": {"a": 1}}}


# -- throttling after exceptions ----------------------------------------------------------------

def test_hold_for__only_at_max_failures_until_the_oldest_leaves_the_window():
    from datetime import datetime, timedelta, timezone

    from queuety.jobs import throttle

    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    oldest = now - timedelta(seconds=50)

    assert throttle.hold_for(9, oldest, 10, 60, now) is None
    assert throttle.hold_for(10, oldest, 10, 60, now) == pytest.approx(10.05)
    assert throttle.hold_for(12, now - timedelta(seconds=61), 10, 60, now) == \
        pytest.approx(0.05)
    assert throttle.ledger_group("smtp") == "throttle-exceptions:smtp"


@pytest.mark.parametrize(("options", "message"), [
    ({"throttle_exceptions": (0, 60)}, "must be \\(max_failures, window_seconds\\)"),
    ({"throttle_exceptions": (3, 0)}, "got \\(3, 0\\)"),
    ({"throttle_exceptions": (3, 7200)}, "up to 3600"),
    ({"throttle_exceptions": 3}, "such as \\(10, 600\\)"),
    ({"throttle_exceptions": (3, 60), "throttle_key": " "}, "throttle_key must be a non-blank"),
    ({"throttle_key": "smtp"}, "throttle_key without throttle_exceptions"),
])
def test_throttle_options__bad_values_are_refused_naming_the_option(options, message):
    from queuety import exceptions
    from queuety.jobs import options as job_options

    with pytest.raises(exceptions.WorkflowDefinitionError, match=message):
        job_options.check(options, "job_options()")


def test_throttle_options__a_settings_pair_is_accepted_and_picks_the_throttled_step():
    from queuety.jobs import options as job_options
    from queuety.jobs import specs

    checked = job_options.check({"throttle_exceptions": [5, 60]}, "TASKS['x']['OPTIONS']")
    assert checked["throttle_exceptions"] == (5, 60)
    spec = specs.spec_for(job_tasks.add, {}, throttled=True)
    assert spec.steps[0].handler == "queuety.jobs.throttle.call_throttled"
    assert specs.spec_for(job_tasks.async_add, {}, throttled=True).steps[0].handler == \
        "queuety.jobs.throttle.acall_throttled"
