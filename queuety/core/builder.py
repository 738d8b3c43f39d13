"""The fluent workflow builder: ``queuety.workflow(name).then(...).dispatch(payload)``."""

from __future__ import annotations

from typing import Any

from queuety import exceptions
from queuety.core.definition import StepSpec, WorkflowSpec
from queuety.core.handlers import resolve_handler
from queuety.core.retry import RetryPolicy


class WorkflowBuilder:
    """Declares a workflow step by step. Every method returns a new builder.

    Builders are immutable, so a partly built workflow can be shared and extended safely::

        base = queuety.workflow("order").then(Validate)
        full = base.then(Charge).then(Ship)     # ``base`` still has one step
    """

    __slots__ = ("_name", "_steps", "_retry", "_queue")

    def __init__(
        self,
        name: str,
        steps: tuple[StepSpec, ...] = (),
        retry: RetryPolicy | None = None,
        queue: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise exceptions.WorkflowDefinitionError(
                f"A workflow needs a non-blank name (got {name!r})."
            )
        self._name = name.strip()
        self._steps = steps
        self._retry = retry
        self._queue = queue

    def _copy(self, **changes: Any) -> WorkflowBuilder:
        values = {"name": self._name, "steps": self._steps, "retry": self._retry,
                  "queue": self._queue, **changes}
        return WorkflowBuilder(**values)

    def then(
        self,
        step: Any,
        name: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> WorkflowBuilder:
        """Add a step run after the previous one.

        Args:
            step: a :class:`~queuety.Step` subclass, a function ``f(state) -> dict | None``, or
                the dotted import path of either.
            name: unique step name (default: the class or function name); ``_next_step``
                jumps use it.
            retry: this step's :class:`~queuety.RetryPolicy` (default: the step class's
                ``retry`` attribute, then the workflow's ``.retry()``, then
                ``QUEUETY["DEFAULT_RETRY"]``).
            timeout: seconds an attempt may run (default: the step class's ``timeout``).
        """
        path, obj = resolve_handler(step)
        step_name = name if name is not None else path.rsplit(".", 1)[-1]
        if not isinstance(step_name, str) or not step_name.strip():
            raise exceptions.WorkflowDefinitionError(
                f"Step names must be non-blank strings (got {name!r} for {path!r})."
            )
        if retry is None:
            retry = getattr(obj, "retry", None)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise exceptions.WorkflowDefinitionError(
                f"retry for step {step_name!r} must be a queuety.RetryPolicy (got {retry!r})."
            )
        if timeout is None:
            timeout = getattr(obj, "timeout", None)
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                raise exceptions.WorkflowDefinitionError(
                    f"timeout for step {step_name!r} must be a positive number of seconds "
                    f"(got {timeout!r})."
                )
            timeout = float(timeout)
        spec = StepSpec(name=step_name.strip(), handler=path, retry=retry, timeout=timeout)
        # Building validates the whole definition, so a duplicate name fails at this call.
        WorkflowSpec(name=self._name, steps=self._steps + (spec,))
        return self._copy(steps=self._steps + (spec,))

    def retry(self, policy: RetryPolicy | None = None, **options: Any) -> WorkflowBuilder:
        """Set the default retry policy of this workflow's steps.

        Pass a :class:`~queuety.RetryPolicy`, or its arguments as keywords.
        """
        if policy is None:
            policy = RetryPolicy(**options)
        elif options:
            raise exceptions.WorkflowDefinitionError(
                "Pass either a RetryPolicy or keyword options to .retry(), not both."
            )
        if not isinstance(policy, RetryPolicy):
            raise exceptions.WorkflowDefinitionError(
                f".retry() takes a queuety.RetryPolicy (got {policy!r})."
            )
        return self._copy(retry=policy)

    def on_queue(self, queue: str) -> WorkflowBuilder:
        """Send this workflow's step messages to the Celery queue ``queue``.

        Workers must consume it (``celery -A project worker -Q queue``).
        """
        if not isinstance(queue, str) or not queue.strip():
            raise exceptions.WorkflowDefinitionError(
                f"on_queue() needs a non-blank queue name (got {queue!r})."
            )
        return self._copy(queue=queue.strip())

    def build(self) -> WorkflowSpec:
        """Return the immutable definition (validated)."""
        return WorkflowSpec(name=self._name, steps=self._steps, retry=self._retry,
                            queue=self._queue)

    def dispatch(self, payload: dict[str, Any] | None = None) -> int:
        """Start a run of this workflow with ``payload`` as its initial state; return its id.

        The run, its first step and its start event are written in one transaction; the first
        step's message is published when that transaction commits.
        """
        from queuety import services  # the core stays importable without Django

        return services.dispatch(self.build(), payload)

    def __repr__(self) -> str:
        names = ", ".join(step.name for step in self._steps)
        return f"<WorkflowBuilder {self._name!r}: {names}>"


def workflow(name: str) -> WorkflowBuilder:
    """Start declaring the workflow called ``name``."""
    return WorkflowBuilder(name)
