"""Signal waits: which stored signals satisfy a wait, and what the wait merges into the state.

Pure Python (jsonschema is the only library). A wait step holds no worker and no message: the
service layer parks the run and settles the wait when a signal arrives, or at once when matching
signals were stored before the wait was reached. A settled wait CONSUMES the signals it used, so
a wait entered again (a loop) waits for new ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import jsonschema
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from queuety import exceptions

ALL, ANY = "all", "any"

#: Human wait kinds and the signal names their defaults listen to.
APPROVAL, DECISION, INPUT = "approval", "decision", "input"
DEFAULT_APPROVE_SIGNAL = "approval"
DEFAULT_REJECT_SIGNAL = "rejection"
DEFAULT_INPUT_SIGNAL = "input"

#: What a wait's timeout may do besides jumping to a named step.
ON_TIMEOUT_FAIL, ON_TIMEOUT_CONTINUE = "fail", "continue"
#: The outcome a timed-out decision records (beside ``approved`` and ``rejected``).
TIMED_OUT = "timed_out"

#: The draft every input schema is checked against when the workflow is built.
SCHEMA_VALIDATOR = jsonschema.Draft202012Validator


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitSpec:
    """What a wait step waits for."""

    signals: tuple[str, ...]
    mode: str = ALL
    result_key: str | None = None
    match_payload: dict[str, Any] | None = None
    """The payload must contain this (recursively, with exact JSON types) to count."""
    correlation_key: str | None = None
    """The payload's value for this key must equal the run state's."""
    human: str | None = None
    """``approval``, ``decision`` or ``input``: a wait on a person (listed by ``GET waits/``)."""
    decision: dict[str, str] = field(default_factory=dict)
    """For decisions: signal name -> outcome (``approved`` / ``rejected``)."""
    schema: dict[str, Any] | None = None
    """For input: the JSON Schema a reply must satisfy, exactly as sent."""
    timeout: float | None = None
    """Seconds the run waits before the sweeper settles the wait by timeout (None: forever)."""
    on_timeout: str = ON_TIMEOUT_FAIL
    """What a timeout does: ``fail`` the run, ``continue`` to the next step, or a step name
    to jump to."""
    remind_after: float | None = None
    """Seconds after the run parks here before its first reminder (see :func:`first_reminder`)."""
    remind_every: float | None = None
    """Seconds between reminders while the run stays parked here."""

    def __post_init__(self) -> None:
        if not self.signals or not all(isinstance(s, str) and s.strip() for s in self.signals):
            raise exceptions.WorkflowDefinitionError(
                f"A signal wait needs at least one non-blank signal name (got {self.signals!r})."
            )
        if len(set(self.signals)) != len(self.signals):
            raise exceptions.WorkflowDefinitionError(
                f"A signal wait lists a signal twice: {list(self.signals)!r}."
            )
        if self.mode not in (ALL, ANY):
            raise exceptions.WorkflowDefinitionError(
                f"Signal waits support mode 'all' or 'any' (got {self.mode!r})."
            )
        if self.match_payload is not None and not isinstance(self.match_payload, dict):
            raise exceptions.WorkflowDefinitionError(
                f"match_payload must be a dict (got {type(self.match_payload).__name__})."
            )
        if self.schema is not None:
            check_schema(self.schema)
        check_timing(self.timeout, self.on_timeout, self.remind_after, self.remind_every)

    @property
    def timeout_target(self) -> str | None:
        """The step a timeout jumps to, when ``on_timeout`` names one."""
        return jump_target(self.on_timeout)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form stored in the definition."""
        data: dict[str, Any] = {
            "signals": list(self.signals), "mode": self.mode, "result_key": self.result_key,
            "match_payload": self.match_payload, "correlation_key": self.correlation_key,
            "human": self.human, "decision": dict(self.decision), "schema": self.schema}
        data.update(timing_dict(self.timeout, self.on_timeout, self.remind_after,
                                self.remind_every))
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WaitSpec:
        """Rebuild from :meth:`to_dict` output."""
        return cls(**{**data, "signals": tuple(data["signals"])})


#: What ``timeout=`` takes: a timedelta, seconds, or None for no timeout.
Timeout = timedelta | float | int | None


def _positive_seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) \
        and 0 < value < math.inf


