"""RetryPolicy: validation, bounded jitter, computable worst case, isinstance scoping."""

from __future__ import annotations

import random
import statistics

import pytest

import queuety
from queuety.core.retry import NO_RETRY, RetryPolicy


class ConnectionError(Exception):  # noqa: A001 - same name as the builtin, unrelated class
    """Stands in for requests.exceptions.ConnectionError, which is no builtin subclass."""


@pytest.mark.parametrize("options, problem", [
    ({"max_attempts": 0}, "max_attempts must be an integer of at least 1 (got 0)"),
    ({"max_attempts": -1}, "max_attempts must be an integer of at least 1 (got -1)"),
    ({"max_attempts": 2.5}, "max_attempts must be an integer"),
    ({"initial_delay": -1}, "initial_delay must be 0 or more seconds (got -1)"),
    ({"initial_delay": 10, "max_delay": 5}, "max_delay (5) must not be less than initial_delay"),
    ({"backoff_factor": 0.5}, "backoff_factor must be at least 1 (got 0.5)"),
    ({"jitter": -0.5}, "jitter must be between 0 and 0.25 (got -0.5)"),
    ({"jitter": 1.0}, "jitter must be between 0 and 0.25 (got 1.0)"),
    ({"jitter": 2.0}, "jitter must be between 0 and 0.25"),
])
def test_policy__invalid_options_fail_the_definition(options, problem):
    with pytest.raises(queuety.WorkflowDefinitionError, match=problem.replace("(", r"\(")
                       .replace(")", r"\)")):
        RetryPolicy(**options)


def test_R4_every_invalid_option_is_refused(semantics):
    refused = 0
    cases = [{"max_attempts": 0}, {"max_attempts": -1}, {"initial_delay": -1},
             {"initial_delay": 10, "max_delay": 5}, {"backoff_factor": 0.5},
             {"jitter": -0.5}, {"jitter": 2.0}]
    for options in cases:
        try:
            RetryPolicy(**options)
        except queuety.WorkflowDefinitionError:
            refused += 1
    semantics.record("R4 invalid policies (max_attempts 0/-1, delay -1, max<initial, factor "
                     "0.5, jitter -0.5/2.0)", f"{len(cases)}/{len(cases)} refused",
                     f"{refused}/{len(cases)} refused")
    assert refused == len(cases)


@pytest.mark.parametrize("entry, problem", [
    ("ConectionError", "'ConectionError' cannot be imported"),
    ("builtins.ConectionError", "'builtins.ConectionError' cannot be imported"),
    ("json.dumps", "is not an exception class"),
    (int, "is not an exception class"),
])
def test_policy__retry_on_names_are_resolved_when_built(entry, problem, semantics):
    with pytest.raises(queuety.WorkflowDefinitionError, match=problem) as refused:
        RetryPolicy(retry_on=[entry])
    if entry == "ConectionError":
        semantics.record("S2 retry_on=['ConectionError'] (typo)", "build fails naming the string",
                         f"WorkflowDefinitionError: {refused.value}")


def test_policy__dotted_strings_resolve_to_the_same_classes():
    assert RetryPolicy(retry_on=["builtins.ConnectionError", "queuety.StepTimeout"]).retry_on \
        == (__builtins__["ConnectionError"] if isinstance(__builtins__, dict)
            else __builtins__.ConnectionError, queuety.StepTimeout)


def test_policy__exact_backoff_without_jitter():
    policy = RetryPolicy(max_attempts=5, initial_delay=1, backoff_factor=2, jitter=0)
    assert [policy.delay(n) for n in range(1, 5)] == [1.0, 2.0, 4.0, 8.0]
    assert policy.max_total_wait() == 15.0


def test_policy__max_total_wait_is_the_sum_of_upper_bounds(semantics):
    policy = RetryPolicy(max_attempts=5, initial_delay=1, backoff_factor=2, jitter=0.1)
    semantics.record("R3 max_total_wait(), 5 attempts, delay 1, factor 2, jitter 0.1",
                     "16.5 s", f"{policy.max_total_wait():g} s")
    assert policy.max_total_wait() == pytest.approx(16.5)
    assert RetryPolicy().max_total_wait() == pytest.approx(3.3)  # 1.1 + 2.2
    assert RetryPolicy(max_attempts=1).max_total_wait() == 0
    # T5: 3 attempts of a 2 s timeout with a 1.5 s hard-stop allowance, waits 1 + 2.
    timed = RetryPolicy(max_attempts=3, initial_delay=1, jitter=0)
    assert timed.max_total_time(timeout=2, grace=1.5) == pytest.approx(13.5)


