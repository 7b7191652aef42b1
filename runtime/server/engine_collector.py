"""The gauges and counters that mirror the engine: read from its latest snapshot when /metrics is
scraped, so they agree with the engine exactly (runtime/server/metric_defs.py names them)."""
from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from cute_kernels.cpu.build import loaded_routes
from runtime.engine_stats import PHASES, EngineStats
from runtime.server.async_engine import AsyncEngine
from runtime.server.metric_defs import (
    BY_NAME,
    ENGINE_INDEX,
    FINISH_REASONS,
    KV_TIER,
    KV_TIER_COUNTERS,
    KV_TIER_GAUGES,
    KV_TIERS,
    LABELS,
    LOWER_KV_TIERS,
    OURS,
    TRANSFER_HISTOGRAMS,
    VLLM,
    WAITING_REASONS,
    MetricDef,
)

Rows = list[tuple[tuple[str, ...], float]]  # (values of the extra labels, value)


def _one(value: float) -> Rows:
    return [((), value)]


TIER_KEYS = [d.name[len(KV_TIER):] for d in KV_TIER_GAUGES + KV_TIER_COUNTERS]  # usage_perc, used_blocks, ...


def tier_rows(s: EngineStats, block_size: int, tiers: tuple[str, ...] = KV_TIERS) -> dict[str, Rows]:
    """Each cute_serve:kv_cache_tier_* family's rows. The device's come from the pool's own numbers and
    have no read or written bytes (nothing moves into it as a tier); a lower tier's from its counters in
    EngineStats.tiers, its usage from its bytes."""
    device = {"usage_perc": s.kv_usage, "used_blocks": s.kv_blocks_used, "capacity_blocks": s.kv_blocks_total,
              "used_bytes": s.kv_blocks_used * s.kv_bytes_per_block,
              "capacity_bytes": s.kv_blocks_total * s.kv_bytes_per_block,
              "hits": s.prefix_cache_hits // block_size}  # hits are whole blocks (BlockManager.match_prefix)
    out: dict[str, Rows] = {KV_TIER + key: [] for key in TIER_KEYS}
    for tier in tiers:
        values = device if tier == "device" else _lower_tier(s, tier)
        for key, value in values.items():
            out[KV_TIER + key].append(((tier,), value))
    return out


def _lower_tier(s: EngineStats, tier: str) -> dict[str, float]:
    values = {key: s.tiers.get(f"{tier}_{key}", 0) for key in TIER_KEYS if key != "usage_perc"}
    values["usage_perc"] = values["used_bytes"] / values["capacity_bytes"] if values["capacity_bytes"] else 0.0
    return values


# each snapshot-backed family: its rows from the snapshot
FROM_SNAPSHOT: dict[str, Callable[[EngineStats], Rows]] = {
    VLLM + "num_requests_running": lambda s: _one(s.num_requests_running),
    VLLM + "num_requests_waiting": lambda s: _one(s.num_requests_waiting),
    # every waiting request waits for room (KV blocks or a batch seat): nothing here defers one
    VLLM + "num_requests_waiting_by_reason": lambda s: [((r,), s.num_requests_waiting if r == "capacity" else 0)
                                                        for r in WAITING_REASONS],
    VLLM + "kv_cache_usage_perc": lambda s: _one(s.kv_usage),
    VLLM + "prompt_tokens": lambda s: _one(s.prompt_tokens),
    VLLM + "generation_tokens": lambda s: _one(s.generated_tokens),
    VLLM + "num_preemptions": lambda s: _one(s.preemptions),
    VLLM + "prefix_cache_queries": lambda s: _one(s.prefix_cache_queries),
    VLLM + "prefix_cache_hits": lambda s: _one(s.prefix_cache_hits),
    VLLM + "external_prefix_cache_queries": lambda s: _one(s.external_prefix_cache_queries),
    VLLM + "external_prefix_cache_hits": lambda s: _one(s.external_prefix_cache_hits),
    VLLM + "kv_offload_cpu_cache_usage_perc":
        lambda s: _one(s.tiers.get("host_used_bytes", 0) / (s.tiers.get("host_capacity_bytes") or 1)),
    VLLM + "kv_offload_load_bytes": lambda s: _one(sum(s.tiers.get(f"{t}_read_bytes", 0) for t in LOWER_KV_TIERS)),
    VLLM + "kv_offload_store_bytes":
        lambda s: _one(sum(s.tiers.get(f"{t}_written_bytes", 0) for t in LOWER_KV_TIERS)),
    VLLM + "kv_offload_load_time": lambda s: _one(s.tiers.get("load_seconds", 0)),
    VLLM + "kv_offload_store_time": lambda s: _one(s.tiers.get("store_seconds", 0)),
    VLLM + "kv_offload_stores_skipped": lambda s: _one(s.tiers.get("writes_dropped", 0)),
    VLLM + "spec_decode_num_drafts": lambda s: _one(s.spec_verify_steps),
    VLLM + "spec_decode_num_draft_tokens": lambda s: _one(s.spec_proposed),
    VLLM + "spec_decode_num_accepted_tokens": lambda s: _one(s.spec_accepted),
    OURS + "prefix_cache_blocks": lambda s: _one(s.prefix_cached_blocks),
    OURS + "prefix_cache_evictions": lambda s: _one(s.prefix_cache_evictions),
    OURS + "engine_phase_time_seconds": lambda s: [((p,), getattr(s.times, p)) for p in PHASES],
    VLLM + "nixl_num_failed_transfers": lambda s: _one(s.tiers.get("transfer_failures", 0)),
    VLLM + "nixl_num_kv_expired_reqs": lambda s: _one(s.tiers.get("transfer_expired", 0)),
    OURS + "kv_transfer_held_requests": lambda s: _one(s.tiers.get("transfer_held_requests", 0)),
    OURS + "kv_transfer_held_bytes": lambda s: _one(s.tiers.get("transfer_held_bytes", 0)),
    OURS + "kv_transfer_sent_bytes": lambda s: _one(s.tiers.get("transfer_sent_bytes", 0)),
    OURS + "kv_transfer_loaded_blocks": lambda s: _one(s.tiers.get("transfer_loaded_blocks", 0)),
    OURS + "kv_transfer_recomputed_blocks": lambda s: _one(s.tiers.get("transfer_recomputed_blocks", 0)),
}


def connector_now(async_engine: AsyncEngine) -> dict[str, float]:
    """The KV connector's counters and levels now, not as of the last step: its threads count between steps
    (a prefill instance's sends and expiries happen while its engine idles). A dict copy and a locked read."""
    engine = async_engine.engine
    connector = engine.scheduler.connector
    return dict(engine.stats.tiers) | (connector.gauges() if connector is not None else {})


class EngineCollector(Collector):
    def __init__(self, async_engine: AsyncEngine, model_name: str) -> None:
        self.async_engine = async_engine
        self.base = (model_name, ENGINE_INDEX)
        cfg = async_engine.config
        self.block_size = cfg.block_size
        self.cache_config = {"block_size": str(cfg.block_size), "num_cpu_blocks": "None",
                             "cache_dtype": cfg.kv_cache_dtype, "enable_prefix_caching": str(cfg.enable_prefix_caching)}
        # draft positions: vLLM reports every position of num_speculative_tokens, accepted or not
        speculating = async_engine.describe().get("speculative", "off") != "off"
        self.draft_positions = cfg.num_speculative_tokens if speculating else 0

    def family(self, name: str, rows: Rows) -> Metric:
        d: MetricDef = BY_NAME[name]
        kind = CounterMetricFamily if d.kind == "counter" else GaugeMetricFamily
        family = kind(name, d.help, labels=[*LABELS, *d.labels])
        for values, value in rows:
            family.add_metric([*self.base, *values], value)
        return family

    def collect(self) -> Iterator[Metric]:
        s = self.async_engine.snapshot()
        s = s.copy(tiers=s.tiers | connector_now(self.async_engine))
        for name, read in FROM_SNAPSHOT.items():
            yield self.family(name, read(s))
        for name, rows in tier_rows(s, self.block_size).items():
            if rows:  # read and written bytes: none until a tier below the device exists
                yield self.family(name, rows)
        per_pos = list(s.spec_accepted_by_pos) + [0] * max(0, self.draft_positions - len(s.spec_accepted_by_pos))
        yield self.family(VLLM + "spec_decode_num_accepted_tokens_per_pos",
                          [((str(i),), n) for i, n in enumerate(per_pos)])
        yield self.family(VLLM + "request_success", [((r,), s.finished.get(r, 0)) for r in _reasons(s)])
        info = {**self.cache_config, "num_gpu_blocks": str(s.kv_blocks_total),
                "kv_cache_memory_bytes": str(s.kv_blocks_total * s.kv_bytes_per_block)}
        info_labels = BY_NAME[VLLM + "cache_config_info"].labels
        yield self.family(VLLM + "cache_config_info", [(tuple(info[k] for k in info_labels), 1)])
        yield self.family(OURS + "cpu_kernel_route_info", [((lib, route), 1) for lib, route in loaded_routes().items()])
        for name, key in TRANSFER_HISTOGRAMS.items():
            yield self.histogram(name, key, s)

    def histogram(self, name: str, key: str, s: EngineStats) -> Metric:
        """A histogram a KV connector keeps as counters in EngineStats.tiers (cumulative {key}_le_{i})."""
        d: MetricDef = BY_NAME[name]
        family = HistogramMetricFamily(name, d.help, labels=list(LABELS))
        count = s.tiers.get(f"{key}_count", 0)
        buckets = [(repr(float(b)), s.tiers.get(f"{key}_le_{i}", 0)) for i, b in enumerate(d.buckets)]
        family.add_metric(list(self.base), buckets + [("+Inf", count)], s.tiers.get(f"{key}_sum", 0))
        return family


def _reasons(s: EngineStats) -> list[str]:
    """vLLM's finish reasons (each present from the start, so rates and ratios have a series), then any other."""
    return [*FINISH_REASONS, *sorted(set(s.finished) - set(FINISH_REASONS))]
