"""Every Prometheus series this server defines: name, type, help, labels and buckets, in one table.

vLLM's names and semantics under `vllm:` (what its Grafana dashboards and the routers' model-server
protocol read), ours under `cute_serve:` in the same style. Every series carries `model_name` (the
served model) and `engine` ("0": one engine per server), as vLLM's do. `http_*` and `process_*` come
from prometheus-fastapi-instrumentator and prometheus_client, as in vLLM, and are not listed here.
docs/observability.md explains each one; tests check that /metrics holds exactly this table.
"""
from __future__ import annotations

from dataclasses import dataclass

VLLM, OURS = "vllm:", "cute_serve:"
LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"

# vLLM's buckets, with a few finer ones below where a CPU or a tiny model lands (a superset: every
# boundary a vLLM dashboard's SLO variable names is one here too)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                     5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
GRAMMAR_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# the SLO grid of request_slo_attained (the TTFT / TPOT SLO choices of vLLM's Overview dashboard)
TTFT_SLOS = (0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
TPOT_SLOS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5)
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's, less "repetition" (no such detector here)
WAITING_REASONS = ("capacity", "deferred")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 buckets up to the context length: 1, 2, 5, 10, 20, 50, ..."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


@dataclass(frozen=True)
class MetricDef:
    name: str  # the family's name (a counter's samples add _total)
    kind: str  # counter, gauge, histogram
    help: str
    labels: tuple[str, ...] = ()  # beyond model_name and engine
    buckets: tuple[float, ...] | None = None  # histograms; None: token_buckets(max_model_len)


def _defs(prefix: str, kind: str, rows: list[tuple]) -> list[MetricDef]:
    return [MetricDef(prefix + row[0], kind, *row[1:]) for row in rows]


