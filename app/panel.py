"""The live panel's numbers, all read from the engine snapshot and the server's metrics."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from app.block_map import render
from app.latency_chart import latency_frame
from app.latency_window import LatencyWindow
from runtime.server.async_engine import AsyncEngine
from runtime.server.metrics import ServerMetrics


@dataclass
class LivePanel:
    """Shared by every browser tab; Gradio calls refresh() from worker threads, once a second per tab."""

    engine: AsyncEngine
    metrics: ServerMetrics
    latency: LatencyWindow = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _last: tuple[float, int] | None = None
    _rate: float = 0.0
    _map: tuple[np.ndarray, np.ndarray] | None = None  # (block states, the map drawn from them)

    def __post_init__(self) -> None:
        self.latency = LatencyWindow({"ttft": self.metrics.ttft, "tpot": self.metrics.tpot})

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

    def stats_markdown(self) -> str:
        s = self.engine.snapshot()
        lat = self.latency.latest()

        def ms(key: str) -> str:
            v = lat.get(key)
            return f"{v * 1000:.0f}" if v is not None else "-"

        return (f"| run | wait | tok/s | prefix hits | spec accept |\n|---|---|---|---|---|\n"
                f"| {s.num_requests_running} | {s.num_requests_waiting} | {self.tokens_per_second(s.generated_tokens):.1f} "
                f"| {s.prefix_cache_hit_rate:.1%} | {s.spec_acceptance_rate:.1%} |\n\n"
                f"TTFT p50/p95 {ms('ttft_p50')}/{ms('ttft_p95')} ms · TPOT p50/p95 {ms('tpot_p50')}/{ms('tpot_p95')} ms "
                f"(last {self.latency.window_s:.0f} s)")

    def block_map(self) -> np.ndarray:
        """Redrawn only when the engine has published new block states (see AsyncEngine.snapshot)."""
        states = self.engine.snapshot().block_states
        with self._lock:
            if self._map is None or self._map[0] is not states:
                self._map = (states, render(states))
            return self._map[1]

    def refresh(self):
        self.latency.sample()
        return self.kv_usage_html(), self.block_map(), self.stats_markdown(), latency_frame(self.latency.points())
