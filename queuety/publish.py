"""Hand messages to Celery, after the transaction that created them commits.

Messages are sent by task name (``queuety.execute_step``, ``queuety.resume_parent``: stable
contracts, see ``queuety.tasks``), so the publisher never imports its consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any, NamedTuple

from celery import current_app
from django.db import transaction

from queuety.conf import settings
from queuety.core.definition import WorkflowSpec

logger = logging.getLogger("queuety")

#: The task that runs one attempt of a step row.
EXECUTE_STEP = "queuety.execute_step"
#: The task that moves on a run waiting for other runs.
RESUME_PARENT = "queuety.resume_parent"
#: The task that sends one webhook delivery row.
DELIVER_WEBHOOK = "queuety.deliver_webhook"
#: The task that processes one bulk operation (queuety.bulk_actions).
BULK_OPERATION = "queuety.bulk_operation"
#: The task that starts a concurrency group's throttled steps into its free slots.
WAKE_GROUP = "queuety.wake_group"


class Message(NamedTuple):
    """A request to run the step row ``step_run_id``."""

    step_run_id: int
    countdown: float | None
    """Seconds to hold the message at the broker (short back-offs only)."""
    timeout: float | None
    """The step's timeout: the message carries the matching hard time limit."""
    queue: str | None = None
    """The step's or the workflow's queue (``.on_queue()``), else ``QUEUETY["QUEUE"]``."""
    priority: str | None = None
    """``high``, ``normal`` or ``low`` when the step or its workflow sets one: the message
    then carries Celery's priority for it (``QUEUETY["MESSAGE_PRIORITIES"]``)."""


def queue_name(queue: str | None) -> str:
    """The queue a message for ``queue`` (a step's or workflow's, None for neither) goes to:
    it, else ``QUEUETY["QUEUE"]``, else Celery's default queue (``task_default_queue``)."""
    return queue or settings.QUEUE or str(current_app.conf.task_default_queue or "celery")


def message_for(spec: WorkflowSpec, step_run_id: int, index: int,
                countdown: float | None = None) -> Message:
    """The message that runs row ``step_run_id`` of step ``index`` of a run of ``spec``."""
    return Message(step_run_id, countdown, spec.steps[index].timeout, spec.queue_of(index),
                   spec.priority_of(index))


def hard_limit(timeout: float) -> float:
    """Seconds after its start that a timed step's task is killed if it is still running
    (Celery's hard time limit, which its message carries): the timeout, plus
    ``HARD_TIMEOUT_GRACE``, plus ``INLINE_SECONDS`` when steps may run inline, so that the
    timed steps after it can run in the same task, each within ``INLINE_SECONDS`` of its own
    hard limit (``queuety.core.inline``)."""
    slack = float(settings.INLINE_SECONDS) if settings.INLINE_STEPS > 1 else 0.0
    return timeout + float(settings.HARD_TIMEOUT_GRACE) + slack


def step_message(spec: WorkflowSpec, step_run_id: int, index: int, timeout: float | None,
                 countdown: float | None = None) -> Message:
    """The message of a row of step ``index`` whose timeout is the row's own (a fan-out
    branch's, a retried row's): on the step's queue, with the step's priority."""
    return Message(step_run_id, countdown, timeout, spec.queue_of(index), spec.priority_of(index))


#: Celery priorities by broker: Redis serves 0 first, RabbitMQ the highest number first.
_REDIS_PRIORITIES = {"high": 0, "normal": 3, "low": 6}
_AMQP_PRIORITIES = {"high": 9, "normal": 5, "low": 0}


def celery_priority(priority: str) -> int:
    """The Celery message priority of a priority word, for the configured broker."""
    table = settings.MESSAGE_PRIORITIES
    if table is None:
        url = str(current_app.conf.broker_url or "")
        table = _REDIS_PRIORITIES if url.startswith(("redis", "rediss")) else _AMQP_PRIORITIES
    return int(table[priority])