# Read from the engine's snapshot when /metrics is scraped (runtime/server/metrics.py, EngineCollector)
VLLM_GAUGES = _defs(VLLM, "gauge", [
    ("num_requests_running", "Number of requests in model execution batches."),
    ("num_requests_waiting", "Number of requests waiting to be processed."),
    ("num_requests_waiting_by_reason", "Waiting requests by reason: capacity (KV cache or batch room); deferred "
                                       "(always 0 here: nothing defers a request).", ("reason",)),
    ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
    ("kv_offload_cpu_cache_usage_perc", "Fraction of the host-memory KV tier in use (--kv-offload-bytes)."),
    ("cache_config_info", "Information of the LLMEngine CacheConfig (value 1; the labels carry it).",
     ("block_size", "num_gpu_blocks", "num_cpu_blocks", "cache_dtype", "enable_prefix_caching",
      "kv_cache_memory_bytes")),
])
VLLM_COUNTERS = _defs(VLLM, "counter", [
    ("prompt_tokens", "Number of prefill tokens processed (counted when a request is added)."),
    ("generation_tokens", "Number of generation tokens processed."),
    ("request_success", "Count of successfully processed requests (sequences), by finish reason.",
     ("finished_reason",)),
    ("num_preemptions", "Cumulative number of preemption from the engine."),
    ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache "
                                      "sharing, in terms of number of queried tokens (here: the tiers below)."),
    ("external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, "
                                   "in terms of number of cached tokens."),
    # vLLM's OffloadingConnector series, from the tiers below the pool (host memory and disk together)
    ("kv_offload_load_bytes", "Bytes of KV blocks loaded back from the tiers below the pool."),
    ("kv_offload_store_bytes", "Bytes of KV blocks stored to the tiers below the pool."),
    ("kv_offload_load_time", "Seconds loads took, from their start until the scheduler took them."),
    ("kv_offload_store_time", "Seconds the writer spent encoding and storing evicted blocks."),
    ("kv_offload_stores_skipped", "Evicted blocks not stored: the write queue was full."),
    ("spec_decode_num_drafts", "Number of spec decoding drafts (sequence-steps that verified drafts)."),
    ("spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("spec_decode_num_accepted_tokens", "Number of accepted tokens."),
    ("spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", ("position",)),
])
# Counted by the server when a request's prefill is done (its first tokens come out)
VLLM_PREFILL_COUNTERS = _defs(VLLM, "counter", [
    ("prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)),
    ("prompt_tokens_cached", "Number of cached prompt tokens (local + external)."),
    ("prompt_tokens_cached_by_source", "Cached prompt tokens by the KV tier that held them.", ("source",)),
])
# Observed once per finished request ("stop" or "length": a disconnect is not a latency)
VLLM_REQUEST_HISTOGRAMS = _defs(VLLM, "histogram", [
    ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", (), TTFT_BUCKETS),
    ("request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", (),
     TOKEN_GAP_BUCKETS),
    ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", (), REQUEST_BUCKETS),
    ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", (), REQUEST_BUCKETS),
    ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", (), REQUEST_BUCKETS),
    ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", (), REQUEST_BUCKETS),
    ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", (), REQUEST_BUCKETS),
    ("request_prompt_tokens", "Number of prefill tokens processed."),
    ("request_generation_tokens", "Number of generation tokens processed."),
    ("request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens."),
    ("request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding "
                                           "cached tokens)."),
])
VLLM_STREAM_HISTOGRAMS = _defs(VLLM, "histogram", [  # observed as outputs stream, and once per engine step
    ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", (), TOKEN_GAP_BUCKETS),
    ("iteration_tokens_total", "Histogram of number of tokens per engine_step.", (), ITERATION_TOKEN_BUCKETS),
])

# KV tiers: each cute_serve:kv_cache_tier_<key> family has a row per tier. "device" is the pool (host
# RAM on the CPU, GPU memory on a GPU), read from EngineStats' own fields. A tier below it (a KV
# connector's, runtime/tiers/) is named in LOWER_KV_TIERS and counts its numbers in EngineStats.tiers
# as f"{tier}_{key}" ("host_read_bytes"); engine_collector.tier_rows turns both into rows.
LOWER_KV_TIERS: tuple[str, ...] = ("host", "disk")  # nearest first (runtime/tiers/); zero rows when off
KV_TIERS = ("device", *LOWER_KV_TIERS)
KV_TIER = OURS + "kv_cache_tier_"
KV_TIER_GAUGES = _defs(KV_TIER, "gauge", [
    ("usage_perc", "Fraction of a KV tier's capacity in use (0-1).", ("tier",)),
    ("used_blocks", "KV blocks a tier holds now (the device's: blocks in use).", ("tier",)),
    ("capacity_blocks", "KV blocks a tier can hold.", ("tier",)),
    ("used_bytes", "Bytes of a KV tier held by its blocks (the device's: blocks in use).", ("tier",)),
    ("capacity_bytes", "Bytes of KV a tier can hold (its budget).", ("tier",)),
])
KV_TIER_COUNTERS = _defs(KV_TIER, "counter", [
    ("hits", "Prefix blocks found in a tier (the device's: prefix-cache hits).", ("tier",)),
    ("read_bytes", "Bytes of KV blocks read from a tier back to the device (tiers below the device).", ("tier",)),
    ("written_bytes", "Bytes of KV blocks written to a tier (tiers below the device).", ("tier",)),
])

# Prefill/decode disaggregation (runtime/tiers/kv_transfer/): vLLM's NixlConnector series, one transfer being
# one request's blocks fetched over TCP by the decode instance; counted in EngineStats.tiers (a histogram as
# {key}_sum, {key}_count and cumulative {key}_le_{i}), read when scraped
XFER_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
XFER_BYTES_BUCKETS = tuple(float(1 << k) for k in range(14, 34, 2))  # 16 KiB .. 4 GiB
TRANSFER_HISTOGRAMS = {  # family -> its key in EngineStats.tiers
    VLLM + "nixl_xfer_time_seconds": "xfer_seconds", VLLM + "nixl_bytes_transferred": "xfer_bytes"}
VLLM_TRANSFER = _defs(VLLM, "histogram", [
    ("nixl_xfer_time_seconds", "Histogram of transfer duration for KV cache transfers (decode side: one "
                               "request's blocks, connect to last block, failed ones included).", (), XFER_TIME_BUCKETS),
    ("nixl_bytes_transferred", "Histogram of bytes transferred per KV cache transfer (decode side).", (),
     XFER_BYTES_BUCKETS),
]) + _defs(VLLM, "counter", [
    ("nixl_num_failed_transfers", "Number of failed KV cache transfers (the decode instance recomputed the rest)."),
    ("nixl_num_kv_expired_reqs", "Number of requests that had their KV expire before a decode instance fetched "
                                 "it (prefill side, --kv-hold-timeout)."),
])
TRANSFER_GAUGES = _defs(OURS, "gauge", [
    ("kv_transfer_held_requests", "Finished prefills whose KV is held for a decode instance (prefill side)."),
    ("kv_transfer_held_bytes", "Bytes of KV held for decode instances (prefill side)."),
])
TRANSFER_COUNTERS = _defs(OURS, "counter", [
    ("kv_transfer_sent_bytes", "Bytes of KV blocks sent to decode instances (prefill side)."),
    ("kv_transfer_loaded_blocks", "KV blocks fetched, verified and loaded from prefill instances (decode side)."),
    ("kv_transfer_recomputed_blocks", "KV blocks a failed transfer left to recompute (decode side)."),
])

OUR_GAUGES = _defs(OURS, "gauge", [
    ("prefix_cache_blocks", "KV blocks findable in the prefix cache (in use or free)."),
    ("cpu_kernel_route_info", "The SIMD route each loaded C kernel library was built for (value 1).",
     ("library", "route")),
    ("grammar_cache_bytes", "Bytes of compiled grammars cached (at most --grammar-cache-bytes)."),
    ("grammar_cache_entries", "Compiled grammars cached."),
    ("grammar_compiles_running", "Grammars compiling or queued for a compile worker."),
])
OUR_COUNTERS = _defs(OURS, "counter", [
    ("prefix_cache_evictions", "Cached blocks evicted for fresh allocations."),
    ("engine_phase_time_seconds", "Seconds the engine's steps spent in each phase.", ("phase",)),
    ("request_slo_attained", "Finished requests whose TTFT and TPOT were both within the SLO pair (for "
                             "goodput; the pairs: vLLM's dashboard SLO choices).", ("ttft_slo", "tpot_slo")),
])
OUR_HISTOGRAMS = _defs(OURS, "histogram", [
    ("grammar_compile_time_seconds", "Seconds to compile (or fetch from the cache) a request's grammar.", (),
     GRAMMAR_BUCKETS),
])

ALL = (VLLM_GAUGES + VLLM_COUNTERS + VLLM_PREFILL_COUNTERS + VLLM_REQUEST_HISTOGRAMS + VLLM_STREAM_HISTOGRAMS
       + KV_TIER_GAUGES + KV_TIER_COUNTERS + VLLM_TRANSFER + TRANSFER_GAUGES + TRANSFER_COUNTERS + OUR_GAUGES
       + OUR_COUNTERS + OUR_HISTOGRAMS)
BY_NAME = {d.name: d for d in ALL}
