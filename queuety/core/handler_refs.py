"""Every dotted path a stored definition names, what each must be, and whether the code at
hand still provides it: the pure part of ``manage.py queuety deploy-check``.

A definition keeps its handlers as dotted paths, and a deploy changes the code under them. A
path that no longer imports, or now names something its call site cannot call, fails a run
only when the run gets there, perhaps days later. :func:`check_definition` finds those first,
from the stored JSON, an importer and the alias resolver (ports, so this module reads no
database and imports no framework).

What each call site does with the object (:class:`Need`), as ``queuety.core.handlers`` and
``queuety.core.flow`` call it:

====================  ============================================  ==========================
need                  where                                         it must be
====================  ============================================  ==========================
``step``              a ``then()`` or ``route()`` step              ``f(state)`` /
                                                                    ``f(state, context)``, or
                                                                    a class with ``handle``;
                                                                    a generator streams
``branch``            a ``parallel()`` branch                       the same, not a generator
``cleanup``           a compensation, ``on_cancel``, ``on_deadline``  the same, not a generator
``item``              a ``for_each()`` handler                      ``f(state, item, index)``,
                                                                    or a class with
                                                                    ``handle_item``
``reducer``           a ``for_each()`` reducer                      ``f(state, aggregate)``, or
                                                                    a class with ``reduce``;
                                                                    not ``async``
``condition``         a ``repeat_*()`` condition                    ``f(state)``; not a class,
                                                                    not ``async``
``guard``             a state machine transition's ``guard``        ``f(state, payload)``; not
                                                                    a class, not ``async``
``exception``         a ``RetryPolicy``'s ``retry_on``              an exception class
====================  ============================================  ==========================

``async def`` fits every handler a worker runs (a prefork worker runs it on an event loop of
its own, an I/O lane worker on its shared one), and a sync one fits the lane too: no kind is
refused for the queue its step is on. A definition does not record which steps stream; a
generator is refused where it cannot stream (branches, items, cleanups). Route targets and
wait timeouts name steps, and :meth:`WorkflowSpec.from_dict` refuses a definition whose
targets name none: that is reported as a definition that no longer loads.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from queuety.core.definition import WorkflowSpec
from queuety.core.handlers import Step, wants_context

#: Imports a dotted path exactly (no alias); raises what importing raises.
Importer = Callable[[str], Any]
#: The path a stored path is imported from (its alias chain's end, or itself).
Resolver = Callable[[str], str]


class Need(StrEnum):
    """What a call site needs the object at a path to be (the table above)."""

    STEP = "step"
    BRANCH = "branch"
    CLEANUP = "cleanup"
    ITEM = "item"
    REDUCER = "reducer"
    CONDITION = "condition"
    GUARD = "guard"
    EXCEPTION = "exception"


@dataclass(frozen=True, slots=True)
class HandlerRef:
    """One dotted path of a definition, where it is named and what it must be."""

    path: str
    need: Need
    where: str
    """Who names it, as a sentence starts: ``"Step 'charge'"``, ``"Branch 1 of parallel step
    'fan'"``, ``"The on_cancel hook"`` (with ``" of child workflow ..."`` for a child's)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """How one :class:`HandlerRef` fares in the code at hand."""

    ref: HandlerRef
    target: str | None
    """The path it is imported from when aliased (``None``: its own)."""
    problem: str | None
    """Why a run would fail there, a full sentence naming who and the path; ``None``: fine."""

    @property
    def ok(self) -> bool:
        """Whether a run gets past it."""
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``deploy-check --json``)."""
        return {"where": self.ref.where, "path": self.ref.path, "need": str(self.ref.need),
                "alias": self.target, "problem": self.problem}


@dataclass(frozen=True, slots=True)
class DefinitionCheck:
    """Every finding of one stored definition (its children's included)."""

    findings: tuple[Finding, ...]
    load_problems: tuple[str, ...] = ()
    """Why the definition (or a child's) no longer loads at all, full sentences."""

    @property
    def failures(self) -> list[str]:
        """Every problem, as sentences: the load problems, then each failing path."""
        return [*self.load_problems, *(f.problem for f in self.findings if f.problem)]

    @property
    def aliased(self) -> list[Finding]:
        """The findings whose path goes through an alias."""
        return [f for f in self.findings if f.target is not None]


# -- enumerating ---------------------------------------------------------------------------------


