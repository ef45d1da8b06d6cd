"""Server-rendered sparklines: turn a metrics history into the geometry of one SVG polyline.

Pure presentation (no Django, no database): the worker writes histories such as
`loss_history = [{"step": 1, "loss": 0.7}, ...]` into job.metrics; the job page draws each as an
inline <svg><polyline points="..."></svg>, so no JavaScript chart library and no CDN is needed.
Points whose value is missing or not finite are left out and counted; long histories are thinned
to at most MAX_POINTS by keeping each bucket's lowest and highest point, so spikes stay visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WIDTH = 320
HEIGHT = 84
PAD = 4
MAX_POINTS = 400


@dataclass(frozen=True)
class Sparkline:
    points: str  # "x,y x,y ..." in the viewBox 0 0 WIDTH HEIGHT; "" when nothing is drawable
    count: int  # drawn points
    total: int  # entries in the history
    skipped: int  # entries without a finite value
    first_step: float | None
    last_step: float | None
    last: float | None
    low: float | None
    high: float | None
    last_x: float | None
    last_y: float | None
    zero_y: float | None  # where y = 0 lies, when the range crosses zero
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def thinned(self) -> bool:
        return self.count < self.total - self.skipped


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _thin(pairs: list[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    """At most `limit` points: per bucket, its lowest and highest point in step order."""
    if len(pairs) <= limit:
        return pairs
    buckets = max(1, limit // 2)
    size = len(pairs) / buckets
    kept: list[tuple[float, float]] = []
    for b in range(buckets):
        chunk = pairs[int(b * size):int((b + 1) * size)]
        if not chunk:
            continue
        low = min(range(len(chunk)), key=lambda i: chunk[i][1])
        high = max(range(len(chunk)), key=lambda i: chunk[i][1])
        kept.extend(chunk[i] for i in sorted({low, high}))
    if kept[-1] != pairs[-1]:  # the newest value is always drawn
        kept[-1] = pairs[-1]
    return kept


def sparkline(history, key: str, *, width: int = WIDTH, height: int = HEIGHT,
              max_points: int = MAX_POINTS) -> Sparkline:
    """Geometry for the `key` values of a history list (entries are dicts with `step` and `key`)."""
    entries = history if isinstance(history, list) else []
    pairs: list[tuple[float, float]] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        value = _number(entry.get(key))
        if value is None:
            continue
        step = _number(entry.get("step"))
        pairs.append((step if step is not None else float(index), value))
    skipped = len(entries) - len(pairs)
    if not pairs:
        return Sparkline("", 0, len(entries), skipped, None, None, None, None, None, None, None, None,
                         width, height)
    pairs.sort(key=lambda pair: pair[0])
    steps = [s for s, _ in pairs]
    values = [v for _, v in pairs]
    low, high = min(values), max(values)
    drawn = _thin(pairs, max_points)
    x0, x1 = steps[0], steps[-1]
    span_x = x1 - x0
    span_y = high - low
    inner_w, inner_h = width - 2 * PAD, height - 2 * PAD

    def x_of(step: float) -> float:
        return PAD + (inner_w * (step - x0) / span_x if span_x else inner_w / 2)

    def y_of(value: float) -> float:
        return PAD + (inner_h * (high - value) / span_y if span_y else inner_h / 2)

    coords = [(x_of(s), y_of(v)) for s, v in drawn]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    zero_y = y_of(0.0) if low < 0 < high else None
    return Sparkline(points, len(coords), len(entries), skipped, x0, x1, values[-1], low, high,
                     round(coords[-1][0], 1), round(coords[-1][1], 1),
                     round(zero_y, 1) if zero_y is not None else None, width, height)
