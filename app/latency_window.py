"""Recent latency quantiles from the server's Prometheus histograms (no second bookkeeping).

Each sample stores the histograms' cumulative bucket counts; a quantile over the trailing window
comes from the bucket deltas, interpolated inside a bucket as Prometheus' histogram_quantile does.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque

from prometheus_client import Histogram


def bucket_counts(hist: Histogram) -> list[tuple[float, float]]:
    """[(upper bound, cumulative count), ...] ending with +Inf."""
    samples = hist.collect()[0].samples
    return [(float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket")]


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """histogram_quantile over cumulative (le, count) pairs; None when there are no observations."""
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            width = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 0.0)
        prev_le, prev_count = le, count
    return prev_le


class LatencyWindow:
    """Samples the TTFT and TPOT histograms; reports P50/P95 over the last `window_s` seconds."""

    def __init__(self, histograms: dict[str, Histogram], window_s: float = 30.0, history: int = 120) -> None:
        self.histograms = histograms
        self.window_s = window_s
        self.samples: deque[tuple[float, dict[str, list[tuple[float, float]]]]] = deque()  # the last window_s
        self.series: deque[dict] = deque(maxlen=history)  # one point per sample: time and quantiles
        self._lock = threading.Lock()

    def sample(self, min_interval: float = 0.5) -> None:
        """Record the histograms now (shared by every browser tab: at most one sample per interval)."""
        now = time.monotonic()
        with self._lock:
            if self.samples and now - self.samples[-1][0] < min_interval:
                return
            counts = {name: bucket_counts(h) for name, h in self.histograms.items()}
            self.samples.append((now, counts))
            while now - self.samples[0][0] > self.window_s:
                self.samples.popleft()
            base = self.samples[0][1]
            point = {"t": now}
            for name, cur in counts.items():
                delta = [(le, c - b) for (le, c), (_, b) in zip(cur, base[name])]
                if delta and delta[-1][1] == 0:  # nothing new in the window: show the all-time figure
                    delta = cur
                for q in (50, 95):
                    point[f"{name}_p{q}"] = quantile(q / 100, delta)
            self.series.append(point)

    def points(self) -> list[dict]:
        """A copy of the series (the UI reads it from Gradio's worker threads while another samples)."""
        with self._lock:
            return list(self.series)

    def latest(self) -> dict:
        with self._lock:
            return dict(self.series[-1]) if self.series else {}
