"""State machines: ``queuety.machine(name)``, declared state by state, compiled to a workflow.

A machine is a long-lived run that moves between named states on events::

    session = (queuety.machine("session")
               .state("idle")
               .on("message", to="active", action=greet)
               .state("active", timeout=timedelta(minutes=30))
               .on("message", to="active", guard=under_limit, action=reply)
               .on("close", to="closed")
               .on("timeout", to="idle")
               .final("closed"))
    run_id = session.start({"user_id": 7}, key="session:7")
    queuety.signal(run_id, "message", {"text": "hello"})

It compiles to an ordinary workflow definition (so durability, signals, REST, triggers,
timeouts, the admin, export and replay are the workflow engine's). Each non-final state ``S``
becomes, in order:

- ``S``: its entry action, a task step (only when the state has ``on_enter``);
- ``S.wait``: a wait for any of the state's event names (signals), with the state's
  ``timeout`` jumping to ``S.timeout``;
- ``S.route``: a route step (``queuety.core.machine_steps.transition``) that evaluates the
  event's guards in order, runs the state's exit action and the transition's action, and
  records the new state in the same output: one step boundary, so the transition is applied
  exactly once however often its actions are retried;
- ``S.timeout``: the same for the ``timeout`` transition (only when the state has a timeout).

A last step, ``machine.end``, completes the run when a transition enters a final state. The
table of states, transitions, guards and actions is stored in the definition
(``WorkflowSpec.machine``), so it is hashed with it and the steps read it from there.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from queuety import exceptions
from queuety.core.builder import WorkflowBuilder
from queuety.core.definition import WorkflowSpec
from queuety.core.handlers import resolve_handler
from queuety.core.retry import RetryPolicy

#: The public state key the machine keeps its bookkeeping under: the current state, the
#: transitions so far and the event that led into the current state.
MACHINE_KEY = "queuety_machine"
#: The state key a state's wait stores the event it took under.
EVENT_KEY = "queuety_event"
#: The event a state's timeout fires (``.on("timeout", to=...)``).
TIMEOUT_EVENT = "timeout"
#: The step that completes the run when a final state is entered.
END_STEP = "machine.end"
#: How many transitions the run's state keeps in ``history`` (the newest); ``transitions``
#: counts them all.
HISTORY_KEPT = 50
#: The options of a ``queuety.Step`` class an exit or transition action could not honour:
#: those actions run inside the transition's step, under the state's ``retry=``.
_STEP_ONLY_OPTIONS = ("retry", "timeout", "queue", "priority", "cost_units",
                      "concurrency_group", "concurrency_limit", "rate_limit", "transactional")
TRANSITION_HANDLER = "queuety.core.machine_steps.transition"
END_HANDLER = "queuety.core.machine_steps.end"
_STATE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


@dataclass(frozen=True, slots=True)
class _Transition:
    event: str
    to: str
    guard: str | None = None
    action: str | None = None


@dataclass(frozen=True, slots=True)
class _State:
    name: str
    final: bool = False
    on_enter: str | None = None
    on_exit: str | None = None
    timeout: float | None = None
    retry: RetryPolicy | None = None
    transitions: tuple[_Transition, ...] = field(default_factory=tuple)


class MachineBuilder:
    """Declares a state machine state by state. Every method returns a new builder.

    The first state declared is the initial one; :meth:`on` adds a transition to the state
    declared last.
    """

    __slots__ = ("_name", "_states", "_workflow")

    def __init__(self, name: str, states: tuple[_State, ...] = (),
                 workflow: WorkflowBuilder | None = None) -> None:
        if not isinstance(name, str) or not name.strip():
            raise exceptions.WorkflowDefinitionError(
                f"A state machine needs a non-blank name (got {name!r}).")
        self._name = name.strip()
        self._states = states
        self._workflow = workflow if workflow is not None else WorkflowBuilder(self._name)

    @property
    def name(self) -> str:
        """The machine's name (its runs' workflow name)."""
        return self._name

    def _copy(self, states: tuple[_State, ...] | None = None,
              workflow: WorkflowBuilder | None = None) -> MachineBuilder:
        return MachineBuilder(self._name, self._states if states is None else states,
                              workflow or self._workflow)

    def state(self, name: str, *, on_enter: Any = None, on_exit: Any = None,
              timeout: timedelta | float | None = None,
              retry: RetryPolicy | None = None) -> MachineBuilder:
        """Declare the state ``name``; the first declared is the initial state.

        Args:
            on_enter: the entry action, a step (a function ``f(state)`` or a ``Step``
                subclass, as ``then()`` takes), run as its own step each time the state is
                entered; its output is merged into the state.
            on_exit: the exit action, a step run when a transition leaves the state, in the
                transition's step.
            timeout: a ``timedelta`` (or seconds): when no event moved the machine on in
                that time after it entered the state, the ``timeout`` transition
                (``.on("timeout", to=...)``) is taken.
            retry: the retry policy of the state's transition steps (its exit and
                transition actions); default: the machine's ``.retry()``, then
                ``QUEUETY["DEFAULT_RETRY"]``.
        """
        self._check_new_state(name)
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if seconds is not None and (isinstance(seconds, bool)
                                    or not isinstance(seconds, int | float) or seconds <= 0):
            raise exceptions.WorkflowDefinitionError(
                f"The timeout of state {name!r} of machine {self._name!r} must be a positive "
                f"timedelta or number of seconds (got {timeout!r}).")
        enter_path = None if on_enter is None else resolve_handler(on_enter)[0]
        exit_path = _inline_action(self._name, f"the exit action of state {name!r}", on_exit)
        return self._copy((*self._states, _State(
            name, on_enter=enter_path, on_exit=exit_path,
            timeout=None if seconds is None else float(seconds), retry=retry)))

    def final(self, name: str) -> MachineBuilder:
        """Declare the final state ``name``: entering it completes the run."""
        self._check_new_state(name)
        return self._copy((*self._states, _State(name, final=True)))

    def on(self, event: str, to: str, *, guard: Any = None, action: Any = None) -> MachineBuilder:
        """Add a transition on ``event`` from the state declared last to the state ``to``.

        Args:
            event: the event's name, the signal name ``queuety.signal(run_id, event, data)``
                sends; ``"timeout"`` is the state's timeout.
            to: the target state (it may be declared later).
            guard: a function ``guard(state, payload) -> bool`` of the machine's data and
                the event's payload; the transition is taken only when it returns True. The
                transitions of one event are tried in the order they were declared.
            action: a step run in the transition's step, after the exit action; its output
                is merged into the state together with the state change.
        """
        if not self._states:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r}: .on({event!r}, ...) needs a state before it; "
                "declare one with .state(name).")
        current = self._states[-1]
        if current.final:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r}: the final state {current.name!r} cannot have "
                f"transitions (got .on({event!r}, to={to!r})); entering it ends the run.")
        if not isinstance(event, str) or not event.strip() or len(event) > 255:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r}: event names are non-blank strings of at most 255 "
                f"characters (got {event!r} on state {current.name!r}).")
        if not isinstance(to, str) or not to:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r}: .on({event!r}, to=...) of state {current.name!r} "
                f"needs the name of a state (got {to!r}).")
        for earlier in current.transitions:
            if earlier.event == event and earlier.guard is None:
                raise exceptions.WorkflowDefinitionError(
                    f"Machine {self._name!r}: state {current.name!r} has two transitions on "
                    f"{event!r} (to {earlier.to!r} and to {to!r}), and the first has no guard, "
                    "so the second could never be taken; give the first a guard=, or remove "
                    "one.")
        transition = _Transition(event.strip(), to, _guard_path(self._name, guard), _inline_action(
            self._name, f"the action of the transition of state {current.name!r} on {event!r}",
            action))
        states = (*self._states[:-1],
                  replace(current, transitions=(*current.transitions, transition)))
        return self._copy(states)

    # -- options of the workflow it compiles to -------------------------------------------

    def version(self, label: str) -> MachineBuilder:
        """Label this definition (shown by status, the admin and exports)."""
        return self._copy(workflow=self._workflow.version(label))

    def retry(self, policy: RetryPolicy | None = None, **options: Any) -> MachineBuilder:
        """Set the default retry policy of the machine's steps (as a workflow's)."""
        return self._copy(workflow=self._workflow.retry(policy, **options))

    def on_queue(self, queue: str) -> MachineBuilder:
        """Send the machine's step messages to ``queue``."""
        return self._copy(workflow=self._workflow.on_queue(queue))

    def max_transitions(self, limit: int) -> MachineBuilder:
        """Bound the run's step boundaries (each event costs two or three)."""
        return self._copy(workflow=self._workflow.max_transitions(limit))

    # -- building ----------------------------------------------------------------------------

    def table(self) -> dict[str, Any]:
        """The machine's table (JSON), validated: what the definition stores."""
        self._validate()
        return {
            "initial": self._states[0].name,
            "states": {s.name: {
                "final": s.final,
                "on_enter": s.on_enter, "on_exit": s.on_exit, "timeout": s.timeout,
                "transitions": [{"event": t.event, "to": t.to, "guard": t.guard,
                                 "action": t.action} for t in s.transitions],
            } for s in self._states},
        }

    def compile(self) -> WorkflowBuilder:
        """The workflow builder this machine compiles to (validated)."""
        table = self.table()
        flow = self._workflow.machine_table(table)
        for state in self._states:
            if not state.final:
                flow = _state_steps(flow, state, table)
        return flow.then(END_HANDLER, name=END_STEP, cost_units=0)

    def build(self) -> WorkflowSpec:
        """Return the compiled, immutable definition."""
        return self.compile().build()

    @property
    def definition_hash(self) -> str:
        """The compiled definition's hash (as a workflow's)."""
        return self.build().definition_hash

    def start(self, payload: dict[str, Any] | None = None, *, key: str | None = None) -> int:
        """Start a run of the machine in its initial state; return the run id.

        ``key`` makes the machine one per key: while a run of this machine with that key is
        live, the start writes nothing and returns the live run's id (an idempotent start;
        ``singleton=True, on_conflict="existing"`` of ``queuety.start()``). Once that run has
        finished, the next start with the key starts a new one.
        """
        flow = self.compile()
        if key is None:
            return flow.dispatch(payload)
        return flow.dispatch(payload, key=key, singleton=True, on_conflict="existing")

    # -- checks -----------------------------------------------------------------------------

    def _check_new_state(self, name: str) -> None:
        if not isinstance(name, str) or not _STATE_NAME.match(name):
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r}: state names are 1 to 100 letters, digits, '_' or "
                f"'-' (got {name!r}).")
        if any(s.name == name for s in self._states):
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r} declares state {name!r} twice; add its transitions "
                "after its one .state() call.")

    def _validate(self) -> None:
        if not self._states:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r} has no states; declare one with .state(name).")
        names = {s.name for s in self._states}
        if self._states[0].final:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r}: its initial state {self._states[0].name!r} is final; "
                "declare a state that waits for events first.")
        if not any(s.final for s in self._states):
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r} has no final state; declare one with .final(name), "
                "so its runs can complete.")
        for state in self._states:
            _check_state(self._name, state, names)
        reached, todo = set(), [self._states[0].name]
        by_name = {s.name: s for s in self._states}
        while todo:
            name = todo.pop()
            if name not in reached:
                reached.add(name)
                todo += [t.to for t in by_name[name].transitions]
        stranded = [s.name for s in self._states if s.name not in reached]
        if stranded:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {self._name!r} has states no transition leads to from "
                f"{self._states[0].name!r}: {', '.join(map(repr, stranded))}; add a "
                "transition to them or remove them.")

    def __repr__(self) -> str:
        return f"<MachineBuilder {self._name!r}: {', '.join(s.name for s in self._states)}>"