def jump_target(on_timeout: str) -> str | None:
    """The step a wait's timeout jumps to, when ``on_timeout`` names one."""
    return None if on_timeout in (ON_TIMEOUT_FAIL, ON_TIMEOUT_CONTINUE) else on_timeout


def check_timing(timeout: float | None, on_timeout: str, remind_after: float | None,
                 remind_every: float | None) -> None:
    """Refuse a wait's timeout and reminder options that cannot work (every wait kind has
    them: signal waits and workflow waits alike).

    Raises:
        WorkflowDefinitionError: a duration is not a positive number of seconds, or
            ``on_timeout`` is blank or given without a timeout.
    """
    for option, value in (("timeout", timeout), ("remind_after", remind_after),
                          ("remind_every", remind_every)):
        if value is not None and not _positive_seconds(value):
            raise exceptions.WorkflowDefinitionError(
                f"A wait's {option} must be a positive number of seconds or a timedelta "
                f"(got {value!r}).")
    if not isinstance(on_timeout, str) or not on_timeout.strip():
        raise exceptions.WorkflowDefinitionError(
            f"on_timeout must be 'fail', 'continue' or the name of a step (got "
            f"{on_timeout!r}).")
    if timeout is None and on_timeout != ON_TIMEOUT_FAIL:
        raise exceptions.WorkflowDefinitionError(
            f"on_timeout={on_timeout!r} is given without a timeout; add "
            "timeout=timedelta(...) to the wait, or drop on_timeout.")


def timing_dict(timeout: float | None, on_timeout: str, remind_after: float | None,
                remind_every: float | None) -> dict[str, Any]:
    """The JSON of a wait's timeout and reminders: only the options that are set, so the
    definitions that set none keep their hashes."""
    data: dict[str, Any] = {}
    if timeout is not None:
        data.update(timeout=timeout, on_timeout=on_timeout)
    if remind_after is not None:
        data["remind_after"] = remind_after
    if remind_every is not None:
        data["remind_every"] = remind_every
    return data


def wait_timing(step_name: str, timeout: Timeout, on_timeout: str | None,
                remind_after: Timeout = None, remind_every: Timeout = None) -> dict[str, Any]:
    """The ``timeout``, ``on_timeout``, ``remind_after`` and ``remind_every`` options of a
    wait (durations in seconds), from the builder's arguments; only those given.

    Raises:
        WorkflowDefinitionError: a duration is not a positive timedelta or number.
    """
    options = wait_timeout(step_name, timeout, on_timeout)
    for option, value in (("remind_after", remind_after), ("remind_every", remind_every)):
        if value is None:
            continue
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        if not _positive_seconds(seconds):
            raise exceptions.WorkflowDefinitionError(
                f"{option} of wait {step_name!r} must be a positive timedelta or number of "
                f"seconds (got {value!r}).")
        options[option] = float(seconds)
    return options


def first_reminder(remind_after: float | None, remind_every: float | None) -> float | None:
    """Seconds from parking to a wait's first reminder: ``remind_after``, else
    ``remind_every``; ``None`` when the wait has no reminders."""
    return remind_after if remind_after is not None else remind_every


def next_reminder(due: datetime, now: datetime, remind_every: float | None
                  ) -> datetime | None:
    """When the reminder after the one due at ``due`` (sent at ``now``) is due: one
    ``remind_every`` later, but never in the past (a sweep that came late sends one
    reminder, not a burst); ``None`` when the wait does not repeat them."""
    if remind_every is None:
        return None
    following = due + timedelta(seconds=remind_every)
    return following if following > now else now + timedelta(seconds=remind_every)


def wait_timeout(step_name: str, timeout: Timeout, on_timeout: str | None) -> dict[str, Any]:
    """The ``timeout`` (in seconds) and ``on_timeout`` options of a wait, from the builder's
    arguments; empty when neither is given.

    Raises:
        WorkflowDefinitionError: the timeout is not a positive timedelta or number.
    """
    if timeout is None and on_timeout is None:
        return {}
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, int | float) or not 0 < timeout < math.inf):
        raise exceptions.WorkflowDefinitionError(
            f"timeout of wait {step_name!r} must be a positive timedelta or number of "
            f"seconds (got {timeout!r}).")
    return {"timeout": None if timeout is None else float(timeout),
            "on_timeout": ON_TIMEOUT_FAIL if on_timeout is None else on_timeout}


