"""The live panel's block map: redrawn when the engine publishes a new snapshot, not per browser tick."""
import numpy as np

from app.block_map import STATE_COLORS
from app.panel import LivePanel
from runtime.async_engine import AsyncEngine, EngineSnapshot
from runtime.metrics import ServerMetrics
from runtime.sampling_params import SamplingParams
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
        async_engine.snapshot = EngineSnapshot.of(engine)
        busy = panel.block_map()
        in_use = STATE_COLORS[2]
        assert not (idle == in_use).all(axis=-1).any() and (busy == in_use).all(axis=-1).any()
        assert np.array_equal(panel.block_map(), busy)
    finally:
        metrics.close()
