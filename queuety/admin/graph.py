"""The workflow graph on the admin's definition page and run page (``queuety.core.graph``
lays it out, ``queuety.core.graph_svg`` draws it): server-side SVG in a collapsible section
with its legend, no script and nothing from a CDN.

On the run page the graph carries what the run did, read from two places: the timeline's
events that close a visit of a step (in the order they happened: the run's path) and the
run's step rows (each step's latest visit: its status and attempts), and its compensation
rows (the compensation nodes' status after a cancel).
"""

from __future__ import annotations

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from queuety.core.definition import WorkflowSpec
from queuety.core.graph import Graph, layout, run_overlay
from queuety.core.graph_svg import legend, render
from queuety.models import Event, StepRun, WorkflowRun

#: The timeline events that close one visit of a step (the step they name is behind the run).
PASSED = ("step_completed", "for_each_settled", "wait_settled", "wait_timed_out",
          "repeat_evaluated", "workflows_started", "child_finished")

#: At most this many of a run's events and step rows are read for its graph: a run looping
#: for days still draws quickly (its earliest visits are then left out of the counts).
READ_LIMIT = 20_000


def definition_graph(spec: WorkflowSpec) -> SafeString:
    """The definition page's graph section: the workflow's steps, routes and branches."""
    return _section(layout(spec), with_statuses=False)


def run_graph(run: WorkflowRun, spec: WorkflowSpec) -> SafeString:
    """The run page's graph section: the definition's graph with each step's status and
    attempts, and the run's path emphasised."""
    steps = len(spec.steps)
    path = [index for index in reversed(
        Event.objects.filter(run_id=run.pk, kind__in=PASSED, step_index__isnull=False)
        .order_by("-pk").values_list("step_index", flat=True)[:READ_LIMIT])
        if index is not None and index < steps]
    rows = list(StepRun.objects.filter(run_id=run.pk, kind="step", step_index__lt=steps)
                .order_by("-seq").values_list("step_index", "branch", "seq", "status",
                                              "attempt")[:READ_LIMIT])
    undone = StepRun.objects.filter(run_id=run.pk, kind="compensation").values_list(
        "step_index", "status", "attempt")[:READ_LIMIT]
    graph = run_overlay(layout(spec, status_line=True), spec, path=path, rows=rows,
                        run_status=run.status, current_step=run.current_step,
                        undone=list(undone))
    return _section(graph, with_statuses=True)


def _section(graph: Graph, *, with_statuses: bool) -> SafeString:
    # The SVG's every text is escaped by graph_svg.render (tests/unit/test_graph.py).
    svg = mark_safe(render(graph))  # noqa: S308
    key = mark_safe(legend(with_statuses=with_statuses))  # noqa: S308
    return format_html(
        '<details class="q-graph-section" id="workflow-graph" open>'
        "<summary>{} steps: show or hide the graph</summary>"
        '<div class="q-graph-legend">{}</div>'
        '<div class="q-graph-scroll" style="max-height:80vh;overflow:auto;'
        'border:1px solid var(--hairline-color);margin-top:6px">{}</div></details>',
        len(graph.step_nodes()), key, svg)
