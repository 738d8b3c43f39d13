"""The fluent workflow builder: ``queuety.workflow(name).then(...).dispatch(payload)``.

:class:`WorkflowBuilder` holds the steps and declares most of them; the steps that involve other
runs come from ``builder_runs``, the signal waits from ``builder_signals``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from queuety import exceptions
from queuety.core import engine, flow, resources
from queuety.core import tags as run_tags
from queuety.core.budget import Budget
from queuety.core.builder_runs import RunSteps
from queuety.core.builder_signals import SignalSteps
from queuety.core.definition import (
    DelayStep,
    ForEachStep,
    ParallelStep,
    RepeatStep,
    StepSpec,
    TaskStep,
    WorkflowSpec,
)
from queuety.core.fanout import FanOutSpec
from queuety.core.handlers import (
    branch_entry,
    resolve_handler,
    step_options,
    transactional_option,
)
from queuety.core.retry import RetryPolicy


class WorkflowBuilder(RunSteps, SignalSteps):
    """Declares a workflow step by step. Every method returns a new builder.

    Builders are immutable, so a partly built workflow can be shared and extended safely::

        base = queuety.workflow("order").then(Validate)
        full = base.then(Charge).then(Ship)     # ``base`` still has one step
    """

    __slots__ = ("_name", "_steps", "_options", "_key", "_on_conflict")

    def __init__(
        self,
        name: str,
        steps: tuple[StepSpec, ...] = (),
        options: dict[str, Any] | None = None,
        key: str | None = None,
        on_conflict: str = "report",
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise exceptions.WorkflowDefinitionError(
                f"A workflow needs a non-blank name (got {name!r})."
            )
        self._name = name.strip()
        self._steps = steps
        # Workflow-level fields of the WorkflowSpec (retry, queue, version, budget, ...).
        self._options: dict[str, Any] = options or {}
        self._key = key
        self._on_conflict = on_conflict

    def _copy(self, **changes: Any) -> WorkflowBuilder:
        values = {"name": self._name, "steps": self._steps, "options": self._options,
                  "key": self._key, "on_conflict": self._on_conflict, **changes}
        return WorkflowBuilder(**values)

    def _with(self, **options: Any) -> WorkflowBuilder:
        return self._copy(options={**self._options, **options})

    def _append(self, step: StepSpec) -> WorkflowBuilder:
        _check_name(self._name, self._steps, step)
        return self._copy(steps=self._steps + (step,))

    @property
    def _budget(self) -> Budget:
        budget: Budget = self._options.get("budget", Budget())
        return budget

    def then(
        self,
        step: Any,
        name: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        cost_units: int | None = None,
        concurrency_group: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: tuple[int, float] | None = None,
        queue: str | None = None,
        priority: str | None = None,
        transactional: bool | None = None,
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
            cost_units: units this step adds to the run's ``cost_units`` when it completes;
                0 is allowed here only (default: the step class's ``cost_units``, else 1).
            concurrency_group: the group whose limits this step shares with every run,
                workflow and worker (``"openai"``), or a keyed family formatted from the run's
                state when the step is reached (``"tenant:{tenant_id}"``).
            concurrency_limit: attempts of the group in flight at once (unless
                ``QUEUETY["CONCURRENCY_LIMITS"]`` names the group).
            rate_limit: ``(starts, seconds)``: at most that many starts of the group in any
                such period (unless ``QUEUETY["RATE_LIMITS"]`` names it).
            queue: the Celery queue this step's messages go to, e.g. ``"io"`` for the I/O
                lane's workers (default: the step class's ``queue``, else the workflow's
                ``on_queue()``).
            priority: ``"high"``, ``"normal"`` or ``"low"`` (default: the workflow's
                ``with_priority()``, else normal).
            transactional: run the body inside the transaction that records its outcome, on
                Queuety's database: its ORM writes, its output and the transition commit
                together or not at all; ``timeout`` becomes the transaction's
                ``statement_timeout`` (default: the step class's ``transactional``, else
                False; docs/guide/triggers-and-events.md, "Exactly-once ORM steps").

        Each of these defaults to the step class's attribute of the same name
        (docs/guide/resources.md).
        """
        return self._append(self._task(
            step, name, retry=retry, timeout=timeout, cost_units=cost_units,
            concurrency_group=concurrency_group, concurrency_limit=concurrency_limit,
            rate_limit=rate_limit, queue=queue, priority=priority,
            transactional=transactional))

    @staticmethod
    def _task(step: Any, name: str | None, *, retry: RetryPolicy | None, timeout: float | None,
              cost_units: int | None, concurrency_group: str | None = None,
              concurrency_limit: int | None = None, rate_limit: tuple[int, float] | None = None,
              queue: str | None = None, priority: str | None = None,
              transactional: bool | None = None) -> TaskStep:
        """The task step :meth:`then` adds."""
        path, obj = resolve_handler(step)
        step_name = name if name is not None else path.rsplit(".", 1)[-1]
        if not isinstance(step_name, str) or not step_name.strip():
            raise exceptions.WorkflowDefinitionError(
                f"Step names must be non-blank strings (got {name!r} for {path!r})."
            )
        options = step_options(step_name, obj, retry=retry, timeout=timeout,
                               cost_units=cost_units, concurrency_group=concurrency_group,
                               concurrency_limit=concurrency_limit, rate_limit=rate_limit,
                               queue=queue, priority=priority)
        spec = TaskStep(name=step_name.strip(), handler=path, retry=options.retry,
                        timeout=options.timeout, cost_units=options.cost_units,
                        transactional=transactional_option(step_name, obj, transactional),
                        **options.resource_fields())
        return spec

    def route(self, step: Any, routes: dict[Any, str], name: str | None = None, *,
              retry: RetryPolicy | None = None, timeout: float | None = None,
              cost_units: int | None = None, **hints: Any) -> WorkflowBuilder:
        """Add a step that picks the next step: it returns a label (a string), or
        ``queuety.Route(label, output={...})`` to merge output too.

        Args:
            routes: ``{"label": "target step name", ..., queuety.DEFAULT: "target"}``. A label
                matching none, with no DEFAULT, fails the run with ``UnmatchedRoute``. Targets
                are checked when the workflow is built, as is that every step stays reachable.
            hints: ``concurrency_group``, ``concurrency_limit``, ``rate_limit``, ``queue``
                and ``priority``, as for :meth:`then`.
        """
        if not isinstance(routes, dict) or not routes:
            raise exceptions.WorkflowDefinitionError(
                f"route() needs a non-empty dict of label -> target step name (got {routes!r})."
            )
        labels: dict[str, str] = {}
        default = None
        for label, target in routes.items():
            if not isinstance(target, str) or not target.strip():
                raise exceptions.WorkflowDefinitionError(
                    f"Route {label!r} must target a step name (got {target!r}).")
            if label is engine.DEFAULT:
                default = target
            elif isinstance(label, str) and label:
                labels[label] = target
            else:
                raise exceptions.WorkflowDefinitionError(
                    f"Route labels are non-empty strings or queuety.DEFAULT, one per entry "
                    f"(got {label!r}); list a shared target under each label.")
        task = self._task(step, name, retry=retry, timeout=timeout, cost_units=cost_units,
                          **hints)
        return self._append(replace(task, routes=labels, default_route=default))

    def delay(self, seconds: float = 0, minutes: float = 0, hours: float = 0, days: float = 0,
              *, name: str | None = None) -> WorkflowBuilder:
        """Sleep durably: the next step becomes due this long after the run gets here.

        The due time lives in the database (long delays are published by the sweeper), so it
        survives a restart of every worker.
        """
        total = seconds + 60 * minutes + 3600 * hours + 86400 * days
        if total < 0:
            raise exceptions.WorkflowDefinitionError(
                f"delay() needs a duration of 0 or more (got {total:g}s).")
        count = sum(1 for s in self._steps if s.kind == "delay")
        spec = DelayStep(name=name or f"delay_{count}", cost_units=0,
                        delay_seconds=float(total))
        return self._append(spec)

    def delay_until(self, when: Any, *, name: str | None = None) -> WorkflowBuilder:
        """Sleep durably until ``when``: an aware ``datetime``, or a callable (or its dotted
        path) that returns one from the run's state when the run gets here.

        The due time lives in the database, like :meth:`delay`'s; a time already past lets
        the run go on at once.

        Raises:
            WorkflowDefinitionError: ``when`` is a naive datetime (it names no instant), or
                neither a datetime nor a callable. A callable that returns a naive datetime
                fails the step before it (``InvalidStepOutput``), as a bad output does.
        """
        count = sum(1 for s in self._steps if s.kind == "delay")
        step_name = name or f"delay_{count}"
        if isinstance(when, datetime):
            at = flow.aware_time(when, f"delay_until({step_name!r})'s time")
            spec = DelayStep(name=step_name, cost_units=0, delay_seconds=0.0,
                             until=at.astimezone(UTC).isoformat())
        elif callable(when) or isinstance(when, str):
            spec = DelayStep(name=step_name, cost_units=0, delay_seconds=0.0,
                             until_from=resolve_handler(when)[0])
        else:
            raise exceptions.WorkflowDefinitionError(
                f"delay_until() takes an aware datetime or a callable(state) returning one "
                f"(got {when!r}).")
        return self._append(spec)

    # -- loops ---------------------------------------------------------------------------------

    def _repeat(self, mode: str, target: str, state_key: str | None, expected: Any,
                condition: Any, max_iterations: int | None, name: str | None
                ) -> WorkflowBuilder:
        if not isinstance(target, str) or not target:
            raise exceptions.WorkflowDefinitionError(
                "Repeat steps need the name of an earlier step to go back to.")
        if (state_key is None) == (condition is None):
            raise exceptions.WorkflowDefinitionError(
                "Repeat steps need either a state_key or a condition, not both.")
        if max_iterations is not None and (not isinstance(max_iterations, int)
                                           or max_iterations < 1):
            raise exceptions.WorkflowDefinitionError(
                f"max_iterations must be at least 1 (got {max_iterations!r}).")
        if target not in [s.name for s in self._steps]:
            raise exceptions.WorkflowDefinitionError(
                f"Repeat target {target!r} must name an earlier step of workflow "
                f"{self._name!r}.")
        spec = RepeatStep(
            name=name or f"repeat_{mode}_{len(self._steps)}", cost_units=0,
            repeat={"mode": mode, "target": target, "state_key": state_key,
                    "expected": expected,
                    "condition": None if condition is None else resolve_handler(condition)[0],
                    "max_iterations": max_iterations})
        return self._append(spec)

    def repeat_until(self, target: str, state_key: str | None = None, expected: Any = True, *,
                     condition: Any = None, max_iterations: int | None = None,
                     name: str | None = None) -> WorkflowBuilder:
        """Go back to step ``target`` until ``state[state_key] == expected`` (compared as JSON)
        or ``condition(state)`` is true. Each evaluation is a transition."""
        return self._repeat("until", target, state_key, expected, condition, max_iterations,
                            name)

    def repeat_while(self, target: str, state_key: str | None = None, expected: Any = True, *,
                     condition: Any = None, max_iterations: int | None = None,
                     name: str | None = None) -> WorkflowBuilder:
        """Go back to step ``target`` while ``state[state_key] == expected`` (or
        ``condition(state)`` is true). Each evaluation is a transition."""
        return self._repeat("while", target, state_key, expected, condition, max_iterations,
                            name)

    # -- fan-out -------------------------------------------------------------------------------

    def parallel(self, steps: list[Any], name: str | None = None, *,
                 retry: RetryPolicy | None = None, timeout: float | None = None,
                 max_concurrency: int | None = None) -> WorkflowBuilder:
        """Run ``steps`` at the same time, each its own task; continue when all completed.

        Outputs merge in declaration order (not completion order); one branch failing for good
        fails the run and cancels the others. With ``max_concurrency=n`` at most ``n``
        branches run at once; the others start, in order, as running ones finish.

        Each branch runs as a step given to ``then()`` would: its ``retry``, ``timeout`` and
        ``cost_units`` are its own options, else this call's ``retry`` and ``timeout``, else
        its class's attributes. Give a branch options of its own as a pair
        ``(step, {"timeout": 5, "retry": RetryPolicy(...), "cost_units": 2})``.
        """
        if isinstance(steps, str) or len(steps) < 2:
            raise exceptions.WorkflowDefinitionError(
                "parallel() needs a list of at least two steps.")
        step_name = name or f"parallel_{len(self._steps)}"
        paths, timeouts, retries, cost = [], [], [], 0
        for position, entry in enumerate(steps):
            handler, own = branch_entry(step_name, position, entry)
            path, obj = resolve_handler(handler)
            options = step_options(f"{step_name}[{position}]", obj,
                                   retry=own.get("retry") or retry,
                                   timeout=own.get("timeout") or timeout,
                                   cost_units=own.get("cost_units"))
            paths.append(path)
            timeouts.append(options.timeout)
            retries.append(options.retry if options.retry is not retry else None)
            cost += options.cost_units
        spec = ParallelStep(name=step_name, retry=retry, timeout=timeout,
                        cost_units=cost,
                        fanout=FanOutSpec(
                            branches=tuple(paths), max_concurrency=max_concurrency,
                            branch_timeouts=tuple(timeouts) if any(
                                t != timeout for t in timeouts) else (),
                            branch_retries=tuple(retries) if any(retries) else ()))
        return self._append(spec)

    def for_each(self, items_key: str, handler: Any, result_key: str | None = None,
                 mode: str = "all", quorum: int | None = None, reducer: Any = None,
                 name: str | None = None, *, retry: RetryPolicy | None = None,
                 timeout: float | None = None,
                 max_concurrency: int | None = None, **hints: Any) -> WorkflowBuilder:
        """Run ``handler(state, item, index)`` for each item of ``state[items_key]``, each its own
        task, and join them by ``mode``: ``all``, ``first_success`` or ``quorum`` (``quorum=n``).

        The aggregate ``{mode, quorum, total, succeeded, failed, settled, winner, results,
        failures}`` goes to ``result_key`` (default ``"<name>_results"``); ``reducer(state,
        aggregate) -> dict`` may add keys. Items still running when the join settles are
        cancelled. ``max_for_each_items`` is checked when the step is reached. With
        ``max_concurrency=n`` at most ``n`` items run at once; the others start, in item
        order, as running ones finish. ``queue`` sends the items' messages to that Celery
        queue (default: the handler class's ``queue``, else the workflow's).

        ``concurrency_group``, ``concurrency_limit``, ``rate_limit``, ``queue`` and
        ``priority`` bound each item as :meth:`then` bounds a step (``max_concurrency`` bounds
        one run's items; a group bounds every run's).
        """
        if not isinstance(items_key, str) or not items_key:
            raise exceptions.WorkflowDefinitionError("for_each() needs a non-empty items_key.")
        path, obj = resolve_handler(handler)
        step_name = name or f"{items_key}_for_each"
        if isinstance(obj, type) and not callable(getattr(obj, "handle_item", None)):
            raise exceptions.WorkflowDefinitionError(
                f"for_each() step {step_name!r} names class {path!r}, which has no "
                "handle_item(self, state, item, index) method; define one, or give a function "
                "f(state, item, index).")
        options = step_options(step_name, obj, retry=retry, timeout=timeout, **hints)
        fanout = FanOutSpec(items_key=items_key, result_key=result_key or f"{step_name}_results",
                            mode=mode, quorum=quorum, max_concurrency=max_concurrency,
                            reducer=None if reducer is None else resolve_handler(reducer)[0])
        spec = ForEachStep(name=step_name, handler=path, fanout=fanout,
                        retry=options.retry, timeout=options.timeout,
                        cost_units=options.cost_units, **options.resource_fields())
        return self._append(spec)

    # -- workflow options ----------------------------------------------------------------------

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
        return self._with(retry=policy)

    def on_queue(self, queue: str) -> WorkflowBuilder:
        """Send this workflow's step messages to the Celery queue ``queue``.

        Workers must consume it (``celery -A project worker -Q queue``).
        """
        if not isinstance(queue, str) or not queue.strip():
            raise exceptions.WorkflowDefinitionError(
                f"on_queue() needs a non-blank queue name (got {queue!r})."
            )
        return self._with(queue=queue.strip())

    def with_priority(self, priority: str) -> WorkflowBuilder:
        """Give this workflow's steps that set no priority of their own ``priority``
        (``"high"``, ``"normal"`` or ``"low"``): throttled steps are started, and on brokers
        that support it messages are delivered, highest priority first."""
        return self._with(priority=resources.check_priority(
            f"workflow {self._name!r}", priority) or resources.NORMAL)

    def with_tags(self, tags: Mapping[str, str] | None = None, /,
                  **more: str) -> WorkflowBuilder:
        """Tag every run of this workflow (``.with_tags({"team": "billing"})`` or
        ``.with_tags(team="billing")``), merged with the tags given at dispatch (which win
        for a key) and with the builder's earlier ``with_tags()``. Tags label runs; they are
        no part of the definition's identity (its hash), unlike ``on_queue()`` or
        ``with_priority()``, which change how it runs.

        Raises:
            InvalidPayload: a key or value breaks the tag rules (``queuety.core.tags``).
        """
        where = f"the tags of workflow {self._name!r}"
        combined = run_tags.merged(dict(self._options.get("tags", ())), tags, more,
                                   where=where)
        return self._with(tags=tuple(sorted(combined.items())))

    def version(self, label: str) -> WorkflowBuilder:
        """Label this definition (``"research.v2"``); shown by status, the admin and exports."""
        if not isinstance(label, str) or not label.strip():
            raise exceptions.WorkflowDefinitionError(
                f"Workflow {self._name!r}: version() needs a non-blank label (got {label!r})."
            )
        return self._with(version=label.strip())

    def idempotency_key(self, key: str, *, on_conflict: str = "report") -> WorkflowBuilder:
        """Make dispatch idempotent: a second dispatch with ``key`` returns the first run's id.

        Keys are global (not per workflow), case-sensitive, trimmed, at most 255 characters, and
        outlive purges of old runs. A reused key with a different payload or definition is
        recorded on the original run's timeline (``on_conflict="report"``) or raises
        :class:`~queuety.IdempotencyConflict` (``on_conflict="error"``).
        """
        if not isinstance(key, str) or not key.strip():
            raise exceptions.WorkflowDefinitionError(
                f"Workflow {self._name!r}: idempotency_key() needs a non-blank string "
                f"(got {key!r})."
            )
        if len(key.strip()) > 255:
            raise exceptions.WorkflowDefinitionError(
                f"Workflow {self._name!r}: idempotency keys are at most 255 characters "
                f"(got {len(key.strip())}); hash longer natural keys."
            )
        if on_conflict not in ("report", "error"):
            raise exceptions.WorkflowDefinitionError(
                f"on_conflict must be 'report' or 'error' (got {on_conflict!r})."
            )
        return self._copy(key=key.strip(), on_conflict=on_conflict)

    def _limit(self, name: str, value: int) -> WorkflowBuilder:
        return self._with(budget=Budget(**{**self._budget.to_dict(), name: value}))

    def max_transitions(self, limit: int) -> WorkflowBuilder:
        """Fail the run when it would complete more than ``limit`` step boundaries."""
        return self._limit("max_transitions", limit)

    def max_for_each_items(self, limit: int) -> WorkflowBuilder:
        """Fail the run when a ``for_each`` step plans more than ``limit`` items."""
        return self._limit("max_for_each_items", limit)

    def max_state_bytes(self, limit: int) -> WorkflowBuilder:
        """Fail the run when its public state's compact UTF-8 JSON exceeds ``limit`` bytes."""
        return self._limit("max_state_bytes", limit)

    def max_cost_units(self, limit: int) -> WorkflowBuilder:
        """Fail the run when its completed steps' ``cost_units`` add up to more than ``limit``."""
        return self._limit("max_cost_units", limit)

    def max_started_workflows(self, limit: int) -> WorkflowBuilder:
        """Fail the run when it would start more than ``limit`` child workflows."""
        return self._limit("max_started_workflows", limit)

    def max_step_attempts(self, limit: int) -> WorkflowBuilder:
        """Fail the run rather than start a step attempt beyond ``limit`` in all: attempts of
        this run's steps, retries included, and of the child runs its ``run_workflow`` steps
        start (restarts included). Stops retries multiplying across nested policies."""
        return self._limit("max_step_attempts", limit)

    def prune_state_after(self, steps: int = 2) -> WorkflowBuilder:
        """Drop each state key ``steps`` steps after the step that last wrote it.

        Keeps long runs under ``max_state_bytes``: a key a step wrote leaves the public state
        when ``steps`` more transitions have completed, unless a later step wrote it again
        (that restarts its count). Keys of the dispatch payload are never dropped. The timeline
        keeps every output, and which keys each transition dropped, so ``state_at()`` shows
        the state as it was. The original's default of 2 is kept.
        """
        return self._with(prune_state_after=steps)

    # -- compensation, cancellation, deadlines ------------------------------------------------

    def compensate_with(self, handler: Any) -> WorkflowBuilder:
        """Undo the last added step with ``handler`` if the run is cancelled (or fails, with
        :meth:`compensate_on_failure`). It gets the state as it was right after that step."""
        if not self._steps:
            raise exceptions.WorkflowDefinitionError(
                "Cannot attach a compensation before adding a step.")
        path, obj = resolve_handler(handler)
        step_options(f"compensate:{self._steps[-1].name}", obj)  # its class's options, checked
        last = replace(self._steps[-1], compensation=path)
        return self._copy(steps=self._steps[:-1] + (last,))

    def compensate_on_failure(self) -> WorkflowBuilder:
        """Also run compensations when the run fails (by default only a cancel runs them)."""
        return self._with(compensate_on_failure=True)

    def on_cancel(self, handler: Any) -> WorkflowBuilder:
        """Call ``handler(state)`` (durably, after compensations) when the run is cancelled."""
        return self._with(on_cancel=resolve_handler(handler)[0])

    def must_complete_within(self, seconds: float = 0, minutes: float = 0, hours: float = 0,
                             days: float = 0) -> WorkflowBuilder:
        """Fail the run (waiting or paused too) if it has not completed in this long."""
        total = seconds + 60 * minutes + 3600 * hours + 86400 * days
        if total <= 0:
            raise exceptions.WorkflowDefinitionError(
                f"must_complete_within() needs a positive duration (got {total:g}s).")
        return self._with(deadline_seconds=float(total))

    def on_deadline(self, handler: Any) -> WorkflowBuilder:
        """Call ``handler(state)`` (durably) when the run misses its deadline."""
        return self._with(on_deadline=resolve_handler(handler)[0])

    def machine_table(self, table: dict[str, Any]) -> WorkflowBuilder:
        """Attach a state machine's table (what ``queuety.machine()`` compiles to; see
        ``queuety.core.machine``): it is stored with the definition and hashed with it."""
        return self._with(machine=table)

    @property
    def dispatch_key(self) -> str | None:
        """The idempotency key :meth:`dispatch` uses (set with :meth:`idempotency_key`)."""
        return self._key

    def build(self) -> WorkflowSpec:
        """Return the immutable definition (validated, route targets included)."""
        return WorkflowSpec(name=self._name, steps=self._steps, **self._options)

    def dispatch(self, payload: dict[str, Any] | None = None, *, key: str | None = None,
                 debounce: float | None = None, singleton: bool = False,
                 on_conflict: str | None = None, signal: str = "input",
                 batch: Any = None, tags: Mapping[str, str] | None = None) -> int:
        """Start a run of this workflow with ``payload`` as its initial state; return its id.

        The run, its first step and its start event are written in one transaction; the first
        step's message is published when that transaction commits. ``key`` and the flow
        control options are ``queuety.start()``'s (``on_conflict`` here is the singleton's;
        the idempotency key's is given to :meth:`idempotency_key`).
        """
        # Imported here, the one upward import of the core (named in the import-linter
        # contract): ``import queuety`` and the core stay importable without Django.
        from queuety import dispatch as dispatching
        from queuety import keyed
        from queuety.core.keyed import flow_options

        flow = flow_options(self._name, key=key, debounce=debounce, singleton=singleton,
                            on_conflict=on_conflict, signal=signal, batch=batch)
        spec = run_tags.tagged(self.build(), tags)
        if flow is not None:
            return keyed.start(spec, payload, flow, idempotency_key=self._key)
        return dispatching.dispatch(spec, payload, idempotency_key=self._key,
                                    on_conflict=self._on_conflict)

    def __repr__(self) -> str:
        names = ", ".join(step.name for step in self._steps)
        return f"<WorkflowBuilder {self._name!r}: {names}>"


def _check_name(workflow: str, steps: tuple[StepSpec, ...], new: StepSpec) -> None:
    """Fail at the call that adds a duplicate step name (routes are checked at build)."""
    for position, step in enumerate(steps):
        if step.name == new.name:
            raise exceptions.WorkflowDefinitionError(
                f"Workflow {workflow!r} has two steps named {new.name!r} (positions {position} "
                f"and {len(steps)}); step names must be unique: pass name='...' to tell them "
                "apart."
            )


def workflow(name: str) -> WorkflowBuilder:
    """Start declaring the workflow called ``name``."""
    return WorkflowBuilder(name)
