"""A workflow drawn as a graph: its definition laid out as nodes and edges, top to bottom.

The admin's definition page and run page draw every workflow with it (``queuety.core.graph_svg``
turns a :class:`Graph` into SVG). The layout is layered: one layer per step, in the order the
steps run, between a start and an end terminal; a ``parallel`` step's branches get a layer of
their own below it, one lane each. Edges:

- ``next``: a step to the one after it (a wait's ``on_timeout="continue"`` is the same edge);
- ``route``: a route step's labels to their targets (labels sharing a target share an edge);
- ``loop``: a ``repeat`` step back to its target;
- ``timeout``: a wait's ``on_timeout`` jump to a step;
- ``branch`` / ``join``: a ``parallel`` step to its branches and its branches to what follows;
- ``compensation``: a step to the handler that undoes it, drawn as a dashed side node.

An edge to a step more than one layer away (a route forward past steps, a loop back) leaves
its source by a corner and runs in a gutter of its own, left of the steps for edges going
back and right of them for edges going forward, so no edge crosses a node.

:func:`run_overlay` adds what a run did: each step's status (``done``, ``running``,
``waiting``, ``failed``, ``skipped``), its attempts and the edges its path took.

Pure: the core only (no Django), so it is unit-tested without a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from queuety.core.definition import (
    ChildStep,
    DelayStep,
    ForEachStep,
    ParallelStep,
    RepeatStep,
    StartStep,
    StepSpec,
    WaitStep,
    WaitWorkflowsStep,
    WorkflowSpec,
)
from queuety.core.describe import human_duration

#: Geometry, in SVG user units (pixels at 100 %): wide enough for 32 characters of a step
#: name at 12 px, so a name is readable however many steps the workflow has.
NODE_W, NODE_H, RUN_NODE_H = 240, 44, 58
BRANCH_W = 200
TERMINAL = 22
LAYER_GAP = 40
LANE_GAP = 16
SIDE_GAP = 48
GUTTER = 14
MARGIN = 24

#: What a run's step can be, as the run page's graph colours it.
STATUSES = ("done", "running", "waiting", "failed", "skipped")


@dataclass(frozen=True, slots=True)
class Node:
    """One box of the graph: a step, a branch of a ``parallel`` step, a compensation or a
    terminal; ``x``/``y`` are its top-left corner."""

    id: str
    kind: str
    """The step's kind (``task``, ``wait``, ...), ``route`` for a task with routes,
    ``branch``, ``compensation`` or ``terminal`` (the ``start`` and ``end`` nodes)."""
    label: str
    detail: str
    x: float
    y: float
    w: float
    h: float
    step: int | None = None
    """The step's position in the definition (``None`` for the terminals)."""
    branch: int | None = None

    @property
    def cx(self) -> float:
        """The x of its centre."""
        return self.x + self.w / 2

    @property
    def bottom(self) -> float:
        """The y of its lower side."""
        return self.y + self.h


@dataclass(frozen=True, slots=True)
class Edge:
    """An arrow from node ``source`` to node ``target``, drawn along ``points``."""

    source: str
    target: str
    kind: str
    label: str = ""
    points: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True, slots=True)
class StepState:
    """What a run did at one step (a node of the run page's graph)."""

    status: str
    """One of :data:`STATUSES`."""
    attempts: int = 0
    """Attempts of its latest visit (the most of any branch or item)."""
    visits: int = 0
    """How many times the run got there (more than 1 in a loop)."""
    branches: dict[int, str] = field(default_factory=dict)
    """A fan-out step's branches or items: position -> status."""


@dataclass(frozen=True, slots=True)
class Graph:
    """A laid-out workflow: its nodes, its edges and the size they take."""

    name: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: float
    height: float
    states: dict[str, StepState] = field(default_factory=dict)
    """Node id -> what the run did there (empty for a definition)."""
    taken: frozenset[tuple[str, str]] = frozenset()
    """The (source, target) of each edge the run's path took."""

    def node(self, node_id: str) -> Node:
        """The node called ``node_id``.

        Raises:
            KeyError: no node has that id.
        """
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(f"Graph {self.name!r} has no node {node_id!r}.")

    def step_nodes(self) -> list[Node]:
        """The nodes that are steps of the definition, in order."""
        return [n for n in self.nodes if n.step is not None and n.kind not in (
            "branch", "compensation")]


def step_id(index: int) -> str:
    """The id of step ``index``'s node."""
    return f"s{index}"


