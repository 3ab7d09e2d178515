"""Piecewise-linear interpolation through measured points: how every cost table here reads between (and beyond)
the points it measured."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise linear through sorted (x, y) points; outside them, linear along the end segment; a single point
    is a constant. Never below 0."""
    if not points:
        raise ValueError("no points to interpolate")
    if len(points) == 1:
        return max(points[0][1], 0.0)
    xs = [p[0] for p in points]
    i = bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return max(points[i][1], 0.0)
    lo, hi = (0, 1) if i <= 0 else (len(points) - 2, len(points) - 1) if i >= len(points) else (i - 1, i)
    (x0, y0), (x1, y1) = points[lo], points[hi]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)
