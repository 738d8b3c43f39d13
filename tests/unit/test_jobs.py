"""The tasks backend's pure rules: priorities, queues, options, validation (no server)."""

from __future__ import annotations

import pytest

import queuety
from queuety.jobs import framework, options, results, specs, unique
from queuety.jobs.task_class import own_options
from queuety.tasks_backend import QueuetyBackend
from tests import job_tasks


@pytest.mark.parametrize(("priority", "band"), [
    (100, "high"), (1, "high"), (0, None), (-1, "low"), (-100, "low")])
def test_band__three_bands_in_the_frameworks_order(priority, band):
    assert specs.band(priority) == band


def test_celery_queue__default_is_the_sites_queue_any_other_its_own():
    assert specs.celery_queue("default") is None
    assert specs.celery_queue("io") == "io"


def test_spec_for__one_step_calling_the_task_on_its_queue_with_its_options():
    spec = specs.spec_for(job_tasks.urgent.using(queue_name="io"), {"timeout": 3})

    assert spec.name == "task:tests.job_tasks.urgent"
    [step] = spec.steps
    assert (step.name, step.handler, step.timeout) == ("urgent", specs.SYNC_HANDLER, 3.0)
    assert (spec.queue, spec.priority) == ("io", "high")
    # An explicit Celery queue wins over the queue_name.
    assert specs.spec_for(job_tasks.add, {"queue": "bulk"}).queue == "bulk"
    assert specs.spec_for(job_tasks.async_add, {}).steps[0].handler == specs.ASYNC_HANDLER


def test_check__retry_as_a_dict_and_rate_limit_as_a_list_as_settings_write_them():
    checked = options.check({"retry": {"max_attempts": 4}, "concurrency_group": "mail",
                             "rate_limit": [10, 60]}, "OPTIONS")

    assert checked["retry"] == queuety.RetryPolicy(max_attempts=4)
    assert checked["rate_limit"] == (10, 60)


@pytest.mark.parametrize(("given", "message"), [
    ({"retries": 3}, "unknown option(s) 'retries'; the options are retry, timeout"),
    ({"timeout": -1}, "timeout for step 'OPTIONS' must be a positive number"),
    ({"retry": {"attempts": 2}}, "retry is not a RetryPolicy's arguments"),
    ({"rate_limit": (5, 1)}, "no concurrency_group"),
])
def test_check__bad_options_named_with_the_fix(given, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message.replace("(", r"\(")
                       .replace(")", r"\)")):
        options.check(given, "OPTIONS")


def test_backend__an_unregistered_option_is_an_invalid_backend():
    with pytest.raises(framework.InvalidTaskBackendError, match="'retries'"):
        QueuetyBackend("broken", {"OPTIONS": {"retries": 3}})


def test_job_options__the_tasks_own_win_over_the_backends():
    assert options.for_task(job_tasks.sleeps.module_path, {"timeout": 9, "cost_units": 2}) == {
        "timeout": 0.5, "cost_units": 2}
    assert options.for_task(job_tasks.add.module_path, {"timeout": 9}) == {"timeout": 9}


def test_job_options__decorates_tasks_only():
    with pytest.raises(TypeError, match="put it above @task"):
        queuety.job_options(timeout=1)(job_tasks.not_a_task)
    with pytest.raises(queuety.WorkflowDefinitionError, match="unknown option"):
        queuety.job_options(tiemout=1)


def test_backend__says_what_it_supports():
    backend = framework.task_backends["default"]

    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)


def test_error__builtins_get_their_module_back():
    error = results.task_error({"type": "ValueError", "message": "bad"})

    assert error.exception_class is ValueError and error.traceback == "bad"
    assert results.task_error({"type": "queuety.exceptions.WorkerLost", "message": "gone",
                           "traceback": "T"}).exception_class is queuety.WorkerLost


def test_unique_key__from_the_callable_or_the_arguments_prefixed_by_the_task():
    args = {"args": ["t", 7], "kwargs": {}}
    charge = options.for_task(job_tasks.charge_once.module_path, {})
    by_arguments = options.for_task(job_tasks.refresh_cache.module_path, {})

    assert unique.key_of(job_tasks.charge_once, charge, args) == \
        "job:tests.job_tasks.charge_once:t-7"
    key = unique.key_of(job_tasks.refresh_cache, by_arguments, args)
    assert key.startswith("job:tests.job_tasks.refresh_cache:") and len(key) < 120
    assert key != unique.key_of(job_tasks.refresh_cache, by_arguments,
                                {"args": ["t", 8], "kwargs": {}})
    assert unique.key_of(job_tasks.add, {}, args) is None
    long = unique.key_of(job_tasks.add, {"unique_key": "x" * 400}, args)
    assert long.startswith("job:sha256:") and len(long) <= unique.KEY_LENGTH


@pytest.mark.parametrize(("given", "message"), [
    ({"unique_for": 0}, "unique_for must be a positive number"),
    ({"unique_key": ""}, "unique_key must be a non-blank string or a callable"),
])
def test_check__bad_unique_options(given, message):
    with pytest.raises(queuety.WorkflowDefinitionError, match=message):
        options.check(given, "OPTIONS")


def test_unique_key__a_callable_that_fails_or_returns_no_string_is_named():
    args = {"args": [], "kwargs": {}}
    with pytest.raises(framework.InvalidTask, match="raised ZeroDivisionError"):
        unique.key_of(job_tasks.add, {"unique_key": lambda: 1 / 0}, args)
    with pytest.raises(framework.InvalidTask, match="returned 5, not a non-blank"):
        unique.key_of(job_tasks.add, {"unique_key": lambda: 5}, args)


def test_task_class__takes_job_options_as_fields_and_refuses_bad_ones():
    backend = framework.task_backends["default"]
    made = backend.task_class(priority=0, func=job_tasks.add.func, backend="default",
                              queue_name="default", run_after=None, retry={"max_attempts": 2},
                              unique_for=30)

    assert own_options(made) == {"retry": queuety.RetryPolicy(max_attempts=2), "unique_for": 30}
    assert own_options(made.using(priority=5))["unique_for"] == 30
    assert own_options(job_tasks.add) == {}
    with pytest.raises(framework.InvalidTask, match="timeout for step 'task tests.job_tasks.add'"):
        backend.task_class(priority=0, func=job_tasks.add.func, backend="default",
                           queue_name="default", run_after=None, timeout=-1)
