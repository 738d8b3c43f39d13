"""Tasks of Django's tasks framework, as a site writes them, for the tasks backend's tests.

Each marks its executions (tests.workflows.mark) under the token it is given, so a test counts
how many times a job's function ran, in which process.
"""

from __future__ import annotations

import asyncio
import os
import time
from importlib.util import find_spec

import queuety
from queuety.jobs import framework
from tests.workflows import mark, marks

if find_spec("django.tasks") is not None:
    from django.tasks import task
else:  # Django 5.2: the backport
    from django_tasks import task


@task
def add(token: str, a: int, b: int) -> int:
    mark(token)
    return a + b


@task(priority=10, queue_name="default")
def urgent(token: str) -> str:
    mark(token)
    return "urgent"


@task
def returns_tuple(token: str) -> tuple[int, int]:
    mark(token)
    return (1, 2)


@task
def returns_object(token: str) -> object:
    mark(token)
    return object()


@task
def fails(token: str) -> None:
    mark(token)
    raise ValueError(f"fails was told to fail ({token})")


@task(takes_context=True)
def attempts(context, token: str, fail_times: int) -> dict:
    """Fails its first ``fail_times`` attempts; returns what its context said."""
    mark(token)
    if context.attempt <= fail_times:
        raise ConnectionError(f"attempt {context.attempt} of {token} fails")
    return {"attempt": context.attempt, "id": context.task_result.id,
            "workers": len(context.task_result.worker_ids)}


@task
async def async_add(token: str, a: int, b: int) -> int:
    mark(token)
    await asyncio.sleep(0.01)
    return a + b


@task
def hang_first_time(token: str) -> int:
    """Hangs on its first execution (until its pool process is killed); returns its pid."""
    mark(token, "start")
    if len(marks(token)) == 1:
        time.sleep(600)
    return os.getpid()


@queuety.job_options(timeout=0.5)
@task
def sleeps(token: str, seconds: float) -> None:
    mark(token)
    time.sleep(seconds)


@task(queue_name="unconsumed")
def never_consumed(token: str) -> None:
    mark(token)


def not_a_task(token: str) -> None:
    mark(token)


@queuety.job_options(unique_for=60, unique_key=lambda token, order_id: f"{token}-{order_id}")
@task
def charge_once(token: str, order_id: int) -> int:
    mark(token)
    return order_id


@queuety.job_options(unique_for=1.0)
@task
def refresh_cache(token: str) -> None:
    mark(token)


def sleeps_briefly(token: str, seconds: float) -> None:
    mark(token)
    time.sleep(seconds)


# What `@task(timeout=0.5)` makes where @task passes its extra keywords on to the backend's
# Task class (the django-tasks backport, Django 6.1), built directly so Django 6.0 runs it too.
sleeps_briefly = framework.task_backends["default"].task_class(  # type: ignore[assignment]
    priority=0, func=sleeps_briefly, backend="default", queue_name="default", run_after=None,
    timeout=0.5)


@task
async def awaits_network(token: str, seconds: float) -> float:
    """An I/O-bound task (an LLM call, say): marks its start and end times."""
    mark(f"{token}-start", repr(time.time()))
    await asyncio.sleep(seconds)
    mark(f"{token}-end", repr(time.time()))
    return seconds

# -- seeing and steering jobs (tests/integration/test_jobs_cli.py, test_jobs_api.py) ----------

@task
def naps(token: str, seconds: float) -> str:
    """Runs for ``seconds`` with no timeout: a job an operator buries while it runs."""
    mark(token)
    time.sleep(seconds)
    return "woke"


@task
def tidy(token: str) -> str:
    """Succeeds at once: the jobs the purge tests delete (no other test enqueues it)."""
    mark(token)
    return token

# -- jobs observed (tests/integration/test_jobs_observe.py): on a queue of their own, whose
# worker records every Queuety signal and counts the job metrics.
OBSERVED_QUEUE = "jobs-observed"


@queuety.job_options(queue=OBSERVED_QUEUE)
@task
def observed_add(token: str, a: int, b: int) -> int:
    mark(token)
    return a + b