_override: Callable[[list[Message]], None] | None = None
_wake_override: Callable[[list[int]], None] | None = None


def _send(name: str, args: tuple[Any, ...], options: dict[str, Any],
          kwargs: dict[str, Any] | None = None) -> None:
    """Send task ``name``; under ``task_always_eager`` run it here, as ``apply_async`` would
    (``send_task`` ignores eager mode), looking the task up by name in Celery's registry."""
    if current_app.conf.task_always_eager:
        current_app.tasks[name].apply_async(args, kwargs, **options)
    else:
        current_app.send_task(name, args, kwargs, ignore_result=True, **options)


def publish(messages: Iterable[Message]) -> None:
    """Send one ``queuety.execute_step`` message per item.

    A broker error is logged, not raised: the step rows are committed, and the sweeper
    re-publishes due rows whose message never arrived.
    """
    messages = list(messages)
    if _override is not None:
        _override(messages)
        return
    for message in messages:
        # The tasks ignore their results (see queuety.tasks): sent by name, say so here.
        options: dict[str, Any] = {}
        queue = message.queue or settings.QUEUE
        if queue:
            options["queue"] = queue
        if message.countdown:
            options["countdown"] = message.countdown
        if message.priority:
            options["priority"] = celery_priority(message.priority)
        if message.timeout:
            # The handler is interrupted at the timeout by the worker itself; this hard limit
            # only kills a process stuck where signals cannot reach (C code).
            options["time_limit"] = hard_limit(message.timeout)
        try:
            _send(EXECUTE_STEP, (message.step_run_id,), options)
        except Exception:  # noqa: BLE001 - the sweeper is the backstop
            logger.exception("Could not publish step run id=%s; the sweeper will re-publish it.",
                             message.step_run_id)


def publish_on_commit(messages: list[Message]) -> None:
    """Publish ``messages`` once the current transaction commits (at once outside one)."""
    transaction.on_commit(partial(publish, messages))


def wake(run_ids: list[int]) -> None:
    """Once this transaction commits, ask a worker to move on each run in ``run_ids`` (runs
    waiting for a run that finished). A broker error is logged: the sweeper wakes them too."""
    if run_ids:
        transaction.on_commit(partial(_send_wake_ups, list(run_ids)))


def wake_group_on_commit(group: str, countdown: float, *, wait: bool = True,
                         retry: int = 0) -> None:
    """Once this transaction commits, ask a worker to start ``group``'s throttled steps in
    ``countdown`` seconds (when a rate limit's window reopens; without ``wait``, a retry that
    leaves the group alone if its lock is busy). A broker error is logged: the sweeper wakes
    throttled groups too. ``retry``: how many such retries came before this one."""
    transaction.on_commit(partial(_send_group_wake_up, group, countdown, wait, retry))


def _send_group_wake_up(group: str, countdown: float, wait: bool, retry: int) -> None:
    options: dict[str, Any] = {"queue": settings.QUEUE} if settings.QUEUE else {}
    try:
        _send(WAKE_GROUP, (group,) if wait else (group, False, retry),
              {**options, "countdown": countdown})
    except Exception:  # noqa: BLE001 - the sweeper wakes throttled groups anyway
        logger.exception("Could not publish %s(%r); the sweeper will do it.", WAKE_GROUP, group)


def _send_wake_ups(run_ids: list[int]) -> None:
    if _wake_override is not None:
        _wake_override(run_ids)
        return
    options: dict[str, Any] = {"queue": settings.QUEUE} if settings.QUEUE else {}
    for run_id in run_ids:
        try:
            _send(RESUME_PARENT, (run_id,), options)
        except Exception:  # noqa: BLE001 - the sweeper wakes waiting parents anyway
            logger.exception("Could not publish %s(%r); the sweeper will do it.", RESUME_PARENT,
                             run_id)


