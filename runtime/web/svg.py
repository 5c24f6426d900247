"""Server-side SVG charts (no JavaScript): a sparkline of per-minute counts."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup


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
