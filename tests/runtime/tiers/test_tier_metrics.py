"""The tiers in /metrics: vLLM's external prefix-cache counters and prompt sources, and a row per tier
(host, disk) in the cute_serve:kv_cache_tier_* families, agreeing with the engine's own counters."""
import httpx

from tests.runtime.server.test_server_metrics import C, V, scrape, value
from tests.runtime.tiers.tier_workload import GREEDY, PROMPTS, engine
from tests.server_utils import live_server


def complete(url: str, prompt: list[int]) -> None:
    body = {"prompt": prompt, "max_tokens": GREEDY.max_tokens, "temperature": 0, "ignore_eos": True}
    assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200


def test_tier_hits_bytes_and_prompt_sources_reach_metrics(tmp_path):
    host_budget = 4 << 20
    with live_server(engine(kv_offload_bytes=host_budget, kv_disk_path=str(tmp_path))) as srv:
        for _ in range(2):  # the second round's prefixes were evicted during the first: they come from below
            for p in PROMPTS:
                complete(srv.url, p)
                srv.engine.scheduler.connector.flush()  # stored before the next asks (as tier_workload's rounds)
        srv.wait_idle()
        s = scrape(srv.url)
        stats = srv.engine.stats  # read after the scrape: the writer thread may still be storing

    hits = value(s, V + "external_prefix_cache_hits_total")
    assert hits == stats.external_prefix_cache_hits >= 16 * 5 * len(PROMPTS) // 2
    assert value(s, V + "external_prefix_cache_queries_total") == stats.external_prefix_cache_queries >= hits
    assert value(s, V + "prompt_tokens_by_source_total", source="external_kv_transfer") == hits
    tier_hits = {t: value(s, C + "kv_cache_tier_hits_total", tier=t) for t in ("host", "disk")}
    assert sum(tier_hits.values()) * 16 == hits and tier_hits["host"] > 0
    assert value(s, C + "kv_cache_tier_read_bytes_total", tier="host") == stats.tiers["host_read_bytes"] > 0
    assert 0 < value(s, C + "kv_cache_tier_written_bytes_total", tier="host") <= stats.tiers["host_written_bytes"]
    assert value(s, C + "kv_cache_tier_capacity_bytes", tier="host") == host_budget
    used = value(s, C + "kv_cache_tier_used_bytes", tier="host")
    assert 0 < used <= host_budget and value(s, C + "kv_cache_tier_usage_perc", tier="host") == used / host_budget
    assert value(s, C + "kv_cache_tier_used_blocks", tier="host") > 0
    # vLLM's OffloadingConnector names, which its KV-cache dashboard reads
    read = stats.tiers["host_read_bytes"] + stats.tiers.get("disk_read_bytes", 0)
    assert value(s, V + "kv_offload_load_bytes_total") == read
    assert 0 < value(s, V + "kv_offload_store_bytes_total") <= stats.tiers["host_written_bytes"] + \
        stats.tiers.get("disk_written_bytes", 0)
    assert 0 < value(s, V + "kv_offload_load_time_total") == stats.tiers["load_seconds"]
    assert value(s, V + "kv_offload_cpu_cache_usage_perc") == used / host_budget