def _check_state(machine: str, state: _State, names: set[str]) -> None:
    """Refuse unknown targets, a state without events and a timeout without its transition."""
    for t in state.transitions:
        if t.to not in names:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {machine!r}: the transition of state {state.name!r} on {t.event!r} "
                f"goes to {t.to!r}, which is not a state; its states are "
                f"{', '.join(map(repr, sorted(names)))}.")
    if state.final:
        return
    events = {t.event for t in state.transitions}
    timed = TIMEOUT_EVENT in events
    if state.timeout is None and timed:
        raise exceptions.WorkflowDefinitionError(
            f"Machine {machine!r}: state {state.name!r} has a 'timeout' transition but no "
            "timeout; give it .state(..., timeout=timedelta(...)).")
    if state.timeout is not None and not timed:
        raise exceptions.WorkflowDefinitionError(
            f"Machine {machine!r}: state {state.name!r} has a timeout but no 'timeout' "
            "transition; add .on('timeout', to='<state>').")
    if not events - {TIMEOUT_EVENT}:
        raise exceptions.WorkflowDefinitionError(
            f"Machine {machine!r}: state {state.name!r} has no events to wait for; add one "
            "with .on(event, to=...), or make it .final().")


def _inline_action(machine: str, what: str, action: Any) -> str | None:
    """The dotted path of an exit or transition action, refused when it is a generator or a
    ``Step`` class with options the transition's step could not honour (its retry, timeout,
    queue, ...): those actions run inside that step, not as steps of their own."""
    if action is None:
        return None
    path, obj = resolve_handler(action)
    function = getattr(obj, "handle", None) if isinstance(obj, type) else obj
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise exceptions.WorkflowDefinitionError(
            f"Machine {machine!r}: {what}, {path!r}, is a generator; exit and transition "
            "actions run inside the transition's step and cannot stream. Stream from an "
            "entry action (on_enter=), which is a step of its own.")
    if isinstance(obj, type):
        ignored = [o for o in _STEP_ONLY_OPTIONS if getattr(obj, o, None) not in (None, False)]
        if ignored:
            raise exceptions.WorkflowDefinitionError(
                f"Machine {machine!r}: {what}, the Step class {path!r}, sets "
                f"{', '.join(ignored)}, which it could not honour: exit and transition "
                "actions run inside the transition's step, under the state's retry= (or the "
                "machine's). Remove them from the class, or make the work an entry action "
                "(on_enter=), which is a step of its own.")
    return path


