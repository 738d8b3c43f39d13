"""The workflow graph: the layout (every step a node, every route an edge, no overlap), the
run overlay (statuses, attempts, the path) and the SVG (escaped, sized by its viewBox)."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

import pytest

import queuety
from queuety.core import graph as graphs
from queuety.core.graph import layout, run_overlay, step_id
from queuety.core.graph_svg import legend, render
from tests import workflows

SVG = "{http://www.w3.org/2000/svg}"
CHILD = queuety.workflow("child").then(workflows.step_a).then(workflows.step_b)


def sink() -> queuety.WorkflowBuilder:
    """A workflow with every kind: routes (forward past steps), parallel, for_each, a wait
    with a timeout jump, a delay, a child run, a loop and a compensation."""
    return (queuety.workflow("sink")
            .then(workflows.step_a, name="reserve").compensate_with(workflows.undo)
            .route(workflows.classify, {"big": "pack", "small": "ship"}, name="triage")
            .parallel([workflows.step_b, workflows.step_c], name="pack")
            .for_each("items", workflows.run_task, name="each")
            .wait_for_signal("paid", name="paid", timeout=60, on_timeout="ship")
            .delay(seconds=5, name="pause")
            .run_workflow("child_run", CHILD)
            .then(workflows.increment, name="bump")
            .repeat_until("bump", "count", 3, name="again")
            .then(workflows.step_c, name="ship"))


def long_chain(n: int) -> queuety.WorkflowBuilder:
    builder = queuety.workflow("long")
    for i in range(n):
        builder = builder.then(workflows.step_a, name=f"step_{i:02d}_with_a_longish_name")
    return builder


def overlaps(a: graphs.Node, b: graphs.Node) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


def test_every_step_is_a_node_of_its_kind_and_no_two_nodes_overlap():
    spec = sink().build()
    graph = layout(spec)
    steps = graph.step_nodes()
    assert [n.label for n in steps] == [s.name for s in spec.steps]
    assert {n.label: n.kind for n in steps} == {
        "reserve": "task", "triage": "route", "pack": "parallel", "each": "for_each",
        "paid": "wait", "pause": "delay", "child_run": "child", "bump": "task",
        "again": "repeat", "ship": "task"}
    assert [n.label for n in graph.nodes if n.kind == "branch"] == ["step_b", "step_c"]
    assert [n.label for n in graph.nodes if n.kind == "compensation"] == ["undo reserve"]
    for a, b in itertools.combinations(graph.nodes, 2):
        assert not overlaps(a, b), (a, b)
    for node in graph.nodes:
        assert 0 <= node.x and node.x + node.w <= graph.width
        assert 0 <= node.y and node.y + node.h <= graph.height
    # Top to bottom, in the order the steps run.
    assert [n.y for n in steps] == sorted(n.y for n in steps)


def test_every_route_loop_timeout_and_compensation_is_an_edge():
    graph = layout(sink().build())
    edges = {(e.source, e.target): e for e in graph.edges}
    name = {n.id: n.label for n in graph.nodes}

    def edge(a: str, b: str) -> graphs.Edge:
        ids = {label: node_id for node_id, label in name.items()}
        return edges[(ids[a], ids[b])]

    assert edge("triage", "pack").kind == "route" and edge("triage", "pack").label == "big"
    assert edge("triage", "ship").label == "small"
    assert ("s1", "s2") in edges and ("s1", "s3") not in edges  # a route step has no "next"
    assert edge("pack", "step_b").kind == "branch" and edge("step_c", "each").kind == "join"
    assert edge("again", "bump").kind == "loop" and edge("again", "ship").label == "done"
    assert edge("paid", "ship").kind == "timeout" and edge("paid", "pause").kind == "next"
    assert edge("reserve", "undo reserve").kind == "compensation"
    assert edge("start", "reserve").kind == "next" and edge("ship", "end").kind == "next"
    for e in graph.edges:  # each starts on its source and ends on its target's border
        source, target = graph.node(e.source), graph.node(e.target)
        assert len(e.points) >= 2
        assert source.x <= e.points[0][0] <= source.x + source.w
        assert target.x <= e.points[-1][0] <= target.x + target.w


def test_edges_that_skip_layers_run_in_gutters_clear_of_every_node():
    graph = layout(sink().build())
    for e in graph.edges:
        for (x1, y1), (x2, y2) in itertools.pairwise(e.points[1:-1]):
            for node in graph.nodes:
                if node.id in (e.source, e.target):
                    continue
                left, right = sorted((x1, x2))
                top, bottom = sorted((y1, y2))
                crosses = (left < node.x + node.w and node.x < right or left == right
                           and node.x < left < node.x + node.w) and (
                    top < node.y + node.h and node.y < bottom or top == bottom
                    and node.y < top < node.y + node.h)
                assert not crosses, (e, node)
    back = [e for e in graph.edges if e.kind == "loop"][0]
    assert min(x for x, _ in back.points) < min(n.x for n in graph.nodes)  # the left gutter


def test_fifty_steps_fit_one_above_the_other_at_full_size():
    graph = layout(long_chain(50).build())
    steps = graph.step_nodes()
    assert len(steps) == 50
    assert all(n.w == graphs.NODE_W for n in steps)  # never shrunk to fit
    gaps = [b.y - (a.y + a.h) for a, b in itertools.pairwise(steps)]
    assert min(gaps) >= graphs.LAYER_GAP - 1e-9
    assert graph.height >= 50 * (graphs.NODE_H + graphs.LAYER_GAP)
    svg = ET.fromstring(render(graph))
    assert svg.get("viewBox") == f"0 0 {svg.get('width')} {svg.get('height')}"
    names = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "q-name"]
    assert names[0] == "step_00_with_a_longish_name" and len(names) == 50


@pytest.mark.parametrize("hostile", ["<script>alert(1)</script>", 'a"b&c\'d', "]]><x/>"])
def test_hostile_step_names_and_labels_are_escaped(hostile):
    spec = (queuety.workflow(hostile)
            .route(workflows.classify, {hostile: hostile}, name="route")
            .then(workflows.step_a, name=hostile).build())
    text = render(layout(spec))
    assert "<script" not in text and "<x/>" not in text
    svg = ET.fromstring(text)  # well-formed XML
    assert svg.find(f"{SVG}title").text == f"Workflow {hostile}"
    steps = [g.get("data-step") for g in svg.iter(f"{SVG}g") if g.get("data-step")]
    assert steps == ["route", hostile]
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "q-label"]
    assert labels == [hostile[:27] + "…" if len(hostile) > 28 else hostile]


def test_long_names_are_cut_to_fit_and_kept_whole_in_the_tooltip():
    name = "a_step_whose_name_is_much_longer_than_any_node_is_wide"
    svg = ET.fromstring(render(layout(queuety.workflow("w").then(workflows.step_a, name=name)
                                      .build())))
    node = next(g for g in svg.iter(f"{SVG}g") if g.get("data-step") == name)
    shown = next(t.text for t in node.iter(f"{SVG}text") if t.get("class") == "q-name")
    assert shown.endswith("…") and len(shown) == 32 and name in node.find(f"{SVG}title").text


def test_run_overlay_marks_statuses_attempts_and_the_path_taken():
    spec = sink().build()
    # reserve, triage (label small: to ship), ship running its second attempt.
    rows = [(0, 0, 1, "completed", 1), (1, 0, 2, "completed", 1), (9, 0, 3, "processing", 2)]
    graph = run_overlay(layout(spec, status_line=True), spec, path=[0, 1], rows=rows,
                        run_status="running", current_step=9)
    states = graph.states
    assert states["s0"].status == "done" and states["s1"].status == "done"
    assert states["s9"].status == "running" and states["s9"].attempts == 2
    assert {states[step_id(i)].status for i in range(2, 9)} == {"skipped"}
    assert graph.taken == {("start", "s0"), ("s0", "s1"), ("s1", "s9")}
    svg = ET.fromstring(render(graph))
    taken = [(g.get("data-source"), g.get("data-target")) for g in svg.iter(f"{SVG}g")
             if "q-taken" in (g.get("class") or "")]
    assert sorted(taken) == sorted(graph.taken)
    ship = next(g for g in svg.iter(f"{SVG}g") if g.get("data-step") == "ship")
    assert ship.get("data-status") == "running" and "q-status-running" in ship.get("class")
    assert "running · 2 attempts" in "".join(ship.itertext())


def test_run_overlay_of_a_loop_a_fan_out_a_wait_and_a_failure():
    spec = sink().build()
    rows = [(0, 0, 1, "completed", 1), (1, 0, 2, "completed", 1),
            (2, 0, 3, "completed", 1), (2, 1, 3, "completed", 3),
            (3, 0, 4, "completed", 1), (3, 1, 4, "failed", 2)]
    path = [0, 1, 2]
    graph = run_overlay(layout(spec, status_line=True), spec, path=path, rows=rows,
                        run_status="failed", current_step=3)
    assert graph.states["s3"].status == "failed"
    assert graph.states["s3"].branches == {0: "done", 1: "failed"}
    assert graph.states["s2b1"].status == "done" and graph.states["s2b1"].attempts == 3
    assert {("s2", "s2b0"), ("s2b0", "s3"), ("s2b1", "s3")} <= graph.taken
    assert "s4" not in graph.states  # not reached: no state, not "skipped"
    assert "1/2 items done" in render(graph)

    waiting = run_overlay(layout(spec), spec, path=[0, 1, 2, 3], rows=[],
                          run_status="waiting_for_signal", current_step=4)
    assert waiting.states["s4"].status == "waiting"
    looped = run_overlay(layout(spec), spec, path=[0, 1, 2, 3, 4, 5, 6, 7, 8, 7, 8, 7, 8, 9],
                         rows=[], run_status="completed", current_step=10)
    assert looped.states["s7"].visits == 3 and ("s8", "s7") in looped.taken
    assert ("s9", "end") in looped.taken and looped.states["s9"].status == "done"


def test_the_legend_shows_each_kind_and_on_a_run_each_status():
    plain, with_statuses = legend(), legend(with_statuses=True)
    ET.fromstring(plain)
    for status in graphs.STATUSES:
        assert f"q-status-{status}" in with_statuses and f"q-status-{status}" not in plain
    assert re.findall(r"q-kind-(\w+)", plain)[:4] == ["task", "route", "wait", "parallel"]


def test_a_long_handler_path_keeps_its_end():
    spec = queuety.workflow("w").then(workflows.step_a, name="a").build()
    step = spec.steps[0]
    long_path = "very.deep.package." * 4 + "the_handler"
    graph = layout(spec)
    node = graph.node("s0")
    drawn = render(graphs.Graph("w", (graphs.Node("s0", "task", "a", long_path, node.x, node.y,
                                                  node.w, node.h, 0),), (), graph.width,
                                graph.height))
    detail = next(t.text for t in ET.fromstring(drawn).iter(f"{SVG}text")
                  if t.get("class") == "q-detail")
    assert detail.startswith("…") and detail.endswith("package.the_handler")
    assert graphs.step_detail(step) == "tests.workflows.step_a"


def test_a_cancelled_runs_compensations_are_coloured():
    spec = sink().build()
    graph = run_overlay(layout(spec), spec, path=[0, 1], rows=[], run_status="cancelled",
                        current_step=2, undone=[(0, "completed", 1), (5, "completed", 1)])
    assert graph.states["s0c"].status == "done"
    assert "s5c" not in graph.states  # step 5 has no compensation: no node to colour
    assert 'data-node="s0c" data-status="done"' in render(graph)
