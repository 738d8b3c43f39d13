"""Chains: tasks run one after another, each given the return value of the one before.

``queuety.chain(fetch, parse.using(queue_name="io"), notify, catch=alert).enqueue(url)`` runs
``fetch(url)``, then ``parse(<fetch's return value>)``, then ``notify(<parse's>)``. A chain is
one run of a multi-step workflow named ``chain:<first task's path>+<n>``, whose steps each call
one task (``queuety.jobs.chain_link``): durable as a job is, resumed at its link when a worker
dies. The first link that fails for good fails the run; the later ones never run, and
``catch`` (a task) is enqueued with ``(chain id, error)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from inspect import iscoroutinefunction
from typing import Any

from django.utils import timezone

from queuety import dispatch, exceptions, operations
from queuety.core.builder import workflow
from queuety.core.definition import WorkflowSpec
from queuety.core.status import RunStatus
from queuety.jobs import callbacks, chain_link, framework, specs
from queuety.jobs import enqueue as enqueueing
from queuety.jobs import options as job_options


class ChainNotFound(exceptions.QueuetyError, LookupError):
    """No chain has the given id (no run has it, or the run is not a chain's)."""


@dataclass(frozen=True, slots=True)
class ChainResult:
    """A chain as it stands: its run's status and how many of its tasks succeeded."""

    id: str
    """The chain's run id, as a string (``queuety.workflow_status(int(id))`` shows the run)."""
    status: str
    """The run's status: ``running``, ``completed``, ``failed``, ``cancelled``, ..."""
    total: int
    """How many tasks the chain has."""
    done: int
    """How many of them succeeded."""
    results: list[Any]
    """Their return values, in order."""
    error: dict[str, Any] | None
    """Why it failed (``type``, ``message``, ``step``), else None."""

    @property
    def is_finished(self) -> bool:
        """Whether the chain completed, failed or was cancelled."""
        return self.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)

    @property
    def return_value(self) -> Any:
        """The last task's return value.

        Raises:
            ValueError: the chain has not completed.
        """
        if self.status != RunStatus.COMPLETED:
            raise ValueError(f"Chain {self.id} has not completed (it is {self.status}); it has "
                             "no return value.")
        return self.results[-1]

    def refresh(self) -> ChainResult:
        """The chain read again."""
        return Chain.get_result(self.id)

    def cancel(self) -> None:
        """Cancel the chain: its running task is stopped, the later ones never run.

        Raises:
            InvalidTransition: the chain already completed or was cancelled.
        """
        operations.cancel(int(self.id))


class Chain:
    """Tasks to run one after another (build it with :func:`chain`)."""

    def __init__(self, tasks: tuple[Any, ...], catch: Any = None) -> None:
        self.tasks = tasks
        self.catch = catch

    def enqueue(self, *args: Any, **kwargs: Any) -> ChainResult:
        """Start the chain: its first task gets ``args`` and ``kwargs``. One statement, as a
        job's enqueue; inside ``transaction.atomic()`` it starts when the transaction commits.

        Raises:
            InvalidTask: a task its backend cannot run; nothing is enqueued.
            InvalidTaskArguments: an argument is not JSON; nothing is enqueued.
        """
        links = []
        for task in (*self.tasks, *(() if self.catch is None else (self.catch,))):
            backend = task.get_backend()
            if not hasattr(backend, "job_options"):
                raise framework.InvalidTask(
                    f"Task {task.module_path} is on the tasks backend {backend.alias!r}, which "
                    "is not Queuety's; a chain runs on QueuetyBackend backends only.")
            backend.validate_task(task)
            links.append(_recorded(task, backend))
        catch = links.pop() if self.catch is not None else None
        arguments = enqueueing.arguments_of(self.tasks[0], list(args), dict(kwargs))
        chain_state: dict[str, Any] = {"links": links,
                                       "enqueued_at": timezone.now().isoformat()}
        if catch is not None:
            chain_state["catch"] = catch
        run_id = dispatch.dispatch_run(spec_of(self.tasks),
                                       {"chain": chain_state, **arguments}).run_id
        return ChainResult(id=str(run_id), status=RunStatus.RUNNING, total=len(links), done=0,
                           results=[], error=None)

    @staticmethod
    def get_result(chain_id: str) -> ChainResult:
        """The chain ``chain_id`` as it stands.

        Raises:
            ChainNotFound: no run has that id, or it is not a chain's.
        """
        status = callbacks.status_of(chain_id, "chain",
                                     lambda name: name.startswith(chain_link.PREFIX),
                                     ChainNotFound)
        done = list(status.state.get("link_results", []))
        return ChainResult(id=str(status.id), status=status.status,
                           total=len(status.state["chain"]["links"]), done=len(done),
                           results=done, error=status.error)


def chain(*tasks: Any, catch: Any = None) -> Chain:
    """Tasks to run one after another, each given the return value of the one before::

        queuety.chain(fetch, parse.using(queue_name="io"), notify, catch=alert).enqueue(url)

    Each task runs with its backend's and its own job options (``retry``, ``timeout``, the
    resource options, ``queue``); ``unique_for`` and ``unique_key`` do not apply inside a
    chain. ``catch`` is a task called with ``(chain id, error)`` when the chain fails.

    Raises:
        TypeError: no tasks, something that is not a task, or a link that ``takes_context``
            (a link has no TaskResult of its own; ``catch`` may take one).
    """
    if not tasks:
        raise TypeError("queuety.chain() needs at least one task.")
    for given in (*tasks, *(() if catch is None else (catch,))):
        if not isinstance(given, framework.Task):
            raise TypeError(f"queuety.chain() takes tasks (decorated with @task), not "
                            f"{given!r}.")
    for given in tasks:
        if given.takes_context:
            raise TypeError(f"Task {given.module_path} takes a context, which a chain's links "
                            "cannot (the chain, not the link, has a TaskResult); give it no "
                            "takes_context, or enqueue it on its own.")
    return Chain(tuple(tasks), catch)


def _recorded(task: Any, backend: Any) -> dict[str, Any]:
    """A task as a chain's state records it (``results.task_of`` reads it back)."""
    return {"path": task.module_path, "backend": backend.alias, "queue_name": task.queue_name,
            "priority": task.priority, "run_after": None}


def spec_of(tasks: tuple[Any, ...]) -> WorkflowSpec:
    """The workflow whose runs are chains of ``tasks``: a step per task, each with its job
    options, queue and priority band; stored once per shape."""
    return _spec(tuple(
        (task.module_path, task.name, task.queue_name, task.priority,
         tuple(sorted(job_options.step_part(job_options.for_task(
             task.module_path, task.get_backend().job_options)).items())),
         iscoroutinefunction(task.func))
        for task in tasks))


@lru_cache(maxsize=256)
def _spec(links: tuple[tuple[str, str, str, int, tuple[tuple[str, Any], ...], bool], ...]
          ) -> WorkflowSpec:
    first = links[0][0]
    builder = workflow(f"{chain_link.PREFIX}{first}+{len(links) - 1}")
    for index, (_path, name, queue_name, priority, options, is_async) in enumerate(links):
        given = dict(options)
        queue = given.pop("queue", None) or specs.celery_queue(queue_name)
        handler = chain_link.ASYNC_HANDLER if is_async else chain_link.HANDLER
        builder = builder.then(handler, name=chain_link.step_name(index, name),
                               queue=queue, priority=specs.band(priority), **given)
    return builder.build()