def _guard_path(machine: str, guard: Any) -> str | None:
    """The dotted path of a guard function, checked to import back to it."""
    if guard is None:
        return None
    if isinstance(guard, type):
        raise exceptions.WorkflowDefinitionError(
            f"Machine {machine!r}: a guard is a function guard(state, payload) -> bool "
            f"(got the class {guard!r}).")
    try:
        return resolve_handler(guard)[0]
    except exceptions.WorkflowDefinitionError as error:
        raise exceptions.WorkflowDefinitionError(
            f"Machine {machine!r}: the guard is refused: {error}") from None


def entry_step(table: dict[str, Any], state: str) -> str:
    """The step a transition into ``state`` goes to: its entry action, else its wait (the
    end step for a final state)."""
    spec = table["states"][state]
    if spec["final"]:
        return END_STEP
    return state if spec["on_enter"] else f"{state}.wait"


def _state_steps(flow: WorkflowBuilder, state: _State, table: dict[str, Any]) -> WorkflowBuilder:
    """Append the steps of the non-final ``state``."""
    if state.on_enter is not None:
        flow = flow.then(state.on_enter, name=state.name)
    events = sorted({t.event for t in state.transitions} - {TIMEOUT_EVENT})
    wait = f"{state.name}.wait"
    timed = state.timeout is not None
    flow = flow.wait_for_signals(
        events, mode="any", result_key=EVENT_KEY, name=wait,
        timeout=state.timeout, on_timeout=f"{state.name}.timeout" if timed else None)

    def routes(event_filter: Any) -> dict[Any, str]:
        targets = {entry_step(table, t.to) for t in state.transitions if event_filter(t.event)}
        return {target: target for target in sorted(targets | {wait})}

    flow = flow.route(TRANSITION_HANDLER, routes(lambda e: e != TIMEOUT_EVENT),
                      name=f"{state.name}.route", retry=state.retry, cost_units=0)
    if timed:
        flow = flow.route(TRANSITION_HANDLER, routes(lambda e: e == TIMEOUT_EVENT),
                          name=f"{state.name}.timeout", retry=state.retry, cost_units=0)
    return flow


