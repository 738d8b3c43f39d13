"""``retry(from_step=)`` and loop counters (queuety.core.flow.loops_from): a loop that starts
after the step retried from is entered afresh; a loop the step is inside keeps its count."""

from __future__ import annotations

import queuety
from queuety.core import flow


def step(state):
    return {}


def nested():
    # outer loop: a .. repeat_outer (index 5) back to "a"; inner loop: c .. repeat_inner
    # (index 3) back to "c".
    return (queuety.workflow("loops_from").then(step, name="a").then(step, name="b")
            .then(step, name="c").repeat_until("c", state_key="inner_done", name="inner")
            .then(step, name="d").repeat_until("a", state_key="outer_done", name="outer")
            .build())


def test_a_loop_that_starts_after_the_step_is_reset_and_one_around_it_kept():
    spec = nested()
    loops = {"3": 2, "5": 4}
    assert flow.loops_from(spec, spec.index_of("b"), loops) == {"5": 4}
    assert flow.loops_from(spec, spec.index_of("c"), loops) == loops  # inside both loops
    assert flow.loops_from(spec, spec.index_of("a"), loops) == {"5": 4}
    assert flow.loops_from(spec, spec.index_of("d"), {"5": 4}) == {"5": 4}
