"""Server-side SVG (no JavaScript): a sparkline of per-minute counts, and a workflow drawn as a graph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape


def sparkline(values: Sequence[float], *, width: int = 160, height: int = 32) -> Markup:
    """A polyline over `values` (oldest first) scaled to the box; an empty box when there is nothing."""
    if not values:
        return Markup(f'<svg class="spark" width="{width}" height="{height}" role="img"><title>no data</title></svg>')
    top = max(values) or 1
    step = width / max(1, len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values))
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" role="img"><title>max {top:g}/min</title>'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/></svg>'
    )


STATUS_FILL = {
    "pending": "#ececec", "scheduled": "#ececec", "awaiting_parents": "#f3f0ff", "running": "#d7e8ff",
    "succeeded": "#d8f3dc", "cancelled": "#fde9c8", "failed": "#ffd8d8", "crashed": "#ffd8d8",
    "abandoned": "#ffd8d8",
}
"""A node's fill by its job's status (the colours of the dashboard's status badges)."""
NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 180, 40, 60, 16, 30


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    label: str
    status: str
    href: str


def graph(nodes: Sequence[Node], edges: Sequence[tuple[str, str]]) -> Markup:
    """The nodes in columns by depth (a node sits one column right of its deepest parent), each a box filled by
    its status and linking to `href`, with an arrow per edge (parent -> child) between two nodes drawn here.
    Edges to nodes not given are left out; a cycle (none can be written) would only stop the deepening."""
    known = {n.id for n in nodes}
    kept = [(a, b) for a, b in edges if a in known and b in known and a != b]
    parents: dict[str, list[str]] = {n.id: [] for n in nodes}
    for a, b in kept:
        parents[b].append(a)
    depth: dict[str, int] = {}

    def depth_of(node: str, seen: frozenset[str] = frozenset()) -> int:
        if node in depth:
            return depth[node]
        ups = [p for p in parents[node] if p not in seen]
        depth[node] = 0 if not ups else 1 + max(depth_of(p, seen | {node}) for p in ups)
        return depth[node]

    columns: dict[int, list[Node]] = {}
    for n in nodes:
        columns.setdefault(depth_of(n.id), []).append(n)
    where: dict[str, tuple[int, int]] = {}
    for col, members in columns.items():
        for row, n in enumerate(members):
            where[n.id] = (PAD + col * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y))
    width = PAD * 2 + (max(columns, default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max((len(m) for m in columns.values()), default=1) * (NODE_H + GAP_Y) - GAP_Y
    parts = [f'<svg class="workflow-graph" id="workflow-graph" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" xmlns="http://www.w3.org/2000/svg">'
             '<title>workflow members (parent to child)</title>'
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
             'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker></defs>']
    for a, b in kept:
        (x1, y1), (x2, y2) = where[a], where[b]
        x1, y1, y2 = x1 + NODE_W, y1 + NODE_H // 2, y2 + NODE_H // 2
        # an edge over more than one column arcs above the boxes between its ends instead of crossing them
        lift = 0 if depth[b] - depth[a] <= 1 else NODE_H // 2 + PAD
        parts.append(f'<path class="edge" d="M{x1},{y1} C{x1 + GAP_X},{y1 - lift} {x2 - GAP_X},{y2 - lift} '
                     f'{x2},{y2}" fill="none" stroke="#667" stroke-width="1.2" marker-end="url(#arrow)"/>')
    for n in nodes:
        x, y = where[n.id]
        fill = STATUS_FILL.get(n.status, "#ffffff")
        label = n.label if len(n.label) <= 24 else n.label[:23] + "…"
        parts.append(
            f'<a class="node" href="{escape(n.href)}" data-job="{escape(n.id)}" data-status="{escape(n.status)}">'
            f'<title>{escape(n.id)} {escape(n.label)} ({escape(n.status)})</title>'
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6" fill="{fill}" stroke="#889"/>'
            f'<text x="{x + 8}" y="{y + 16}" font-size="12">{escape(label)}</text>'
            f'<text x="{x + 8}" y="{y + 32}" font-size="11" fill="#445">'
            f'{escape(n.status)} · …{escape(n.id[-8:])}</text>'
            '</a>')
    parts.append("</svg>")
    return Markup("".join(parts))
