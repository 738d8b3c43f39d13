"""A laid-out workflow (:class:`queuety.core.graph.Graph`) as SVG: server-side, no script.

The SVG is plain markup built as a string; every text from a definition or a run (step
names, handler paths, route labels) is XML-escaped, so a step called ``<script>`` is drawn as
those characters. Its size is its viewBox at 100 %: a 50-step workflow is tall, not small,
and the page around it scrolls. Colours come from the admin's CSS variables where there is
one (dark mode), with fixed fallbacks; the status colours are fixed.

Pure: the standard library and the core only.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from queuety.core.graph import STATUSES, Edge, Graph, Node, StepState

#: The width a character of a name (12 px, bold) and of a detail (10.5 px) takes, at most
#: (a few wide letters more than the average), and the node's padding: what fits is cut there.
NAME_EM, DETAIL_EM, PADDING = 7.0, 5.9, 16

_STYLE = """
.q-graph { font-family: -apple-system, "Segoe UI", system-ui, Roboto, sans-serif; }
.q-graph .q-shape { fill: var(--body-bg, #fff); stroke: var(--body-quiet-color, #666);
  stroke-width: 1.4; }
.q-graph .q-kind-branch .q-shape { fill: var(--darkened-bg, #f8f8f8); }
.q-graph .q-kind-compensation .q-shape { stroke-dasharray: 5 3; }
.q-graph .q-kind-terminal .q-shape { fill: var(--body-quiet-color, #666); }
.q-graph .q-name { font-size: 12px; font-weight: 600; fill: var(--body-fg, #222); }
.q-graph .q-detail { font-size: 10.5px; fill: var(--body-quiet-color, #555); }
.q-graph .q-state { font-size: 10.5px; font-weight: 600; }
.q-graph .q-edge path { fill: none; stroke: var(--body-quiet-color, #888); stroke-width: 1.3; }
.q-graph .q-edge-compensation path { stroke-dasharray: 5 3; }
.q-graph .q-edge-loop path, .q-graph .q-edge-timeout path { stroke-dasharray: 2 2; }
.q-graph .q-edge.q-taken path { stroke: #1d6fb8; stroke-width: 3; stroke-dasharray: none; }
.q-graph .q-label { font-size: 10px; fill: var(--body-fg, #333);
  paint-order: stroke; stroke: var(--body-bg, #fff); stroke-width: 3px; }
.q-graph .q-status-done .q-shape { fill: #e3f4e8; stroke: #1f7a3a; stroke-width: 2; }
.q-graph .q-status-running .q-shape { fill: #e1eefa; stroke: #1d6fb8; stroke-width: 2.5; }
.q-graph .q-status-waiting .q-shape { fill: #fdf0dc; stroke: #a85d00; stroke-width: 2.5; }
.q-graph .q-status-failed .q-shape { fill: #fbe4e2; stroke: #b3261e; stroke-width: 2.5; }
.q-graph .q-status-skipped .q-shape { fill: #f0f0f0; stroke: #9aa0a8; stroke-dasharray: 4 3; }
.q-graph .q-status-done .q-state { fill: #1f7a3a; }
.q-graph .q-status-running .q-state { fill: #1d6fb8; }
.q-graph .q-status-waiting .q-state { fill: #a85d00; }
.q-graph .q-status-failed .q-state { fill: #b3261e; }
.q-graph .q-status-skipped .q-state { fill: #6b7078; }
.q-graph [class*="q-status-"] .q-name { fill: #222; }
.q-graph [class*="q-status-"] .q-detail { fill: #555; }
"""


def render(graph: Graph, *, title: str = "") -> str:
    """Return ``graph`` as an ``<svg>`` element (a string of markup, all text escaped).

    Each node is a ``<g class="q-node q-kind-<kind>">`` with ``data-node`` (its id) and, for a
    step, ``data-step`` (its name); on a run's graph it also has ``data-status`` and a
    ``q-status-<status>`` class. Each edge is a ``<g class="q-edge q-edge-<kind>">`` with
    ``data-source`` and ``data-target``, and ``q-taken`` when the run's path took it.
    """
    width, height = round(graph.width), round(graph.height)
    label = title or f"Workflow {graph.name}"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="q-graph" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'data-steps="{len(graph.step_nodes())}">',
        f"<title>{escape(label)}</title>",
        f"<style>{_STYLE}</style>",
        '<defs><marker id="q-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#888"/></marker><marker id="q-arrow-taken" viewBox="0 0 10 10" refX="9" '
        'refY="5" markerWidth="5" markerHeight="5" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#1d6fb8"/></marker></defs>',
        '<g class="q-edges">',
        *(_edge(edge, (edge.source, edge.target) in graph.taken) for edge in graph.edges),
        '</g><g class="q-nodes">',
        *(_node(node, graph.states.get(node.id)) for node in graph.nodes),
        "</g></svg>",
    ]
    return "".join(parts)


def _fit(text: str, chars: int, *, path: bool = False) -> str:
    """``text`` cut to ``chars`` characters; a dotted path (``path`` and no space in it)
    loses its start instead of its end, since its end names the handler."""
    if len(text) <= chars:
        return text
    return "…" + text[1 - chars:] if path and " " not in text else text[:chars - 1] + "…"


def _edge(edge: Edge, taken: bool) -> str:
    d = " ".join(f"{'M' if i == 0 else 'L'}{x:g},{y:g}" for i, (x, y) in enumerate(edge.points))
    marker = "" if edge.kind == "compensation" else (
        f' marker-end="url(#q-arrow{"-taken" if taken else ""})"')
    text = ""
    if edge.label:
        x, y, anchor = _label_at(edge)
        text = (f'<text class="q-label" x="{x:g}" y="{y:g}" text-anchor="{anchor}">'
                f"{escape(_fit(edge.label, 28))}</text>")
    return (f'<g class="q-edge q-edge-{edge.kind}{" q-taken" if taken else ""}" '
            f"data-source={quoteattr(edge.source)} data-target={quoteattr(edge.target)}>"
            f'<path d="{d}"{marker}/>{text}</g>')


def _label_at(edge: Edge) -> tuple[float, float, str]:
    """Where an edge's label goes: just below its source on a straight edge; above the
    first sideways segment of a detour."""
    points = edge.points
    if len(points) >= 6:
        (x1, y1), (x2, _y2) = points[1], points[2]
        return (x1 + x2) / 2, y1 - 3, "middle"
    x, y = points[0]
    return x + 6, y + 13, "start"


def _node(node: Node, state: StepState | None) -> str:
    classes = f"q-node q-kind-{node.kind}" + (f" q-status-{state.status}" if state else "")
    attrs = f" data-node={quoteattr(node.id)}"
    if node.step is not None and node.kind not in ("branch", "compensation"):
        attrs += f" data-step={quoteattr(node.label)}"
    if state is not None:
        attrs += f" data-status={quoteattr(state.status)} data-attempts=\"{state.attempts}\""
    tip = node.label + (f" — {node.detail}" if node.detail else "") + (
        f" — {_state_words(node, state)}" if state else "")
    body = _shape(node)
    if node.kind != "terminal":
        x, room = node.x + 12, node.w - PADDING
        body += (f'<text class="q-name" x="{x:g}" y="{node.y + 18:g}">'
                 f"{escape(_fit(node.label, int(room / NAME_EM)))}</text>"
                 f'<text class="q-detail" x="{x:g}" y="{node.y + 33:g}">'
                 f"{escape(_fit(node.detail, int(room / DETAIL_EM), path=True))}</text>")
        if state is not None:
            body += (f'<text class="q-state" x="{x:g}" y="{node.y + 49:g}">'
                     f"{escape(_state_words(node, state))}</text>")
    return f'<g class="{classes}"{attrs}><title>{escape(tip)}</title>{body}</g>'


def _state_words(node: Node, state: StepState) -> str:
    words = [state.status]
    if state.attempts:
        words.append(f"{state.attempts} attempt{'s' if state.attempts != 1 else ''}")
    if state.visits > 1:
        words.append(f"{state.visits} visits")
    if node.kind == "for_each" and state.branches:
        done = sum(1 for s in state.branches.values() if s == "done")
        words.append(f"{done}/{len(state.branches)} items done")
    return " · ".join(words)


def _shape(node: Node) -> str:
    """The node's outline: its kind's shape (the legend shows each)."""
    x, y, w, h, kind = node.x, node.y, node.w, node.h, node.kind
    box = f'x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}"'
    if kind == "terminal":
        return f'<circle class="q-shape" cx="{x + w / 2:g}" cy="{y + h / 2:g}" r="{w / 2:g}"/>'
    if kind in ("wait", "delay", "wait_workflows"):
        return f'<rect class="q-shape" {box} rx="{h / 2:g}"/>'
    if kind == "for_each":
        return (f'<rect class="q-shape" x="{x + 6:g}" y="{y - 6:g}" width="{w:g}" '
                f'height="{h:g}" rx="4"/><rect class="q-shape" {box} rx="4"/>')
    if kind in ("child", "start"):
        return (f'<rect class="q-shape" {box} rx="4"/><rect class="q-shape" x="{x + 4:g}" '
                f'y="{y + 4:g}" width="{w - 8:g}" height="{h - 8:g}" rx="3" fill="none"/>')
    if kind in ("route", "repeat"):
        cut = 14 if kind == "route" else 8
        mid = y + h / 2
        points = ([(x, mid), (x + cut, y), (x + w - cut, y), (x + w, mid), (x + w - cut, y + h),
                   (x + cut, y + h)] if kind == "route" else
                  [(x + cut, y), (x + w - cut, y), (x + w, y + cut), (x + w, y + h - cut),
                   (x + w - cut, y + h), (x + cut, y + h), (x, y + h - cut), (x, y + cut)])
        return ('<polygon class="q-shape" points="'
                + " ".join(f"{px:g},{py:g}" for px, py in points) + '"/>')
    if kind == "parallel":
        return (f'<rect class="q-shape" {box} rx="4"/>'
                f'<rect x="{x:g}" y="{y + h - 5:g}" width="{w:g}" height="5" '
                'fill="var(--body-quiet-color, #666)"/>')
    return f'<rect class="q-shape" {box} rx="4"/>'


#: The legend's entries: a kind drawn as its shape, and what it means.
_KINDS = (("task", "task"), ("route", "route step"), ("wait", "wait / delay"),
          ("parallel", "parallel (its branches below)"), ("for_each", "for_each"),
          ("repeat", "repeat (loop back)"), ("child", "child run / start runs"),
          ("compensation", "compensation"))


def legend(*, with_statuses: bool = False) -> str:
    """An ``<svg>`` legend: each kind's shape, the edge styles and (on the run page) the
    status colours."""
    row_w, item_w, h = 860, 200, 26
    items: list[str] = []
    entries: list[tuple[str, str, StepState | None]] = [(k, w, None) for k, w in _KINDS]
    if with_statuses:
        entries += [("task", status, StepState(status)) for status in STATUSES]
    per_row = row_w // item_w
    for n, (kind, words, state) in enumerate(entries):
        x, y = 4 + (n % per_row) * item_w, 8 + (n // per_row) * (h + 12)
        node = Node(f"legend{n}", kind, "", "", x, y, 40, h)
        classes = f"q-node q-kind-{kind}" + (f" q-status-{state.status}" if state else "")
        items.append(f'<g class="{classes}">{_shape(node)}<text class="q-detail" '
                     f'x="{x + 50:g}" y="{y + 17:g}">{escape(words)}</text></g>')
    rows = (len(entries) + per_row - 1) // per_row
    height = 8 + rows * (h + 12)
    lines = ('<g class="q-edge"><path d="M4,{y} L44,{y}"/><text class="q-detail" x="50" '
             'y="{t}">next / route</text></g><g class="q-edge q-edge-loop"><path '
             'd="M204,{y} L244,{y}"/><text class="q-detail" x="250" y="{t}">loop / timeout'
             '</text></g><g class="q-edge q-edge-compensation"><path d="M404,{y} L444,{y}"/>'
             '<text class="q-detail" x="450" y="{t}">undone by</text></g>').format(
        y=height + 6, t=height + 10)
    if with_statuses:
        lines += (f'<g class="q-edge q-taken"><path d="M604,{height + 6} L644,{height + 6}"/>'
                  f'<text class="q-detail" x="650" y="{height + 10}">the run\'s path</text></g>')
    height += 22
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="q-graph q-legend" '
            f'width="{row_w}" height="{height}" viewBox="0 0 {row_w} {height}" role="img">'
            f"<title>Legend</title>{''.join(items)}{lines}</svg>")