@queuety.job_options(queue=OBSERVED_QUEUE,
                     retry=queuety.RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0))
@task(takes_context=True)
def observed_flaky(context, token: str) -> int:
    """Fails its first attempt, succeeds on the second."""
    mark(token)
    if context.attempt == 1:
        raise ConnectionError(f"first attempt of {token} fails")
    return context.attempt


@queuety.job_options(queue=OBSERVED_QUEUE,
                     retry=queuety.RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0))
@task
def observed_fails(token: str) -> None:
    mark(token)
    raise ValueError(f"observed_fails was told to fail ({token})")

# -- chains (tests/integration/test_jobs_compose.py) -------------------------------------------

@task
def chain_start(token: str, n: int) -> dict:
    mark(token, "start")
    return {"token": token, "n": n + 1}


@task
def chain_double(value: dict) -> dict:
    mark(value["token"], "double")
    return {**value, "n": value["n"] * 2}


@task
async def chain_double_async(value: dict) -> dict:
    """``chain_double`` as an ``async def`` link."""
    await asyncio.sleep(0.01)
    mark(value["token"], "adouble")
    return {**value, "n": value["n"] * 2}


@task
def chain_hang_first_time(value: dict) -> dict:
    """Hangs on its first execution (until its pool process is killed)."""
    mark(value["token"], "hang")
    if len([m for m in marks(value["token"]) if m.endswith(" hang")]) == 1:
        time.sleep(600)
    return {**value, "n": value["n"] + 100}


@task
def chain_fails(value: dict) -> None:
    mark(value["token"], "fails")
    raise ValueError(f"chain_fails was told to fail ({value['token']})")


@task
def chain_catch(chain_id: str, error: dict) -> None:
    """A chain's catch: marks under the token in the error's message."""
    token = error["message"].rsplit("(", 1)[-1].rstrip(")")
    mark(token, f"catch {chain_id} {error['type']}")


@task
def chain_flaky(value: dict) -> dict:
    """Fails its first two executions under the value's token."""
    mark(value["token"], "flaky")
    tries = len([m for m in marks(value["token"]) if m.endswith(" flaky")])
    if tries < 3:
        raise ConnectionError(f"try {tries} of chain_flaky fails")
    return {**value, "flaky": tries}


@task
def chain_sleep(value: dict) -> dict:
    mark(value["token"], "sleep")
    time.sleep(1.5)
    return value


# -- batches (tests/integration/test_jobs_compose.py) ------------------------------------------

@task
def batch_item(token: str, index: int, fail: bool = False, sleep: float = 0) -> int:
    mark(token, f"item {index}")
    time.sleep(sleep)
    if fail:
        raise ValueError(f"batch item {index} was told to fail ({token})")
    return index


def _mark_callback(which: str, batch_id: str, summary: dict) -> None:
    """Marks under ``batch-<id>``: a callback knows only its batch."""
    mark(f"batch-{batch_id}", f"{which} done={summary['done']} failed={summary['failed']} "
         f"cancelled={summary.get('cancelled')}")


@task
def batch_then(batch_id: str, summary: dict) -> None:
    _mark_callback("then", batch_id, summary)


@task
def batch_catch(batch_id: str, summary: dict) -> None:
    _mark_callback("catch", batch_id, summary)


@task
def batch_finally(batch_id: str, summary: dict) -> None:
    _mark_callback("finally", batch_id, summary)


# -- throttling after exceptions (tests/integration/test_jobs_compose.py) ----------------------

@queuety.job_options(throttle_exceptions=(2, 3.0), throttle_key="tests-throttle")
@task
def throttled_fails(token: str) -> None:
    mark(token, "fails")
    raise ConnectionError(f"throttled_fails was told to fail ({token})")


@queuety.job_options(throttle_exceptions=(2, 3.0), throttle_key="tests-throttle")
@task
def throttled_ok(token: str) -> str:
    mark(token, "ok")
    return "ok"


@task
def for_tenant(token: str, tenant: str) -> str:
    """A tenant's job (tests/reliability/test_tenants.py: its tenant is a keyword argument)."""
    mark(token)
    return tenant
