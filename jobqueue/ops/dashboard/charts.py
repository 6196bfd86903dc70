"""Line charts as SVG, drawn on the server.

No charting library: two small line charts do not need one, and drawing
them here keeps the page free of third-party code and its licences. Only
numbers reach the SVG, and the template escapes the labels anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Chart", "Line", "line_chart", "nice_ceiling"]

WIDTH, HEIGHT = 600.0, 160.0
PAD_LEFT, PAD_BOTTOM, PAD_TOP = 48.0, 18.0, 8.0


@dataclass(frozen=True)
class Line:
    name: str
    css: str  # the class that colours it
    points: str  # SVG polyline points; "" when it has none
    marks: tuple[tuple[float, float], ...] = ()  # a dot per point, where gaps are likely


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    top: float  # the value at the top of the plot
    lines: list[Line]
    ticks: list[tuple[float, str]]  # x position, label
    width: float = WIDTH
    height: float = HEIGHT
    left: float = PAD_LEFT
    bottom: float = HEIGHT - PAD_BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10ⁿ at or above `value` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def line_chart(title: str, unit: str, series: dict[str, tuple[str, list[float | None]]],
               x_labels: list[tuple[int, str]], marks: bool = False) -> Chart:
    """`series`: name → (css class, values, one per bucket; None leaves a
    gap). `marks`: a dot on each point too (a lone point draws no line)."""
    n = max((len(v) for _, v in series.values()), default=0)
    peak = max((y for _, values in series.values() for y in values if y is not None),
               default=0.0)
    top = nice_ceiling(peak)
    plot_w, plot_h = WIDTH - PAD_LEFT - 4, HEIGHT - PAD_BOTTOM - PAD_TOP

    def x(i: int) -> float:
        return PAD_LEFT + (plot_w * i / (n - 1) if n > 1 else 0.0)

    lines = []
    for name, (css, values) in series.items():
        xy = [(round(x(i), 1), round(PAD_TOP + plot_h * (1 - y / top), 1))
              for i, y in enumerate(values) if y is not None]
        lines.append(Line(name, css, " ".join(f"{a},{b}" for a, b in xy),
                          tuple(xy) if marks else ()))
    ticks = [(round(x(i), 1), label) for i, label in x_labels if 0 <= i < max(n, 1)]
    return Chart(title, unit, top, lines, ticks)
