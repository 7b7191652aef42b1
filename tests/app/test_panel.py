"""The live panel's block map: redrawn when the engine publishes a new snapshot, not per browser tick."""
import numpy as np

from app.block_map import STATE_COLORS
from app.panel import LivePanel
from runtime.sampling_params import SamplingParams
from runtime.server.async_engine import AsyncEngine
from runtime.server.metrics import ServerMetrics
from tests.tiny_engine import tiny_engine


def test_block_map_is_redrawn_only_for_a_new_snapshot():
    engine = tiny_engine()
    async_engine = AsyncEngine(engine)  # not started: this test publishes the snapshots itself
    metrics = ServerMetrics(async_engine)
    try:
        panel = LivePanel(async_engine, metrics)
        idle = panel.block_map()
        assert panel.block_map() is idle  # the same snapshot: no second copy of the pool, no redraw
        engine.add_request("r", list(range(3, 60)), SamplingParams(max_tokens=5))
        engine.step()
        assert panel.block_map() is idle  # the engine moved on, but published nothing yet
        async_engine._publish(idle=True)  # what the engine thread does after a step
        busy = panel.block_map()
        in_use = STATE_COLORS[2]
        assert not (idle == in_use).all(axis=-1).any() and (busy == in_use).all(axis=-1).any()
        assert np.array_equal(panel.block_map(), busy)
    finally:
        metrics.close()


def test_latency_window_keeps_and_reports_only_its_window(monkeypatch):
    from prometheus_client import CollectorRegistry, Histogram

    import app.latency_window as lw

    clock = [0.0]
    monkeypatch.setattr(lw.time, "monotonic", lambda: clock[0])
    hist = Histogram("x_seconds", "x", buckets=(0.1, 0.2, 0.5, 1.0), registry=CollectorRegistry())
    window = lw.LatencyWindow({"x": hist}, window_s=10)
    window.sample()
    for value, at in ((0.15, 5.0), (0.8, 12.0)):
        for _ in range(10):
            hist.observe(value)
        clock[0] = at
        window.sample()
        if at == 5.0:
            assert 0.1 < window.latest()["x_p50"] <= 0.2
    assert 0.5 < window.latest()["x_p50"] <= 1.0  # the t=5 sample is the window's base: only the 0.8s count
    assert [t for t, _ in window.samples] == [5.0, 12.0]  # the t=0 sample fell out of the window


def test_latency_frame_names_every_series_and_keeps_its_window():
    """Gradio's LinePlot draws (and lists in its legend) only the series its frame had when it last
    built its spec: every frame, even one with no latency yet, names all four."""
    from app.latency_chart import SERIES, WINDOW_S, latency_frame

    empty = latency_frame([])
    assert set(empty["series"]) == set(SERIES.values()) and empty["ms"].isna().all()
    points = [{"t": 100.0, "ttft_p50": 0.5}, {"t": 150.0, "ttft_p50": 0.25, "tpot_p50": 0.02},
              {"t": 100.0 + WINDOW_S + 20, "ttft_p50": 0.3, "tpot_p50": None}]
    drawn = latency_frame(points).dropna()
    assert drawn.values.tolist() == [[-30.0, 250.0, "TTFT p50"], [-30.0, 20.0, "TPOT p50"], [0.0, 300.0, "TTFT p50"]]


def test_about_panel_shows_the_latest_ladder_or_nothing(tmp_path):
    import json

    from app.ladder_summary import ladder_markdown

    assert ladder_markdown(str(tmp_path / "none.json")) == ""
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps({"model": "m", "max_num_seqs": 8, "workload": {"requests": 24}, "rungs": [
        {"rung": "1 static batching", "output_tok_s": 20.0, "speedup": 1.0, "kv_waste": 0.62},
        {"rung": "4 + quantized weights", "note": "n/a (no quantization mode on this device)"}]}))
    text = ladder_markdown(str(path))
    assert "| 1 static batching | 20.0 | 1.00x | 62% |" in text and "n/a (no quantization mode" in text