def handler_refs(spec: WorkflowSpec, within: str = "") -> list[HandlerRef]:
    """Return the handler paths ``spec`` itself names (not its children's, nor ``retry_on``'s,
    which :func:`retry_refs` reads from the stored JSON), in step order."""
    refs: list[HandlerRef] = []
    for step in spec.steps:
        name = repr(step.name)
        if step.kind == "task":
            role = "Route step" if step.routes is not None else "Step"
            refs.append(HandlerRef(step.handler, Need.STEP, f"{role} {name}{within}"))
        elif step.kind == "for_each" and step.fanout is not None:
            refs.append(HandlerRef(step.handler, Need.ITEM, f"For-each step {name}{within}"))
            if step.fanout.reducer:
                refs.append(HandlerRef(step.fanout.reducer, Need.REDUCER,
                                       f"The reducer of for-each step {name}{within}"))
        elif step.kind == "parallel" and step.fanout is not None:
            refs += [HandlerRef(path, Need.BRANCH,
                                f"Branch {position} of parallel step {name}{within}")
                     for position, path in enumerate(step.fanout.branches)]
        elif step.repeat is not None and step.repeat.get("condition"):
            refs.append(HandlerRef(step.repeat["condition"], Need.CONDITION,
                                   f"The condition of repeat step {name}{within}"))
        elif step.until_from is not None:  # called as callable(state), as a condition is
            refs.append(HandlerRef(step.until_from, Need.CONDITION,
                                   f"The time of delay_until step {name}{within}"))
        if step.compensation:
            refs.append(HandlerRef(step.compensation, Need.CLEANUP,
                                   f"The compensation of step {name}{within}"))
    for hook in ("on_cancel", "on_deadline"):
        path = getattr(spec, hook)
        if path:
            refs.append(HandlerRef(path, Need.CLEANUP, f"The {hook} hook{within}"))
    return refs + _machine_refs(spec.machine, within)


def _machine_refs(table: dict[str, Any] | None, within: str) -> list[HandlerRef]:
    """The exit actions, guards and transition actions a state machine's table names
    (``queuety.core.machine``); an entry action is a step of its own, listed with the steps."""
    refs: list[HandlerRef] = []
    for name, state in ((table or {}).get("states") or {}).items():
        if state.get("on_exit"):
            refs.append(HandlerRef(state["on_exit"], Need.STEP,
                                   f"The on_exit action of state {name!r}{within}"))
        for t in state.get("transitions") or []:
            what = f"the transition of state {name!r} on {t['event']!r}{within}"
            if t.get("guard"):
                refs.append(HandlerRef(t["guard"], Need.GUARD, f"The guard of {what}"))
            if t.get("action"):
                refs.append(HandlerRef(t["action"], Need.STEP, f"The action of {what}"))
    return refs


def retry_refs(data: dict[str, Any], within: str = "") -> list[HandlerRef]:
    """Return the exception classes the retry policies of a stored definition name, read from
    its JSON: loading it imports them, so a missing one is found without loading it."""
    policies: list[tuple[str, Any]] = [(f"The workflow's retry policy{within}",
                                        data.get("retry"))]
    for step in data.get("steps") or ():
        if not isinstance(step, dict):
            continue
        name = repr(step.get("name"))
        policies.append((f"The retry policy of step {name}{within}", step.get("retry")))
        branches = (step.get("fanout") or {}).get("branch_retries") or ()
        policies += [(f"The retry policy of branch {position} of parallel step {name}{within}",
                      policy) for position, policy in enumerate(branches)]
    return [HandlerRef(path, Need.EXCEPTION, where) for where, policy in policies
            if isinstance(policy, dict) for path in policy.get("retry_on") or ()
            if isinstance(path, str)]


# -- checking ------------------------------------------------------------------------------------


def check_definition(data: dict[str, Any], importer: Importer, resolve: Resolver,
                     within: str = "") -> DefinitionCheck:
    """Check every path the stored definition ``data`` names, its child workflows' included
    (``run_workflow()`` and ``start_workflows()`` embed them), against the code at hand."""
    findings = [check_ref(ref, importer, resolve) for ref in retry_refs(data, within)]
    try:
        spec = WorkflowSpec.from_dict(data)
    except Exception as error:  # noqa: BLE001 - any refusal of the stored JSON is the finding
        what = f"child workflow{within}" if within else "stored definition"
        return DefinitionCheck(tuple(findings), (
            f"The {what} {data.get('name')!r} no longer loads ({_error_text(error)}), so its "
            "runs fail at their next step.",))
    findings += [check_ref(ref, importer, resolve) for ref in handler_refs(spec, within)]
    problems: list[str] = []
    for step in spec.steps:
        if step.child is not None:
            child = check_definition(step.child, importer, resolve,
                                     f" of child workflow {step.child.get('name')!r} "
                                     f"(step {step.name!r}{within})")
            findings += child.findings
            problems += child.load_problems
    return DefinitionCheck(tuple(findings), tuple(problems))