def initial_state(machine: str, initial: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The first state of a run: the checked ``payload`` (a JSON object) and the bookkeeping
    of the initial state. Every start of a machine passes through it (``queuety.dispatch``).

    Raises:
        InvalidPayload: the payload uses the machine's keys (so a start could not forge the
            machine's state or history).
    """
    taken = sorted({MACHINE_KEY, EVENT_KEY} & set(payload))
    if taken:
        raise exceptions.InvalidPayload(
            f"The payload of machine {machine!r} uses {', '.join(map(repr, taken))}, which the "
            "machine keeps its own bookkeeping under (its state, history and last event); "
            "rename them. Nothing was started.")
    return {**payload, MACHINE_KEY: {"state": initial, "history": [], "transitions": 0}}


def table_paths(table: dict[str, Any] | None) -> list[str]:
    """Every dotted path a machine's table makes a worker import: entry and exit actions,
    guards and transition actions (a replayed document's are checked like its handlers)."""
    paths: list[str] = []
    for state in ((table or {}).get("states") or {}).values():
        paths += [state.get("on_enter"), state.get("on_exit")]
        for t in state.get("transitions") or []:
            paths += [t.get("guard"), t.get("action")]
    return [p for p in paths if isinstance(p, str) and p]


def machine(name: str) -> MachineBuilder:
    """Start declaring the state machine called ``name``."""
    return MachineBuilder(name)