@pytest.mark.parametrize("policy", [
    RetryPolicy(max_attempts=9, jitter=0.1),
    RetryPolicy(max_attempts=9, jitter=0.25, initial_delay=0.3, backoff_factor=3, max_delay=200),
])
def test_policy__jitter_is_bounded_and_centred(policy, semantics):
    rng = random.Random(20261130)
    worst_mean = 0.0
    for attempt in range(1, 9):
        nominal = policy.nominal_delay(attempt)
        draws = [policy.delay(attempt, rng) for _ in range(10_000)]
        assert min(draws) >= (1 - policy.jitter) * nominal - 1e-9
        assert max(draws) <= min((1 + policy.jitter) * nominal, policy.max_delay) + 1e-9
        assert statistics.fmean(draws) == pytest.approx(nominal, rel=0.03)
        assert min(draws) > 0
        worst_mean = max(worst_mean, abs(statistics.fmean(draws) / nominal - 1))
    semantics.record(f"R2 jitter {policy.jitter:g}, 10,000 draws x attempts 1-8",
                     "every wait in [(1-j)w, min((1+j)w, max_delay)]; mean within 3 %; no 0 s",
                     f"all inside; worst mean deviation {worst_mean:.2%}; no 0 s")


def test_policy__defaults_are_documented_values():
    default = RetryPolicy()
    assert (default.max_attempts, default.initial_delay, default.backoff_factor,
            default.max_delay, default.jitter, default.retry_on) == (3, 1.0, 2.0, 60.0, 0.1, None)
    assert NO_RETRY.retry_on == () and NO_RETRY.max_attempts == 3


def test_should_retry__isinstance_semantics():
    policy = RetryPolicy(max_attempts=4, retry_on=[__import__("builtins").ConnectionError])
    assert policy.should_retry(ConnectionResetError("reset"), 1)      # a subclass: yes
    assert not policy.should_retry(ConnectionError("same name"), 1)   # unrelated class: no
    assert not policy.should_retry(ValueError("other"), 1)
    assert not policy.should_retry(ConnectionResetError("reset"), 4)  # attempts used up


def test_should_retry__timeouts_fit_the_exception_hierarchy():
    assert issubclass(queuety.StepTimeout, TimeoutError)
    timeout = queuety.StepTimeout("late")
    assert RetryPolicy(retry_on=[TimeoutError]).should_retry(timeout, 1)
    assert RetryPolicy(retry_on=[OSError]).should_retry(timeout, 1)   # TimeoutError's base
    assert not RetryPolicy(retry_on=[ConnectionError]).should_retry(timeout, 1)
    assert not RetryPolicy().should_retry(timeout, 1)                 # not named: not retried


def test_should_retry__never_retried_errors_and_worker_loss():
    unscoped = RetryPolicy(max_attempts=5)
    assert unscoped.should_retry(KeyError("x"), 1)
    for error in (queuety.PermanentError("no"), queuety.WorkflowDefinitionError("bad"),
                  queuety.UnknownStep("jump"), queuety.InvalidStepOutput("out")):
        assert not unscoped.should_retry(error, 1)
        assert not RetryPolicy(retry_on=[Exception]).should_retry(error, 1)
    assert not unscoped.should_retry(KeyboardInterrupt(), 1)
    lost = queuety.WorkerLost("killed")
    assert RetryPolicy(retry_on=[ValueError]).should_retry(lost, 2)
    assert not RetryPolicy(max_attempts=2).should_retry(lost, 2)


def test_no_policy__a_plain_failure_runs_once_but_a_lost_worker_is_retried():
    assert not NO_RETRY.should_retry(ValueError("x"), 1)
    assert NO_RETRY.should_retry(queuety.WorkerLost("gone"), 1)


def test_policy__round_trips_and_describes_itself():
    policy = RetryPolicy(max_attempts=4, initial_delay=0.5, retry_on=[ConnectionResetError])
    assert RetryPolicy.from_dict(policy.to_dict()) == policy
    assert policy.describe() == (
        "max_attempts=4 initial_delay=0.5s backoff_factor=2 max_delay=60s jitter=0.1 "
        "retry_on=[ConnectionResetError] max_total_wait=3.85s")
    assert "retry_on=[no exception (worker losses only)]" in NO_RETRY.describe()