def branch_id(index: int, branch: int) -> str:
    """The id of the node of branch ``branch`` of ``parallel`` step ``index``."""
    return f"s{index}b{branch}"


def node_kind(step: StepSpec) -> str:
    """The shape a step is drawn as: its kind, or ``route`` for a task with routes."""
    return "route" if step.routes is not None else step.kind


def step_detail(step: StepSpec) -> str:
    """A few words under a step's name saying what it does: a task's handler (its dotted
    path), its wait, its fan-out ...; the full sentence is
    :func:`queuety.core.describe.describe_step`."""
    match step:
        case WaitStep(wait=wait):
            return (f"wait: {wait.human} (a person)" if wait.human
                    else "wait: " + ", ".join(wait.signals))
        case DelayStep():
            return f"delay {human_duration(step.delay_seconds)}"
        case ParallelStep(fanout=fanout):
            return f"parallel: {len(fanout.branches)} branches, join {fanout.mode}"
        case ForEachStep(fanout=fanout):
            return f"for each of state[{fanout.items_key!r}]: {_short(step.handler)}"
        case RepeatStep(repeat=loop):
            return f"repeat: back to {loop.get('target')} {loop.get('mode')} …"
        case ChildStep(child=child):
            return f"child run: {child.get('name')} ({len(child.get('steps', []))} steps)"
        case StartStep(child=child, start=start):
            return f"start a {child.get('name')} per item of {start.items_key!r}"
        case WaitWorkflowsStep(workflows=on):
            return f"wait for workflows: {on.mode}"
    return step.handler


def _short(path: str) -> str:
    return path.rsplit(".", 1)[-1]


@dataclass
class _Builder:
    """The layout's working state: nodes placed so far and the edges still to route."""

    spec: WorkflowSpec
    node_h: float
    nodes: dict[str, Node] = field(default_factory=dict)
    links: list[tuple[str, str, str, str]] = field(default_factory=list)

    def place(self, node: Node) -> None:
        self.nodes[node.id] = node

    def link(self, source: str, target: str, kind: str, label: str = "") -> None:
        self.links.append((source, target, kind, label))


def layout(spec: WorkflowSpec, *, status_line: bool = False) -> Graph:
    """Lay ``spec`` out as a graph, top to bottom (see the module's docstring).

    ``status_line`` makes each node one line taller, for the run page's status and attempts.
    """
    build = _Builder(spec, RUN_NODE_H if status_line else NODE_H)
    half = max([NODE_W / 2, *(_lanes_width(s) / 2 for s in spec.steps)])
    backs, forwards = _gutter_counts(spec)
    cx = MARGIN + backs * GUTTER + half
    y = _place_steps(build, cx, MARGIN)
    has_side = any(s.compensation for s in spec.steps)
    right = cx + max(half, NODE_W / 2 + SIDE_GAP + NODE_W if has_side else 0)
    _link_steps(build)
    edges = _route_edges(build, left=cx - half, right=right)
    width = right + forwards * GUTTER + MARGIN + (GUTTER if forwards else 0)
    return Graph(spec.name, tuple(build.nodes.values()), tuple(edges), width, y + MARGIN)


def _lanes_width(step: StepSpec) -> float:
    if not isinstance(step, ParallelStep):
        return NODE_W
    n = len(step.fanout.branches)
    return n * BRANCH_W + (n - 1) * LANE_GAP


def _targets(index: int, step: StepSpec, spec: WorkflowSpec) -> list[tuple[int, str, str]]:
    """Where step ``index`` leads: (target position, edge kind, label); a position past the
    last step is the end terminal."""
    after = index + 1
    if step.routes is not None:
        labels: dict[int, list[str]] = {}
        for label, target in step.routes.items():
            labels.setdefault(spec.index_of(target), []).append(label)
        if step.default_route:
            labels.setdefault(spec.index_of(step.default_route), []).append("otherwise")
        return [(target, "route", ", ".join(words)) for target, words in labels.items()]
    out = [(after, "next", "")]
    if isinstance(step, RepeatStep):
        out = [(after, "next", "done"),
               (spec.index_of(step.repeat["target"]), "loop", str(step.repeat.get("mode")))]
    timeout = step.wait.timeout_target if step.wait is not None else None
    if timeout is not None:
        out.append((spec.index_of(timeout), "timeout", "timeout"))
    return out


def _gutter_counts(spec: WorkflowSpec) -> tuple[int, int]:
    """How many edges run in the left (backward) and right (forward) gutters."""
    backs = forwards = 0
    for index, step in enumerate(spec.steps):
        for target, _kind, _label in _targets(index, step, spec):
            backs += target <= index
            forwards += target > index + 1
    return backs, forwards