def check_ref(ref: HandlerRef, importer: Importer, resolve: Resolver) -> Finding:
    """Import ``ref``'s path as a worker would (through its alias) and check what it is."""
    try:
        target = resolve(ref.path)
    except ImportError as looped:
        return Finding(ref, None, f"{ref.where} names {ref.path!r}, whose aliases are "
                                  f"refused: {looped}")
    obj, error = _imported(importer, target)
    if error is not None and target == ref.path:
        # Importing its module may have declared an alias for it (queuety.alias() beside
        # the renamed handler): the worker follows that alias too.
        again = _resolved(resolve, ref.path)
        if again != target:
            target = again
            obj, error = _imported(importer, target)
    via = None if target == ref.path else target
    names = f"{ref.where} names {ref.path!r}" + ("" if via is None else f", aliased to {via!r}")
    if error is not None:
        return Finding(ref, via, f"{names}, which does not import in this code "
                                 f"({_error_text(error)}).")
    problem = kind_problem(obj, ref.need)
    return Finding(ref, via, None if problem is None else f"{names}, which {problem}.")


def kind_problem(obj: Any, need: Need) -> str | None:
    """Why ``obj`` does not fit ``need`` (a clause: ``"is a class without ..."``), or None."""
    if need is Need.EXCEPTION:
        return None if isinstance(obj, type) and issubclass(obj, BaseException) else \
            f"is {_what(obj)}, not an exception class"
    if need is Need.CONDITION:
        return _function_problem(obj, 1, "condition(state)", refuse_class=True)
    if need is Need.GUARD:
        return _function_problem(obj, 2, "guard(state, payload)", refuse_class=True)
    if need is Need.REDUCER:
        return _callable_problem(obj, "reduce", 2, "reducer(state, aggregate)", awaited=False)
    if need is Need.ITEM:
        problem = _callable_problem(obj, "handle_item", 3, "handler(state, item, index)")
    else:
        problem = _callable_problem(obj, "handle", 1, "handler(state)")
    if problem is None and need is not Need.STEP and _is_generator(obj, need):
        where = {Need.BRANCH: "a parallel branch", Need.ITEM: "a for_each item handler",
                 Need.CLEANUP: "a compensation or hook"}[need]
        return (f"is a generator (a streaming handler), which {where} cannot be: only a "
                "then() step streams")
    return problem


def _callable_problem(obj: Any, method: str, arguments: int, call: str, *,
                      awaited: bool = True) -> str | None:
    """A function called with ``arguments`` positional arguments (a one-argument step
    handler may take the context too), or a class whose ``method`` is called so on an
    instance; ``awaited=False``: the caller does not await what it returns."""
    if not inspect.isclass(obj):
        return _function_problem(obj, arguments, call, awaited=awaited,
                                 context=method == "handle")
    function = getattr(obj, method, None)
    if not callable(function) or function is getattr(Step, method, None):
        return (f"is the class {obj.__qualname__!r}, which has no {method}() method; give it "
                f"one, or name a function {call}")
    selfless = isinstance(inspect.getattr_static(obj, method), staticmethod | classmethod)
    if not _accepts(function, arguments + (0 if selfless else 1)):
        return (f"is the class {obj.__qualname__!r}, whose {method}() cannot take "
                f"{arguments} argument{'s' if arguments > 1 else ''} after self")
    if not awaited and _is_async(function):
        return (f"is the class {obj.__qualname__!r}, whose {method}() is async, but it is "
                "called without being awaited")
    return None


def _function_problem(obj: Any, arguments: int, call: str, *, refuse_class: bool = False,
                      awaited: bool = False, context: bool = False) -> str | None:
    """A function called as ``call`` (``context``: or with the step's context after the
    state, when it takes two positional arguments)."""
    if refuse_class and inspect.isclass(obj):
        return f"is the class {obj.__qualname__!r}, not a function {call}"
    if not callable(obj):
        return f"is {_what(obj)}, not a function {call} or a class"
    if context and _wants_context(obj):
        arguments += 1  # called as f(state, context)
    if not _accepts(obj, arguments):
        return f"is a function that cannot be called as {call}"
    if not awaited and _is_async(obj):
        return f"is an async function, but {call} is called without being awaited"
    return None


def _wants_context(function: Any) -> bool:
    try:
        return wants_context(function)
    except TypeError:  # an unhashable callable object: called as f(state)
        return False


def _is_generator(obj: Any, need: Need) -> bool:
    function = getattr(obj, "handle_item" if need is Need.ITEM else "handle", None) \
        if inspect.isclass(obj) else obj
    return inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function)


def _is_async(function: Any) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


def _accepts(function: Any, arguments: int) -> bool:
    """Whether ``function`` can be called with that many positional arguments (True when
    its signature cannot be read, as for some builtins)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*range(arguments))
    except TypeError:
        return False
    return True


def _imported(importer: Importer, path: str) -> tuple[Any, BaseException | None]:
    try:
        return importer(path), None
    except Exception as error:  # noqa: BLE001 - a module that raises on import is a finding
        return None, error


def _resolved(resolve: Resolver, path: str) -> str:
    try:
        return resolve(path)
    except ImportError:
        return path  # a loop: reported by check_ref's first resolution on the next check


def _what(obj: Any) -> str:
    return "a module" if inspect.ismodule(obj) else f"a {type(obj).__name__}"


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).rstrip('.')}"
