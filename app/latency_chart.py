"""What the UI's TTFT and TPOT charts draw, from the LatencyWindow's points: one chart per latency,
each in the unit its values read best in (ms below a second, s above), with a fixed y range.

Gradio's LinePlot lays its Vega chart out (the room for the y-axis labels included) and fixes its
colour domain (the series it draws and lists in the legend) when it builds the Vega spec: on mount,
on large resizes, and when a property such as y_lim or y_title changes, not on data updates. Labels
that grew wider after a build were clipped at the left edge (",500" for 1,500 ms). So the y range is
a 1-2-5 step above the data, and its labels change only with y_lim, which rebuilds the layout
around them. Every frame names both series (one placeholder row each with no value, which Vega drops
as invalid and the legend still lists), and the x axis is a fixed window (WINDOW_S seconds ago .. now),
so it never collapses to a single instant.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

CHARTS = {"ttft": "TTFT", "tpot": "TPOT"}  # LatencyWindow's histogram names -> axis titles
SERIES = {"p50": "P50", "p95": "P95"}
WINDOW_S = 60.0
COLUMNS = ["t", "latency", "series"]
X_LIM = [-WINDOW_S, 0.0]
EMPTY_Y_MAX_S = 0.1  # the range of a chart with nothing to draw yet


@dataclass
class Chart:
    frame: pd.DataFrame  # COLUMNS: seconds before now, latency in `unit`, series label
    unit: str  # "ms" or "s"
    y_max: float  # the top of the y axis, in `unit`
    title: str  # the y axis' title, unit included

    @property
    def y_lim(self) -> list[float]:
        return [0.0, self.y_max]


def latency_chart(points: Iterable[dict], name: str, now: float | None = None) -> Chart:
    """The chart of one latency (a CHARTS key) over the points within WINDOW_S; points: {"t": monotonic
    seconds, "ttft_p50": seconds or None, ...}; now defaults to the last point's t."""
    points = list(points)
    if now is None:
        now = points[-1]["t"] if points else 0.0
    recent = [(round(p["t"] - now, 2), p[f"{name}_{key}"], label) for p in points if p["t"] - now >= -WINDOW_S
              for key, label in SERIES.items() if p.get(f"{name}_{key}") is not None]
    top = max((v for _, v, _ in recent), default=0.0)
    unit, y_max = axis_scale(top)
    scale = 1000.0 if unit == "ms" else 1.0
    rows = [(0.0, math.nan, label) for label in SERIES.values()]  # every series, always (see above)
    rows += [(t, v * scale, label) for t, v, label in recent]
    frame = pd.DataFrame(rows, columns=COLUMNS).astype({"t": float, "latency": float, "series": str})
    return Chart(frame, unit, y_max, f"{CHARTS[name]} ({unit})")


def axis_scale(top_s: float) -> tuple[str, float]:
    """(unit, y max in that unit) for data up to top_s seconds: the next 1-2-5 step at or above it."""
    step = nice_ceiling(min(max(top_s, 1e-6), 1e6)) if top_s > 0 else EMPTY_Y_MAX_S
    return ("ms", round(step * 1000, 6)) if step < 1 else ("s", step)


def nice_ceiling(x: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= x (x > 0)."""
    power = 10.0 ** math.floor(math.log10(x))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= x * (1 - 1e-9))  # log10's rounding


def seconds_text(v: float | None) -> str:
    """A latency for people: '7.5 ms', '180 ms', '1.25 s'; '-' for none."""
    if v is None:
        return "-"
    if v >= 1:
        return f"{v:.2f} s"
    return f"{v * 1000:.1f} ms" if v < 0.01 else f"{v * 1000:.0f} ms"
