"""The frames the UI's "recent TTFT / TPOT" LinePlot draws, from the LatencyWindow's points.

Gradio's LinePlot fixes its colour domain (and so the series it draws and the legend) to the
series present whenever it rebuilds its Vega spec, which happens on mount and on resizes, not on
data updates. A frame that lacked a series at that moment hid it for good (an empty frame hid all
of them, leaving a collapsed "0.000000" axis). So every frame names all four series: one
placeholder row each with no value, which Vega drops as invalid and the legend still lists. The x
axis is a fixed window (WINDOW_S seconds ago .. now), so it never collapses to a single instant.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

SERIES = {"ttft_p50": "TTFT p50", "ttft_p95": "TTFT p95", "tpot_p50": "TPOT p50", "tpot_p95": "TPOT p95"}
WINDOW_S = 60.0
COLUMNS = ["t", "ms", "series"]
X_LIM = [-WINDOW_S, 0.0]


def latency_frame(points: Iterable[dict], now: float | None = None) -> pd.DataFrame:
    """Long-format rows (seconds before now, milliseconds, series label) for the points within WINDOW_S;
    points: {"t": monotonic seconds, "ttft_p50": seconds or None, ...}; now defaults to the last point's t."""
    points = list(points)
    if now is None:
        now = points[-1]["t"] if points else 0.0
    rows = [(0.0, math.nan, label) for label in SERIES.values()]  # every series, always (see above)
    for p in points:
        ago = p["t"] - now
        if ago < -WINDOW_S:
            continue
        rows += [(round(ago, 2), p[key] * 1000, label) for key, label in SERIES.items() if p.get(key) is not None]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"t": float, "ms": float, "series": str})
