"""OpenTelemetry spans for runs and step attempts (the ``otel`` extra; off by default).

On when ``QUEUETY["TRACING"]`` is true and ``opentelemetry-api`` is installed; the site
configures the tracer provider and exporter as usual (the API alone records nothing). Then:

- ``dispatch()`` opens a span ``queuety.run <workflow>`` as a child of whatever span is current
  (a request's, a task's), and stores its W3C context (``traceparent``) with the run, in the
  row the dispatch writes anyway;
- each step attempt runs in a span ``queuety.step <workflow>.<step>`` whose parent is that run
  span, read back by the claim that already reads the run: an attempt executed hours later by
  another machine joins the same trace, at no extra query.

Attributes: ``queuety.workflow``, ``queuety.version``, ``queuety.run_id``, ``queuety.step``,
``queuety.step_run_id``, ``queuety.attempt``, ``queuety.status`` and, for a failed attempt,
``queuety.error.type`` and ``queuety.error.message`` (the span's status is then ERROR).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from queuety.conf import settings

_TRACER_NAME = "queuety"
_tracer: Any = None
_installed: bool | None = None


def enabled() -> bool:
    """Whether spans are recorded: ``TRACING`` on and the OpenTelemetry API importable."""
    global _installed
    if not settings.TRACING:
        return False
    if _installed is None:
        try:
            import opentelemetry.trace  # noqa: F401
        except ImportError:
            _installed = False
        else:
            _installed = True
    return _installed


def _get_tracer() -> Any:
    """The API's tracer, got once: a proxy that follows the provider the site sets, even one
    set after the first span."""
    global _tracer
    if _tracer is None:
        from opentelemetry import trace

        _tracer = trace.get_tracer(_TRACER_NAME)
    return _tracer


class Span:
    """What the engine sets on a span it opened (a no-op when tracing is off)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, **attributes: Any) -> None:
        """Set ``queuety.<name>`` attributes (``None`` values are skipped)."""
        if self._span is not None:
            self._span.set_attributes({f"queuety.{key}": value
                                       for key, value in attributes.items()
                                       if value is not None})

    def fail(self, error: BaseException, status: str) -> None:
        """Mark the span failed by ``error`` (the attempt's ``status``: retried, failed)."""
        if self._span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        cls = type(error)
        self.set(status=status, error_type=None)
        self._span.set_attributes({
            "queuety.error.type": f"{cls.__module__}.{cls.__qualname__}".removeprefix(
                "builtins."),
            "queuety.error.message": str(error)})
        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, f"{cls.__name__}: {error}"))


_OFF = Span()


@contextmanager
def run_span(workflow: str, version: str | None) -> Iterator[tuple[Span, str]]:
    """Open the run's span for a dispatch; yield it and the context to store with the run
    ('' when tracing is off)."""
    if not enabled():
        yield _OFF, ""
        return
    from opentelemetry import propagate, trace

    with _get_tracer().start_as_current_span(f"queuety.run {workflow}",
                                      kind=trace.SpanKind.PRODUCER) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        handle = Span(span)
        handle.set(workflow=workflow, version=version)
        yield handle, carrier.get("traceparent", "")


class _Off:
    """The context of an attempt when tracing is off: enters to the no-op span, nothing
    created per attempt."""

    def __enter__(self) -> Span:
        return _OFF

    def __exit__(self, *exc: object) -> None:
        return None


_OFF_CONTEXT = _Off()


def step_span(trace_context: str, workflow: str, version: str | None, step: str,
              **attributes: Any) -> AbstractContextManager[Span]:
    """A context that runs a step attempt in a span parented to the run's stored
    ``trace_context`` (a shared no-op when tracing is off)."""
    if not enabled():
        return _OFF_CONTEXT
    return _step_span(trace_context, workflow, version, step, attributes)


@contextmanager
def _step_span(trace_context: str, workflow: str, version: str | None, step: str,
               attributes: dict[str, Any]) -> Iterator[Span]:
    from opentelemetry import propagate, trace

    parent = propagate.extract({"traceparent": trace_context}) if trace_context else None
    with _get_tracer().start_as_current_span(f"queuety.step {workflow}.{step}", context=parent,
                                             kind=trace.SpanKind.CONSUMER,
                                             record_exception=False,
                                             set_status_on_exception=False) as span:
        handle = Span(span)
        handle.set(workflow=workflow, version=version, step=step, **attributes)
        yield handle


def work_span(name: str, *, remote: bool = True, **attributes: Any
              ) -> AbstractContextManager[Span]:
    """A context that records a piece of a step's work (an agent's model request or tool
    call) as a span under the current one, the attempt's (a shared no-op when tracing is
    off): a CLIENT span for a call out of the process (``remote``), else INTERNAL."""
    if not enabled():
        return _OFF_CONTEXT
    return _work_span(name, remote, attributes)


@contextmanager
def _work_span(name: str, remote: bool, attributes: dict[str, Any]) -> Iterator[Span]:
    from opentelemetry import trace

    kind = trace.SpanKind.CLIENT if remote else trace.SpanKind.INTERNAL
    with _get_tracer().start_as_current_span(name, kind=kind,
                                             record_exception=False,
                                             set_status_on_exception=False) as span:
        handle = Span(span)
        handle.set(**attributes)
        try:
            yield handle
        except BaseException as error:
            handle.fail(error, "failed")
            raise


def current_context() -> str:
    """The current span's W3C context, to store with a run created inside it (a child run
    started by a step); '' when tracing is off or no span is current."""
    if not enabled():
        return ""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")