def _place_steps(build: _Builder, cx: float, y: float) -> float:
    """Place the terminals, the steps, their branches and compensations; return the y below
    the last node."""
    build.place(Node("start", "terminal", "start", "", cx - TERMINAL / 2, y, TERMINAL, TERMINAL))
    y += TERMINAL + LAYER_GAP
    for index, step in enumerate(build.spec.steps):
        build.place(Node(step_id(index), node_kind(step), step.name, step_detail(step),
                         cx - NODE_W / 2, y, NODE_W, build.node_h, index))
        if step.compensation:
            build.place(Node(f"s{index}c", "compensation", f"undo {step.name}",
                             "compensation: " + _short(step.compensation),
                             cx + NODE_W / 2 + SIDE_GAP, y, NODE_W, build.node_h, index))
        y += build.node_h + LAYER_GAP
        if isinstance(step, ParallelStep):
            left = cx - _lanes_width(step) / 2
            for branch, handler in enumerate(step.fanout.branches):
                build.place(Node(branch_id(index, branch), "branch", _short(handler), handler,
                                 left + branch * (BRANCH_W + LANE_GAP), y, BRANCH_W,
                                 build.node_h, index, branch))
            y += build.node_h + LAYER_GAP
    build.place(Node("end", "terminal", "end", "", cx - TERMINAL / 2, y, TERMINAL, TERMINAL))
    return y + TERMINAL


def _exits(build: _Builder, index: int) -> list[str]:
    """The nodes an edge leaving step ``index`` starts from: its branches, if any."""
    step = build.spec.steps[index]
    if isinstance(step, ParallelStep):
        return [branch_id(index, b) for b in range(len(step.fanout.branches))]
    return [step_id(index)]


def _link_steps(build: _Builder) -> None:
    spec = build.spec
    build.link("start", step_id(0), "next")
    for index, step in enumerate(spec.steps):
        if step.compensation:
            build.link(step_id(index), f"s{index}c", "compensation")
        for exit_ in _exits(build, index):
            if exit_ != step_id(index):
                build.link(step_id(index), exit_, "branch")
        for target, kind, label in _targets(index, step, spec):
            to = step_id(target) if target < len(spec.steps) else "end"
            for exit_ in _exits(build, index):
                build.link(exit_, to, "join" if exit_ != step_id(index) else kind, label)


def _route_edges(build: _Builder, *, left: float, right: float) -> list[Edge]:
    """Give each link its points: straight down to the next layer, sideways to a
    compensation, or through a gutter lane of its own when it skips layers."""
    layer_of = _layers(build.nodes.values())
    edges, back_lane, forward_lane = [], 0, 0
    for source, target, kind, label in build.links:
        a, b = build.nodes[source], build.nodes[target]
        points: tuple[tuple[float, float], ...]
        if kind == "compensation":
            points = ((a.x + a.w, a.y + a.h / 2), (b.x, b.y + b.h / 2))
        elif layer_of[b.y] == layer_of[a.y] + 1:
            middle = a.bottom + LAYER_GAP / 2
            points = ((a.cx, a.bottom), (a.cx, middle), (b.cx, middle), (b.cx, b.y))
        elif b.y <= a.y:
            back_lane += 1
            points = _detour(a, b, left - back_lane * GUTTER, -1)
        else:
            forward_lane += 1
            points = _detour(a, b, right + forward_lane * GUTTER, 1)
        edges.append(Edge(source, target, kind, label, _dedupe(points)))
    return edges


def _detour(a: Node, b: Node, lane_x: float, side: int) -> tuple[tuple[float, float], ...]:
    """From a's lower corner on ``side`` (-1 left, 1 right) out to the gutter at
    ``lane_x``, along it to just above b, and into b's top near the same corner."""
    inset = min(a.w, b.w) / 2 - 18
    start_x, end_x = a.cx + side * inset, b.cx + side * inset
    below, above = a.bottom + LAYER_GAP / 4, b.y - LAYER_GAP / 4
    return ((start_x, a.bottom), (start_x, below), (lane_x, below), (lane_x, above),
            (end_x, above), (end_x, b.y))


