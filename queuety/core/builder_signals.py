"""The builder's signal waits: a run parked until signals arrive, or until a person approves,
decides or submits input.

:class:`SignalSteps` is a mixin of :class:`~queuety.core.builder.WorkflowBuilder`, which holds
the steps; these methods only declare them (``core/waits.py`` settles them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from queuety import exceptions
from queuety.core import waits
from queuety.core.definition import StepSpec, WaitStep


class SignalSteps:
    """Waits for signals, approvals, decisions and input."""

    __slots__ = ()

    # What these methods use of WorkflowBuilder, the one class that inherits them.
    _steps: tuple[StepSpec, ...]

    if TYPE_CHECKING:
        def _append(self, step: StepSpec) -> Self:
            ...

    def _wait(self, default_name: str, name: str | None, **options: Any) -> Self:
        step_name = name if name is not None else default_name
        if not isinstance(step_name, str) or not step_name.strip():
            raise exceptions.WorkflowDefinitionError(
                f"Wait step names must be non-blank strings (got {name!r})."
            )
        signals = options.pop("signals")
        options.update(waits.wait_timing(
            step_name, options.pop("timeout", None), options.pop("on_timeout", None),
            options.pop("remind_after", None), options.pop("remind_every", None)))
        if isinstance(signals, str) or not all(isinstance(s, str) for s in signals):
            raise exceptions.WorkflowDefinitionError(
                f"Signal names must be a list of strings (got {signals!r})."
            )
        spec = WaitStep(name=step_name.strip(), cost_units=0,
                        wait=waits.WaitSpec(signals=tuple(s.strip() for s in signals), **options))
        return self._append(spec)

    def wait_for_signal(self, signal: str, result_key: str | None = None, *,
                        match_payload: dict[str, Any] | None = None,
                        correlation_key: str | None = None,
                        name: str | None = None, timeout: waits.Timeout = None,
                        on_timeout: str | None = None, remind_after: waits.Timeout = None,
                        remind_every: waits.Timeout = None) -> Self:
        """Park the run until the signal ``signal`` arrives (or was already sent).

        Args:
            result_key: store the signal's data under this key (default: merge a dict's keys).
            match_payload: only signals whose data contains this count.
            correlation_key: only signals whose data has the run state's value for this key.
            name: the step name (default ``wait_for_<signal>``).
            timeout: a ``timedelta`` (or seconds) after which the sweeper settles the wait
                if no signal did; every ``wait_for_*`` method takes it.
            on_timeout: what the timeout does: ``"fail"`` the run (the default),
                ``"continue"`` to the next step, or the name of a step to jump to. A
                signal or reply after the timeout is refused with ``WaitExpired``.
            remind_after: a ``timedelta`` (or seconds) after which, the run still waiting,
                the sweeper sends a reminder (the ``run_reminder`` signal, the
                ``wait.reminder`` webhook event and a ``wait_reminder`` timeline event);
                alone, that is the one reminder. Every ``wait_for_*`` method takes it.
            remind_every: repeat the reminder at this interval while the run waits (the
                first one after ``remind_after``, or after ``remind_every`` without it).
                No reminder is sent once the wait has ended.
        """
        return self._wait(f"wait_for_{signal}", name, signals=[signal], result_key=result_key,
                          match_payload=match_payload, correlation_key=correlation_key, timeout=timeout,
                          on_timeout=on_timeout, remind_after=remind_after,
                          remind_every=remind_every)

    def wait_for_signals(self, signals: list[str], mode: str = "all",
                         result_key: str | None = None, *,
                         match_payload: dict[str, Any] | None = None,
                         correlation_key: str | None = None,
                         name: str | None = None, timeout: waits.Timeout = None,
                         on_timeout: str | None = None, remind_after: waits.Timeout = None,
                        remind_every: waits.Timeout = None) -> Self:
        """Park the run until ``all`` (or ``any``) of ``signals`` arrived."""
        return self._wait(f"wait_for_signals_{len(self._steps)}", name, signals=list(signals),
                          mode=mode, result_key=result_key, match_payload=match_payload,
                          correlation_key=correlation_key, timeout=timeout,
                          on_timeout=on_timeout, remind_after=remind_after,
                          remind_every=remind_every)

    def wait_for_approval(self, signal: str = waits.DEFAULT_APPROVE_SIGNAL,
                          result_key: str | None = "approval", *,
                          name: str | None = None, timeout: waits.Timeout = None,
                          on_timeout: str | None = None, remind_after: waits.Timeout = None,
                        remind_every: waits.Timeout = None) -> Self:
        """Park the run until a person approves it (``queuety.approve()`` or the API)."""
        return self._wait("wait_for_approval", name, signals=[signal], result_key=result_key,
                          human=waits.APPROVAL, timeout=timeout, on_timeout=on_timeout,
                          remind_after=remind_after, remind_every=remind_every)

    def wait_for_decision(self, approve_signal: str = waits.DEFAULT_APPROVE_SIGNAL,
                          reject_signal: str = waits.DEFAULT_REJECT_SIGNAL,
                          result_key: str | None = "decision", *,
                          name: str | None = None, timeout: waits.Timeout = None,
                          on_timeout: str | None = None, remind_after: waits.Timeout = None,
                        remind_every: waits.Timeout = None) -> Self:
        """Park the run until a person approves or rejects it.

        Merges ``{result_key: {"outcome": "approved"|"rejected", "signal": ..., "data": ...}}``.
        ``queuety.approve()`` and ``queuety.reject()`` satisfy it.
        """
        return self._wait("wait_for_decision", name, signals=[approve_signal, reject_signal],
                          mode=waits.ANY, result_key=result_key, human=waits.DECISION,
                          decision={approve_signal: "approved", reject_signal: "rejected"},
                          timeout=timeout, on_timeout=on_timeout, remind_after=remind_after,
                          remind_every=remind_every)

    def wait_for_input(self, schema: dict[str, Any] | None = None,
                       signal: str = waits.DEFAULT_INPUT_SIGNAL,
                       result_key: str | None = "input", *,
                       name: str | None = None, timeout: waits.Timeout = None,
                       on_timeout: str | None = None, remind_after: waits.Timeout = None,
                        remind_every: waits.Timeout = None) -> Self:
        """Park the run until a person submits input (``queuety.submit_input()``).

        Args:
            schema: a JSON Schema (draft 2020-12) the reply must satisfy exactly as sent;
                checked when the workflow is built.
        """
        return self._wait("wait_for_input", name, signals=[signal], result_key=result_key,
                          human=waits.INPUT, schema=schema, timeout=timeout,
                          on_timeout=on_timeout, remind_after=remind_after,
                          remind_every=remind_every)
