"""The live panel's numbers, all read from the engine snapshot and the server's metrics."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from app.block_map import render
from app.latency_chart import CHARTS, Chart, latency_chart, seconds_text
from app.latency_window import LatencyWindow
from runtime.engine_stats import EngineStats
from runtime.server.async_engine import AsyncEngine
from runtime.server.metric_defs import LOWER_KV_TIERS
from runtime.server.metrics import ServerMetrics


def proposer_text(engine: AsyncEngine) -> str:
    """The proposer in use ("ngram, 4 tokens a step") or "off"; fixed at start."""
    name = engine.describe()["speculative"]
    return name if name == "off" else f"{name}, {engine.engine.config.num_speculative_tokens} tokens a step"


def tier_group(s: EngineStats) -> list[list[tuple[str, str]]]:
    """With tiers below the pool: the share of the blocks looked up below that each tier supplied, and
    how full it is (none without tiers)."""
    asked, t = s.tiers.get("lookup_blocks", 0), s.tiers
    names = [n for n in LOWER_KV_TIERS if f"{n}_capacity_bytes" in t]
    return [[cell for n in names for cell in (
        (f"{n} hits", f"{t.get(f'{n}_hits', 0) / asked:.1%}" if asked else "-"),
        (f"{n} used", f"{t[f'{n}_used_bytes'] / 2**20:.1f} / {t[f'{n}_capacity_bytes'] / 2**20:.0f} MiB"))]] if names else []


def acceptance_text(s: EngineStats) -> str:
    """Accepted / proposed drafts since start, with the count behind the rate."""
    return f"{s.spec_acceptance_rate:.0%} of {s.spec_proposed}" if s.spec_proposed else "-"


def by_position_text(s: EngineStats) -> str:
    """Acceptance at each draft position (given the earlier ones were) and the mean accepted a step."""
    if not s.spec_proposed:
        return "-"
    return f"{' '.join(f'{a:.0%}' for a in s.spec_acceptance_by_pos)} ({s.spec_mean_accepted_len:.2f} a step)"


@dataclass
class LivePanel:
    """Shared by every browser tab; Gradio calls refresh() from worker threads, once a second per tab."""

    engine: AsyncEngine
    metrics: ServerMetrics
    latency: LatencyWindow = field(init=False)
    proposer: str = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _last: tuple[float, int] | None = None
    _rate: float = 0.0
    _map: tuple[np.ndarray, np.ndarray] | None = None  # (block states, the map drawn from them)

    def __post_init__(self) -> None:
        # the engine's TTFT (first token - arrival), as every request's metrics carry it: what the
        # chat footers show too; API clients that time the first streamed chunk agree once that
        # chunk carries the first token
        self.latency = LatencyWindow({"ttft": self.metrics.ttft, "tpot": self.metrics.tpot})
        self.proposer = proposer_text(self.engine)

    def tokens_per_second(self, generated: int) -> float:
        now = time.monotonic()
        with self._lock:
            if self._last is None:
                self._last = (now, generated)
            elif now - self._last[0] >= 0.5:
                self._rate = (generated - self._last[1]) / (now - self._last[0])
                self._last = (now, generated)
            return self._rate

    def kv_usage_html(self) -> str:
        s = self.engine.snapshot()
        used_mib = s.kv_blocks_used * s.kv_bytes_per_block / 2**20
        total_mib = s.kv_blocks_total * s.kv_bytes_per_block / 2**20
        pct = 100 * s.kv_usage
        return (f'<div id="kv-usage"><b>KV cache</b>: <span id="kv-used">{s.kv_blocks_used}</span> / '
                f'{s.kv_blocks_total} blocks ({used_mib:.1f} / {total_mib:.1f} MiB, {pct:.1f}%)'
                f'<div style="background:#eee;height:14px;border-radius:4px">'
                f'<div style="background:#f0a030;width:{pct:.2f}%;height:14px;border-radius:4px"></div></div></div>')

    def stat_groups(self, s: EngineStats) -> list[list[tuple[str, str]]]:
        """The stats row as groups of (header, value) cells, one table each, read from one snapshot:
        what the engine comes to count (a KV tier's hit rate, acceptance by draft position, the
        instance's KV role) is one more cell or group."""
        load = [("run", str(s.num_requests_running)), ("wait", str(s.num_requests_waiting)),
                ("tok/s", f"{self.tokens_per_second(s.generated_tokens):.1f}"),
                ("prefix hits", f"{s.prefix_cache_hit_rate:.1%}")]
        speculation = [("proposer", self.proposer), ("drafts accepted", acceptance_text(s)),
                       ("by draft position", by_position_text(s))]
        return [load, speculation, *tier_group(s)]

    def stats_markdown(self) -> str:
        tables = [f"| {' | '.join(h for h, _ in cells)} |\n|{'---|' * len(cells)}\n| {' | '.join(v for _, v in cells)} |"
                  for cells in self.stat_groups(self.engine.snapshot())]
        lat = self.latency.latest()
        quantiles = " · ".join(f"{title} p50/p95 {seconds_text(lat.get(f'{name}_p50'))} / "
                               f"{seconds_text(lat.get(f'{name}_p95'))}" for name, title in CHARTS.items())
        return "\n\n".join([*tables, f"{quantiles} (last {self.latency.window_s:.0f} s)"])

    def block_map(self) -> np.ndarray:
        """Redrawn only when the engine has published new block states (see AsyncEngine.snapshot)."""
        states = self.engine.snapshot().block_states
        with self._lock:
            if self._map is None or self._map[0] is not states:
                self._map = (states, render(states))
            return self._map[1]

    def refresh(self) -> tuple[str, np.ndarray, str, list[Chart]]:
        """(KV usage HTML, block map, stats row, one chart per CHARTS entry)."""
        self.latency.sample()
        points = self.latency.points()
        return (self.kv_usage_html(), self.block_map(), self.stats_markdown(),
                [latency_chart(points, name) for name in CHARTS])