def check_schema(schema: Any) -> None:
    """Refuse, at build time, a schema that could not validate replies (criterion H6)."""
    if not isinstance(schema, dict):
        raise exceptions.WorkflowDefinitionError(
            f"wait_for_input(schema=...) takes a JSON Schema object (a dict), got "
            f"{type(schema).__name__}."
        )
    try:
        SCHEMA_VALIDATOR.check_schema(schema)
    except jsonschema.SchemaError as error:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise exceptions.WorkflowDefinitionError(
            f"The input schema is not a valid JSON Schema (draft 2020-12) at {where}: "
            f"{error.message}."
        ) from None
    # A reference must resolve inside the schema itself: one that resolves nowhere (or to a
    # remote document, which is never fetched) would fail every reply instead.
    resolver = Registry().with_resource(_SCHEMA_URI, DRAFT202012.create_resource(schema)) \
        .resolver(base_uri=_SCHEMA_URI)
    for ref in _references(schema):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise exceptions.WorkflowDefinitionError(
                f"The input schema's $ref {ref!r} resolves to nothing inside the schema; "
                "define what it names (under $defs) or remove it. Remote schemas are not "
                "fetched.") from None


#: The address a checked schema is resolved under (its own ``$ref`` values are relative).
_SCHEMA_URI = "urn:queuety:input-schema"


def _references(node: Any) -> Iterator[str]:
    """Every ``$ref`` string in a schema, at any depth."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def validation_errors(schema: dict[str, Any], data: Any) -> list[dict[str, str]]:
    """Return every way ``data`` fails ``schema``, as ``{path, message}``; empty when valid.

    Values are checked exactly as sent: the text ``"42"`` is a string, never a number.
    """
    validator = SCHEMA_VALIDATOR(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(e.absolute_path), e.message))
    return [{"path": "/" + "/".join(str(p) for p in e.absolute_path), "message": e.message}
            for e in errors]


# -- matching ---------------------------------------------------------------------------------

def same_json(a: Any, b: Any) -> bool:
    """Compare as JSON values: 1, 1.0, True and "1" are four different values."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return type(a) is type(b) and a == b and not (isinstance(a, float) and math.isnan(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def contains(payload: Any, subset: Any) -> bool:
    """True if ``payload`` has every key of ``subset`` with the same value (recursively)."""
    if isinstance(subset, dict):
        return isinstance(payload, dict) and all(
            key in payload and contains(payload[key], value) for key, value in subset.items())
    return same_json(payload, subset)