def _dedupe(points: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    out: list[tuple[float, float]] = []
    for point in points:
        if not out or out[-1] != point:
            out.append(point)
    return tuple(out)


def _layers(nodes: Iterable[Node]) -> dict[float, int]:
    """Each distinct top y -> its layer number (nodes of one layer share their top)."""
    return {y: n for n, y in enumerate(sorted({node.y for node in nodes}))}


def run_overlay(graph: Graph, spec: WorkflowSpec, *, path: Sequence[int],
                rows: Iterable[tuple[int, int, int, str, int]], run_status: str,
                current_step: int, undone: Iterable[tuple[int, str, int]] = ()) -> Graph:
    """Return ``graph`` with what a run did: each step's state and the edges it took.

    ``path`` is the positions of the steps the run finished, in the order it finished them
    (a step in a loop appears once per visit); ``rows`` are its step rows as
    ``(step_index, branch, seq, status, attempt)``; ``run_status`` and ``current_step`` are
    the run's. A step the run passed over (a route skipped it, or the run completed without
    it) is ``skipped``; one it has not reached yet has no state. ``undone`` is the run's
    compensation rows, ``(step_index, status, attempt)``: each colours the compensation node
    of the step it undoes (after a cancel, or a failure with ``compensate_on_failure``).
    """
    latest = _latest_visits(rows)
    finished = run_status in ("completed", "failed", "cancelled")
    walk = list(path) + ([] if run_status == "completed" or current_step >= len(spec.steps)
                         else [current_step])
    furthest = max(walk, default=-1)
    states: dict[str, StepState] = {}
    for index in range(len(spec.steps)):
        status: str | None = _step_status(index, path, run_status, current_step, latest.get(index, {}))
        if status is None and (run_status == "completed" or index < furthest):
            status = "skipped"
        if status is not None:
            branches = {b: _ROW_STATUS.get(s, "waiting")
                        for b, (_seq, s, _attempt) in latest.get(index, {}).items()}
            states[step_id(index)] = StepState(
                status, max((a for _s, _st, a in latest.get(index, {}).values()), default=0),
                path.count(index) + (index == current_step and not finished), branches)
            if isinstance(spec.steps[index], ParallelStep):
                for branch, word in branches.items():
                    states[branch_id(index, branch)] = StepState(
                        word, latest[index][branch][2], 1)
    for index, row_status, attempt in undone:
        if index < len(spec.steps) and spec.steps[index].compensation:
            states[f"s{index}c"] = StepState(_ROW_STATUS.get(row_status, "waiting"), attempt, 1)
    return Graph(graph.name, graph.nodes, graph.edges, graph.width, graph.height, states,
                 _taken(graph, spec, walk, run_status))


def _latest_visits(rows: Iterable[tuple[int, int, int, str, int]]
                   ) -> dict[int, dict[int, tuple[int, str, int]]]:
    """Step position -> branch -> (seq, status, attempt) of its latest visit's rows."""
    latest: dict[int, dict[int, tuple[int, str, int]]] = {}
    for index, branch, seq, status, attempt in rows:
        seen = latest.setdefault(index, {})
        if branch not in seen or seen[branch][0] <= seq:
            seen[branch] = (seq, status, attempt)
    return latest


#: A step row's status as the graph says it.
_ROW_STATUS = {"completed": "done", "processing": "running", "failed": "failed",
               "cancelled": "skipped", "pending": "waiting", "held": "waiting",
               "throttled": "waiting"}


def _step_status(index: int, path: Sequence[int], run_status: str, current_step: int,
                 rows: dict[int, tuple[int, str, int]]) -> str | None:
    if index == current_step and run_status not in ("completed",):
        if run_status == "failed":
            return "failed"
        if run_status == "running":
            live = {status for _seq, status, _a in rows.values()}
            return "running" if "processing" in live or not live else "waiting"
        if run_status != "cancelled":
            return "waiting"  # a signal, child runs, or paused by an operator
    return "done" if index in path else None


def _taken(graph: Graph, spec: WorkflowSpec, walk: Sequence[int],
           run_status: str) -> frozenset[tuple[str, str]]:
    """The edges along ``walk`` (the steps in the order the run went through them), and to
    the end terminal when the run completed."""
    pairs = {(e.source, e.target) for e in graph.edges}
    hops = [*walk, len(spec.steps)] if run_status == "completed" else list(walk)
    taken = {("start", step_id(walk[0]))} if walk else set()
    for a, b in zip(hops, hops[1:], strict=False):
        target = step_id(b) if b < len(spec.steps) else "end"
        branches = [n.id for n in graph.nodes if n.step == a and n.kind == "branch"]
        for source in branches or [step_id(a)]:
            if (source, target) in pairs:
                taken |= {(source, target), (step_id(a), source)}
    return frozenset(taken & pairs)
