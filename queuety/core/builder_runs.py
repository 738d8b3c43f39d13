"""The builder's steps that involve other runs: a child workflow, runs started from a step, and
waits for runs to finish.

:class:`RunSteps` is a mixin of :class:`~queuety.core.builder.WorkflowBuilder`, which holds the
steps; these methods only declare them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Self

from queuety import exceptions
from queuety.core import waits
from queuety.core.definition import (
    ChildStep,
    StartStep,
    StepSpec,
    WaitWorkflowsStep,
    WorkflowSpec,
)
from queuety.core.dependencies import StartSpec, WaitWorkflowsSpec
from queuety.core.retry import RetryPolicy


class RunSteps:
    """Child workflows, runs started from a step, and waits for runs to finish."""

    __slots__ = ()

    # What these methods use of WorkflowBuilder, the one class that inherits them.
    _steps: tuple[StepSpec, ...]

    if TYPE_CHECKING:
        def _append(self, step: StepSpec) -> Self:
            ...

        def build(self) -> WorkflowSpec:
            ...

    def run_workflow(self, name: str, child: Self, *,
                     retry: RetryPolicy | None = None) -> Self:
        """Run ``child`` (a builder) as a child workflow named ``name``, started with this run's
        state; when it completes, its state's keys are merged here and this run goes on. Its
        failure or cancellation fails this run; cancelling this run cancels it.

        Args:
            retry: start the child afresh when it fails, by this policy (its ``retry_on``
                is matched against :class:`~queuety.ChildRunFailed`). Without it a failed
                child fails this run: the child's steps already retry by their own policies,
                and restarting the child multiplies those attempts. A cancelled child, or one
                that failed a budget or a :class:`~queuety.PermanentError`, is never restarted.
                ``max_step_attempts`` caps the attempts of the whole tree.
        """
        # Every WorkflowBuilder is a RunSteps, and nothing else is: the check needs no import
        # of builder.py.
        if not isinstance(child, RunSteps):
            raise exceptions.WorkflowDefinitionError(
                f"run_workflow() takes a queuety.workflow(...) builder (got {child!r}).")
        if not isinstance(name, str) or not name.strip():
            raise exceptions.WorkflowDefinitionError("run_workflow() needs a non-blank name.")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise exceptions.WorkflowDefinitionError(
                f"retry for run_workflow({name!r}) must be a queuety.RetryPolicy (got {retry!r}).")
        spec = replace(_untagged(child.build(), "run_workflow"), name=name.strip())
        step = ChildStep(name=name.strip(), cost_units=0, child=spec.to_dict(), retry=retry)
        return self._append(step)

    def start_workflows(self, items_key: str, child: Self,
                        result_key: str = "started_workflow_ids", payload_key: str = "item",
                        inherit_state: bool = True, name: str | None = None,
                        group_key: str | None = None) -> Self:
        """Start one run of ``child`` per item of ``state[items_key]`` and go on at once.

        The runs are created in the same transaction as this step's transition, so a crash or a
        retry never starts them twice. Each gets this run's public state (with
        ``inherit_state``), a dict item's keys over it (any other item under ``payload_key``)
        and ``start_item_index``. Their ids (in item order) go to ``result_key``; with
        ``group_key`` they also form a group for :meth:`wait_for_workflow_group`.
        ``max_started_workflows`` is checked before any run is created. Cancelling this run
        cancels the runs it started that are still active.
        """
        if not isinstance(child, RunSteps):
            raise exceptions.WorkflowDefinitionError(
                f"start_workflows() takes a queuety.workflow(...) builder (got {child!r}).")
        start = StartSpec(items_key=items_key, result_key=result_key, payload_key=payload_key,
                          inherit_state=bool(inherit_state), group=group_key)
        step = StartStep(name=name or f"start_workflows_{len(self._steps)}", cost_units=0,
                         child=_untagged(child.build(), "start_workflows").to_dict(),
                         start=start)
        return self._append(step)

    def start_agents(self, items_key: str, child: Self,
                     result_key: str = "agent_workflow_ids", payload_key: str = "agent_task",
                     inherit_state: bool = True, name: str | None = None,
                     group_key: str | None = None) -> Self:
        """:meth:`start_workflows` with agent-flavoured defaults (step name ``start_agents``)."""
        return self.start_workflows(items_key, child, result_key, payload_key, inherit_state,
                                    name or "start_agents", group_key)

    def _wait_workflows(self, default_name: str, name: str | None, timing: dict[str, Any],
                        **options: Any) -> Self:
        step_name = name or default_name
        timed = waits.wait_timing(step_name, timing.get("timeout"), timing.get("on_timeout"),
                                  timing.get("remind_after"), timing.get("remind_every"))
        step = WaitWorkflowsStep(name=step_name, cost_units=0,
                                 workflows=WaitWorkflowsSpec(**options, **timed))
        return self._append(step)

    def wait_for_workflows(self, workflows: list[int] | str, mode: str = "all",
                           result_key: str | None = None, name: str | None = None,
                           quorum: int | None = None, *, timeout: waits.Timeout = None,
                           on_timeout: str | None = None, remind_after: waits.Timeout = None,
                           remind_every: waits.Timeout = None) -> Self:
        """Park the run until other runs finish: ``all`` completed, ``any`` one, a
        ``quorum`` of ``n``, or ``settled``: every one finished, whatever its outcome.

        Args:
            workflows: a list of run ids, or the state key holding an id or a list of ids
                (for example the ``result_key`` of :meth:`start_workflows`).
            result_key: put the completed runs' public states under this key, as
                ``{"<id>": state}`` (a single awaited run: its state itself); without it,
                their keys merge into this run's state in the order listed.

        A run that fails, is cancelled or cannot be found makes ``all`` impossible, and the
        wait fails this run at once (likewise ``any``/``quorum`` once too few can complete).
        ``settled`` never fails: it goes on when the last one finished, merging nothing (with
        ``result_key``, the completed runs' states go under it).

        ``timeout``/``on_timeout`` are those of the signal waits (``fail``, ``continue`` or a
        step name; ``result_key`` is set to ``None`` when the timeout moves the run on); the
        awaited runs are not touched by a timeout and keep running. ``remind_after`` and
        ``remind_every`` send reminders while the run waits, as on signal waits (see
        :meth:`wait_for_signal`).
        """
        if isinstance(workflows, str):
            source: dict[str, Any] = {"state_key": workflows}
        elif isinstance(workflows, list | tuple):
            source = {"ids": tuple(workflows)}
        else:
            raise exceptions.WorkflowDefinitionError(
                f"wait_for_workflows() takes a list of run ids or a state key (got "
                f"{workflows!r}).")
        timing = {"timeout": timeout, "on_timeout": on_timeout, "remind_after": remind_after,
                  "remind_every": remind_every}
        return self._wait_workflows(f"wait_for_workflows_{len(self._steps)}", name, timing,
                                    mode=mode, quorum=quorum, result_key=result_key, **source)

    def wait_for_workflow(self, workflow: int | str, result_key: str | None = None,
                          name: str | None = None, *, timeout: waits.Timeout = None,
                          on_timeout: str | None = None, remind_after: waits.Timeout = None,
                          remind_every: waits.Timeout = None) -> Self:
        """Park the run until the run ``workflow`` (an id, or a state key holding one)
        completes; see :meth:`wait_for_workflows` (and its ``timeout`` and reminders)."""
        workflows = workflow if isinstance(workflow, str) else [workflow]
        return self.wait_for_workflows(workflows, result_key=result_key,
                                       name=name or "wait_for_workflow", timeout=timeout,
                                       on_timeout=on_timeout, remind_after=remind_after,
                                       remind_every=remind_every)

    def wait_for_workflow_group(self, group_key: str, mode: str = "all",
                                quorum: int | None = None, result_key: str | None = None,
                                name: str | None = None, *, timeout: waits.Timeout = None,
                                on_timeout: str | None = None,
                                remind_after: waits.Timeout = None,
                                remind_every: waits.Timeout = None) -> Self:
        """Park the run until the runs it started with ``start_workflows(group_key=...)``
        finish, by ``mode``; see :meth:`wait_for_workflows` (and its ``timeout`` and
        reminders)."""
        timing = {"timeout": timeout, "on_timeout": on_timeout, "remind_after": remind_after,
                  "remind_every": remind_every}
        return self._wait_workflows(f"wait_for_workflow_group_{len(self._steps)}", name,
                                    timing, group=group_key, mode=mode, quorum=quorum,
                                    result_key=result_key)

    def wait_for_agents(self, workflows: list[int] | str = "agent_workflow_ids",
                        mode: str = "all", result_key: str | None = "agent_results",
                        name: str | None = None, quorum: int | None = None,
                        **timing: Any) -> Self:
        """:meth:`wait_for_workflows` with the defaults of :meth:`start_agents` (``timing``:
        its ``timeout``, ``on_timeout``, ``remind_after`` and ``remind_every``)."""
        return self.wait_for_workflows(workflows, mode, result_key, name or "wait_for_agents",
                                       quorum, **timing)

    def wait_for_agent_group(self, group_key: str = "agents", mode: str = "all",
                             quorum: int | None = None, result_key: str | None = "agent_results",
                             name: str | None = None, **timing: Any) -> Self:
        """:meth:`wait_for_workflow_group` with agent-flavoured defaults (``timing``: as
        :meth:`wait_for_agents`)."""
        return self.wait_for_workflow_group(group_key, mode, quorum, result_key,
                                            name or "wait_for_agent_group", **timing)


def _untagged(spec: WorkflowSpec, method: str) -> WorkflowSpec:
    """``spec``, a child builder's, refused when it has ``.with_tags()``: the child is stored
    as its definition (``to_dict()``), which holds no tags, so its runs would carry none."""
    if spec.tags:
        raise exceptions.WorkflowDefinitionError(
            f"{method}() got the builder of workflow {spec.name!r} with tags "
            f"({', '.join(f'{key}={value}' for key, value in spec.tags)}); a child run does "
            "not take its builder's .with_tags(). Tag the child runs from one of their steps "
            "with context.tag(), or drop .with_tags() from the child builder.")
    return spec