def deliver_webhooks(delivery_ids: list[int], countdown: float | None = None) -> None:
    """Once this transaction commits, ask a worker to send each webhook delivery row. A broker
    error is logged: the sweeper sends due deliveries whose message was lost."""
    if delivery_ids:
        transaction.on_commit(partial(_send_deliveries, list(delivery_ids), countdown))


def _send_deliveries(delivery_ids: list[int], countdown: float | None) -> None:
    options: dict[str, Any] = {"queue": settings.QUEUE} if settings.QUEUE else {}
    if countdown:
        options["countdown"] = countdown
    for delivery_id in delivery_ids:
        try:
            _send(DELIVER_WEBHOOK, (delivery_id,), options)
        except Exception:  # noqa: BLE001 - the sweeper sends due deliveries anyway
            logger.exception("Could not publish %s(%r); the sweeper will do it.",
                             DELIVER_WEBHOOK, delivery_id)


def bulk_operation(op_id: int) -> None:
    """Send ``queuety.bulk_operation`` for bulk operation ``op_id`` (on ``QUEUETY["QUEUE"]``).
    A broker error is logged, not raised: the sweeper sends it again once the operation's
    lease lapses (``queuety.runtime.bulk_recovery``)."""
    options: dict[str, Any] = {"queue": settings.QUEUE} if settings.QUEUE else {}
    try:
        _send(BULK_OPERATION, (op_id,), options)
    except Exception:  # noqa: BLE001 - the sweeper is the backstop
        logger.exception("Could not publish %s(%r); the sweeper will do it.", BULK_OPERATION,
                         op_id)


#: The tasks :func:`send_later` is running here under ``task_always_eager`` (this context).
_eager_later: ContextVar[frozenset[str]] = ContextVar("queuety_eager_later", default=frozenset())


def send_later(name: str, kwargs: dict[str, Any], countdown: float) -> None:
    """Send task ``name`` with ``kwargs`` in ``countdown`` seconds, on ``QUEUETY["QUEUE"]``
    (a schedule's buffered fire looking again). A broker error is logged, not raised.

    Under ``task_always_eager`` the task runs here at once (Celery runs an eager task without
    its countdown), and a ``send_later`` of the same task from inside that run is dropped.
    """
    running = _eager_later.get()
    if name in running and current_app.conf.task_always_eager:
        # Eager mode has no later: a buffered fire looking again behind a run that is still
        # live would see the same run and send itself again until the stack ran out.
        logger.info("Task %s(%r) was not sent again from its own eager run.", name, kwargs)
        return
    options: dict[str, Any] = {"queue": settings.QUEUE} if settings.QUEUE else {}
    entered = _eager_later.set(running | {name})
    try:
        _send(name, (), {**options, "countdown": countdown}, kwargs)
    except Exception:  # noqa: BLE001 - the caller's next periodic run is the backstop
        logger.exception("Could not publish %s(%r).", name, kwargs)
    finally:
        _eager_later.reset(entered)


@contextmanager
def redirected(send: Callable[[list[Message]], None]) -> Iterator[None]:
    """Hand published step messages to ``send`` instead of Celery inside the block (a test's
    own broker client, a fault injector). Wake-ups are not redirected."""
    global _override
    previous, _override = _override, send
    try:
        yield
    finally:
        _override = previous


@contextmanager
def wake_ups_redirected(send: Callable[[list[int]], None]) -> Iterator[None]:
    """Hand the ids of runs to wake (see :func:`wake`) to ``send`` instead of Celery inside
    the block (``queuety.testing`` moves them on in-process)."""
    global _wake_override
    previous, _wake_override = _wake_override, send
    try:
        yield
    finally:
        _wake_override = previous


@contextmanager
def captured() -> Iterator[list[Message]]:
    """Collect published step messages instead of sending them (for tests and dry runs)."""
    sent: list[Message] = []
    with redirected(sent.extend):
        yield sent
