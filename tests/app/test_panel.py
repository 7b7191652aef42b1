"""The live panel's block map: redrawn when the engine publishes a new snapshot, not per browser tick."""
import numpy as np

from app.block_map import STATE_COLORS
from app.panel import LivePanel, tier_group
from runtime.sampling_params import SamplingParams
from runtime.server.async_engine import AsyncEngine
from runtime.server.metrics import ServerMetrics
from tests.runtime.tiers.tier_workload import engine, run_rounds
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


def test_latency_chart_names_every_series_and_keeps_its_window():
    """Gradio's LinePlot draws (and lists in its legend) only the series its frame had when it last
    built its spec: every frame, even one with no latency yet, names both."""
    from app.latency_chart import SERIES, WINDOW_S, latency_chart

    empty = latency_chart([], "ttft")
    assert set(empty.frame["series"]) == set(SERIES.values()) and empty.frame["latency"].isna().all()
    assert (empty.unit, empty.title) == ("ms", "TTFT (ms)")
    points = [{"t": 100.0, "ttft_p50": 0.5}, {"t": 150.0, "ttft_p50": 0.25, "tpot_p50": 0.02},
              {"t": 100.0 + WINDOW_S + 20, "ttft_p50": 0.3, "tpot_p95": None}]
    ttft = latency_chart(points, "ttft")
    assert ttft.frame.dropna().values.tolist() == [[-30.0, 250.0, "P50"], [0.0, 300.0, "P50"]]  # t=100 fell out
    assert ttft.y_lim == [0.0, 500.0]
    assert latency_chart(points, "tpot").frame.dropna().values.tolist() == [[-30.0, 20.0, "P50"]]


def test_latency_chart_picks_its_unit_and_a_range_above_every_value():
    """Below a second in ms, from a second in s; the top of the axis is the next 1-2-5 step, so its
    labels change only with y_lim (which makes the page lay the chart out again around them)."""
    from app.latency_chart import latency_chart, seconds_text

    for top, unit, y_max in ((0.0042, "ms", 5.0), (0.18, "ms", 200.0), (0.5, "ms", 500.0), (0.9995, "s", 1.0),
                             (1.75, "s", 2.0), (12.5, "s", 20.0), (640.0, "s", 1000.0)):
        chart = latency_chart([{"t": 0.0, "ttft_p50": top / 2, "ttft_p95": top}], "ttft")
        assert (chart.unit, chart.y_max, chart.title) == (unit, y_max, f"TTFT ({unit})"), top
        assert chart.frame["latency"].max() <= y_max
    assert [seconds_text(v) for v in (None, 0.0042, 0.18, 1.254)] == ["-", "4.2 ms", "180 ms", "1.25 s"]


def test_stats_row_names_the_proposer_and_its_acceptance_as_the_engine_counts_it():
    from app.panel import acceptance_text, by_position_text

    for config, proposer in (({"speculative": "ngram", "num_speculative_tokens": 3}, "ngram, 3 tokens a step"),
                             ({}, "off")):
        engine = tiny_engine(**config)
        async_engine = AsyncEngine(engine)  # not started: this test publishes the snapshots itself
        metrics = ServerMetrics(async_engine)
        try:
            panel = LivePanel(async_engine, metrics)
            assert f"| {proposer} | - | - |" in panel.stats_markdown()  # nothing drafted yet
            engine.add_request("r", [5, 6, 7, 5, 6, 7, 5, 6, 7] * 4, SamplingParams(max_tokens=30, temperature=0))
            while engine.has_unfinished_requests():
                engine.step()
            async_engine._publish(idle=True)
            s = async_engine.snapshot()
            assert (s.spec_proposed > 0) == bool(config)
            assert f"| {proposer} | {acceptance_text(s)} | {by_position_text(s)} |" in panel.stats_markdown()
            if config:  # the first draft position is verified every time a draft is
                assert s.spec_proposed_by_pos[0] == s.spec_verify_steps and by_position_text(s).endswith(" a step)")
        finally:
            metrics.close()


def test_the_stats_row_shows_the_tiers_hit_rates_when_there_are_tiers():
    with engine(kv_offload_bytes=1 << 30) as e:
        run_rounds(e)
        s = e.snapshot()
        groups = tier_group(s)
        assert [h for h, _ in groups[0]] == ["host hits", "host used"]
        assert groups[0][0][1] == f"{s.tiers['host_hits'] / s.tiers['lookup_blocks']:.1%}" != "0.0%"
    with engine() as e:
        run_rounds(e, rounds=1)
        assert tier_group(e.snapshot()) == []