def matches(wait: WaitSpec, payload: Any, state: dict[str, Any]) -> bool:
    """True if a signal with ``payload`` counts for ``wait`` in a run whose state is ``state``."""
    if wait.match_payload and not contains(payload, wait.match_payload):
        return False
    if wait.correlation_key is not None:
        key = wait.correlation_key
        return (isinstance(payload, dict) and key in payload and key in state
                and same_json(payload[key], state[key]))
    return True


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Where a wait stands against the stored signals."""

    settled: bool
    matched: list[str]
    remaining: list[str]
    consumed: list[int]
    """Ids of the signals a settled wait uses (one per name, or one for ``any``)."""
    output: dict[str, Any]
    chosen: list[tuple[str, Any]]


def evaluate(wait: WaitSpec, signals: list[tuple[int, str, Any]],
             state: dict[str, Any]) -> Evaluation:
    """Evaluate ``wait`` against unconsumed ``signals`` (``(id, name, payload)``, oldest first).

    Per name the earliest matching signal counts; ``any`` takes the earliest matching overall.
    """
    earliest: dict[str, tuple[int, Any]] = {}
    for signal_id, name, payload in signals:
        if name in wait.signals and name not in earliest and matches(wait, payload, state):
            earliest[name] = (signal_id, payload)
    matched = [name for name in wait.signals if name in earliest]
    remaining = [name for name in wait.signals if name not in earliest]
    if wait.mode == ANY and matched:
        first = min(matched, key=lambda name: earliest[name][0])
        chosen = [(first, earliest[first][1])]
    elif wait.mode == ALL and not remaining:
        chosen = [(name, earliest[name][1]) for name in wait.signals]
    else:
        return Evaluation(False, matched, remaining, [], {}, [])
    consumed = [earliest[name][0] for name, _ in chosen]
    return Evaluation(True, matched, remaining, consumed, output(wait, chosen), chosen)


def output(wait: WaitSpec, chosen: list[tuple[str, Any]]) -> dict[str, Any]:
    """Return what a settled wait merges into the state (the original's shapes).

    - decision: ``{result_key: {outcome, signal, data}}``;
    - a result_key and one signal name: ``{result_key: payload}``;
    - a result_key and several names: ``{result_key: {name: payload, ...}}``;
    - no result_key: dict payloads merged top-level in the configured order (``_`` keys
      skipped); any other payload stored under its signal's name.
    """
    if wait.decision:
        name, payload = chosen[0]
        record = {"outcome": wait.decision.get(name, name), "signal": name, "data": payload}
        if wait.result_key:
            return {wait.result_key: record}
        merged: dict[str, Any] = {"decision_outcome": record["outcome"], "decision_signal": name}
        if isinstance(payload, dict):
            merged.update({k: v for k, v in payload.items() if not k.startswith("_")})
        return merged
    if wait.result_key:
        if len(wait.signals) == 1:
            return {wait.result_key: chosen[0][1]}
        return {wait.result_key: dict(chosen)}
    merged = {}
    for name, payload in chosen:
        if isinstance(payload, dict):
            merged.update({k: v for k, v in payload.items() if not k.startswith("_")})
        else:
            merged[name] = payload
    return merged


def timeout_output(wait: WaitSpec) -> dict[str, Any]:
    """Return what a wait settled by its timeout merges into the state (for ``continue`` and
    a jump): a decision records the outcome ``timed_out``; a wait with a ``result_key``
    sets it to ``None``, so the next step can tell that no reply came; a wait without one
    merges nothing."""
    if wait.decision:
        record = {"outcome": TIMED_OUT, "signal": None, "data": None}
        if wait.result_key:
            return {wait.result_key: record}
        return {"decision_outcome": TIMED_OUT, "decision_signal": None}
    if wait.result_key:
        return {wait.result_key: None}
    return {}


def check_signal_data(run_id: int, name: Any, data: Any, limit: int) -> Any:
    """Return ``data`` if signal ``name`` may carry it to run ``run_id``: a non-blank name of
    at most 255 characters, and data that is JSON of at most ``limit`` bytes.

    Raises:
        InvalidSignalData: the name or the data is not acceptable; ``errors`` says where.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise exceptions.InvalidSignalData(
            f"Signal names are non-blank strings of at most 255 characters (got {name!r} for "
            f"run {run_id})."
        )
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise exceptions.InvalidSignalData(
            f"The data of signal {name!r} for run {run_id} is not JSON: {error}.",
            [{"path": "/", "message": str(error)}],
        ) from None
    except RecursionError:
        message = "it is nested too deeply"
        raise exceptions.InvalidSignalData(
            f"The data of signal {name!r} for run {run_id} is not storable JSON: {message}.",
            [{"path": "/", "message": message}],
        ) from None
    size = len(text.encode())
    if size > limit:
        raise exceptions.InvalidSignalData(
            f"The data of signal {name!r} for run {run_id} is {size} bytes; the limit is "
            f"{limit} (QUEUETY['MAX_SIGNAL_BYTES']).", too_large=True,
        )
    return data


def reply_signal(wait: WaitSpec, kind: str) -> str | None:
    """The signal a human reply of ``kind`` (``approve``, ``reject``, ``input``) sends to
    ``wait``, or ``None`` when that wait takes no reply of that kind. ``approve`` answers both
    an approval and a decision."""
    if kind == "approve" and wait.human == APPROVAL:
        return wait.signals[0]
    if kind in ("approve", "reject") and wait.human == DECISION:
        outcome = "approved" if kind == "approve" else "rejected"
        # A stored or hand-built decision may lack one of the two outcomes.
        return next((name for name, result in wait.decision.items() if result == outcome), None)
    if kind == "input" and wait.human == INPUT:
        return wait.signals[0]
    return None
