"""/metrics parses with prometheus_client's own parser, uses vLLM's names and labels, and its numbers
agree with what was sent and with the engine's own counters."""
import httpx
from prometheus_client.parser import text_string_to_metric_families

from runtime.engine_stats import PHASES, EngineStats
from runtime.server import metric_defs
from runtime.server.engine_collector import tier_rows
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

V, C = "vllm:", "cute_serve:"
BASE = {"model_name": "tiny", "engine": "0"}


def scrape(url):
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    """A sample of this server's engine (model_name="tiny", engine="0") plus the given labels."""
    return samples[(name, tuple(sorted({**BASE, **labels}.items())))]


def test_metrics_agree_with_the_traffic():
    prompts = [[65 + i] * (20 + 7 * i) for i in range(5)]
    max_tokens = [3, 5, 8, 4, 6]
    with live_server(tiny_engine(num_blocks=64)) as srv:
        empty = scrape(srv.url)
        assert value(empty, V + "prompt_tokens_total") == 0
        assert value(empty, V + "request_success_total", finished_reason="error") == 0  # every reason from the start
        for p, m in zip(prompts, max_tokens):
            body = {"prompt": p, "max_tokens": m, "ignore_eos": True, "stream": len(p) % 2 == 0}
            assert httpx.post(srv.url + "/v1/completions", json=body, timeout=30).status_code == 200
        # the same long prompt again: its full blocks come from the prefix cache
        again = {"prompt": prompts[-1], "max_tokens": 2, "ignore_eos": True}
        assert httpx.post(srv.url + "/v1/completions", json=again, timeout=30).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "ignore_eos": True}
        chat_prompt = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=30).json()["usage"]["prompt_tokens"]
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "temperature": -1}).status_code == 400
        srv.wait_idle()
        s = scrape(srv.url)
        stats = srv.engine.stats

    n = len(prompts) + 2
    sent_prompt = sum(map(len, prompts)) + len(prompts[-1]) + chat_prompt
    assert value(s, V + "prompt_tokens_total") == sent_prompt
    generated = sum(max_tokens) + 2 + 1
    assert value(s, V + "generation_tokens_total") == generated
    assert value(s, V + "request_success_total", finished_reason="length") == n
    assert value(s, V + "request_success_total", finished_reason="abort") == 0
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_time_per_output_token_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "request_inference_time_seconds", "request_prompt_tokens"):
        assert value(s, V + hist + "_count") == n, hist
        assert value(s, V + hist + "_bucket", le="+Inf") == n
    # the one-token chat answer records a TPOT of 0, as vLLM does: the lowest bucket holds it
    assert value(s, V + "request_time_per_output_token_seconds_bucket", le="0.001") >= 1
    assert value(s, V + "request_prompt_tokens_sum") == sent_prompt
    assert value(s, V + "request_generation_tokens_sum") == generated
    assert value(s, V + "inter_token_latency_seconds_count") == generated - n  # one gap per token after the first
    assert value(s, V + "e2e_request_latency_seconds_sum") >= value(s, V + "time_to_first_token_seconds_sum") > 0
    # every prompt token is computed or a cache hit; the hits are the repeated prompt's 2 full blocks
    assert value(s, V + "prompt_tokens_by_source_total", source="local_cache_hit") == 32
    assert value(s, V + "prompt_tokens_by_source_total", source="local_compute") == sent_prompt - 32
    assert value(s, V + "prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert value(s, V + "prompt_tokens_cached_total") == 32
    assert value(s, V + "prompt_tokens_cached_by_source_total", source="device") == 32
    assert value(s, V + "request_prefill_kv_computed_tokens_sum") == sent_prompt - 32
    assert value(s, V + "prefix_cache_hits_total") == 32 == stats.prefix_cache_hits
    assert value(s, V + "prefix_cache_queries_total") == stats.prefix_cache_queries
    # one iteration-tokens observation per step, adding up to every token computed or generated
    assert value(s, V + "iteration_tokens_total_sum") == stats.computed_prefill_tokens + stats.generated_tokens
    assert 0 < value(s, V + "iteration_tokens_total_count") <= stats.steps
    for phase in PHASES:
        assert value(s, C + "engine_phase_time_seconds_total", phase=phase) == getattr(stats.times, phase)
    assert value(s, V + "num_requests_running") == 0 and value(s, V + "num_requests_waiting") == 0
    assert value(s, V + "kv_cache_usage_perc") == 0
    assert value(s, C + "kv_cache_tier_used_blocks", tier="device") == 0
    assert value(s, C + "kv_cache_tier_capacity_blocks", tier="device") == 64
    assert value(s, C + "kv_cache_tier_hits_total", tier="device") == 32 / 16  # the repeated prompt's 2 blocks
    # goodput: every request met the loosest SLO pair (on a tiny model, in well under 10 s)
    assert value(s, C + "request_slo_attained_total", ttft_slo="10.0", tpot_slo="0.5") == n


def test_gauges_show_a_request_in_flight():
    with live_server(tiny_engine(num_blocks=64)) as srv:
        body = {"prompt": [1] * 40, "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            next(lines)
            s = scrape(srv.url)
            assert value(s, V + "num_requests_running") == 1
            used = value(s, C + "kv_cache_tier_used_blocks", tier="device")
            assert used >= 3
            assert value(s, V + "kv_cache_usage_perc") == used / 64
            assert value(s, C + "kv_cache_tier_usage_perc", tier="device") == used / 64
            used_bytes = value(s, C + "kv_cache_tier_used_bytes", tier="device")
            assert used_bytes > 0 and value(s, C + "kv_cache_tier_capacity_bytes", tier="device") == used_bytes / used * 64
            assert value(s, V + "num_requests_waiting_by_reason", reason="capacity") == 0
        srv.wait_idle()


def test_cache_config_info_names_the_pool():
    """The routers' model-server protocol reads the pool's size from cache_config_info's labels."""
    with live_server(tiny_engine(num_blocks=64)) as srv:
        s = scrape(srv.url)
    [(labels, one)] = [(dict(k[1]), v) for k, v in s.items() if k[0] == V + "cache_config_info"]
    assert one == 1 and labels["model_name"] == "tiny" and labels["engine"] == "0"
    assert labels["num_gpu_blocks"] == "64" and labels["block_size"] == "16"
    assert labels["enable_prefix_caching"] == "True" and labels["cache_dtype"] == "auto"


def test_prefix_cache_and_speculation_series_match_the_engine():
    from runtime.spec.ngram import NgramProposer

    engine = tiny_engine(num_blocks=64)
    engine.config.num_speculative_tokens = 3
    engine.set_proposer(NgramProposer(1, 3))
    with live_server(engine) as srv:
        body = {"prompt": [7, 8, 9, 10] * 12, "max_tokens": 12, "ignore_eos": True, "temperature": 0,
                "logit_bias": {"8": 100}}  # outputs repeat a prompt token, so the n-gram proposer finds matches
        for _ in range(2):
            assert httpx.post(srv.url + "/v1/completions", json=body, timeout=30).status_code == 200
        srv.wait_idle()
        s = scrape(srv.url)
        stats = srv.engine.stats
        assert value(s, V + "spec_decode_num_draft_tokens_total") == stats.spec_proposed > 0
        assert value(s, V + "spec_decode_num_accepted_tokens_total") == stats.spec_accepted
        assert value(s, V + "spec_decode_num_drafts_total") == stats.spec_verify_steps > 0
        per_pos = [value(s, V + "spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)]
        # position i counts the verifications that accepted drafts 0..i: never more than the one before,
        # and together they are every accepted token
        assert per_pos == sorted(per_pos, reverse=True) and sum(per_pos) == stats.spec_accepted
        assert value(s, C + "prefix_cache_blocks") == srv.engine.pool.num_cached > 0
        assert value(s, V + "prefix_cache_hits_total") > 0
        assert value(s, C + "prefix_cache_evictions_total") == srv.engine.pool.evictions


def test_grammar_compile_time_is_observed_per_structured_request():
    with live_server(tiny_engine(num_blocks=64)) as srv:
        body = {"prompt": "x", "max_tokens": 2, "guided_choice": ["yes", "no"]}
        for _ in range(2):  # the second is a cache hit, and is observed too
            assert httpx.post(srv.url + "/v1/completions", json=body, timeout=60).status_code == 200
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
        s = scrape(srv.url)
    assert value(s, C + "grammar_compile_time_seconds_count") == 2
    assert value(s, C + "grammar_compile_time_seconds_sum") > 0


def test_every_family_is_defined_in_metric_defs():
    """One table defines every series: nothing on /metrics outside it (but the HTTP and process series
    of the libraries vLLM uses), and nothing in it missing from /metrics."""
    with live_server(tiny_engine(num_blocks=64)) as srv:
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        text = httpx.get(srv.url + "/metrics").text
    families = {f.name for f in text_string_to_metric_families(text) if not f.name.endswith("_created")}
    ours = {name for name in families if name.startswith((V, C))}
    # bytes moved to and from a tier below the device: absent while the device is the only tier
    below_device = {C + "kv_cache_tier_read_bytes", C + "kv_cache_tier_written_bytes"}
    expected = set(metric_defs.BY_NAME) - (set() if metric_defs.LOWER_KV_TIERS else below_device)
    assert ours == expected, ours ^ expected
    assert families - ours <= {"http_requests", "http_request_size_bytes", "http_response_size_bytes",
                               "http_request_duration_highr_seconds", "http_request_duration_seconds",
                               "process_virtual_memory_bytes", "process_resident_memory_bytes",
                               "process_start_time_seconds", "process_cpu_seconds", "process_open_fds",
                               "process_max_fds", "python_info"}
    assert not any(name.startswith("cute_serve:") and name[len(C):] in {d.name[len(V):] for d in metric_defs.ALL
                                                                       if d.name.startswith(V)} for name in ours)


def test_kv_tier_rows_take_a_lower_tier_from_its_connectors_counters():
    """The seam a tier below the device plugs into: its counters in EngineStats.tiers, named f"{tier}_{key}"."""
    s = EngineStats(prefix_cache_hits=48, kv_blocks_total=64, kv_blocks_used=16, kv_bytes_per_block=1024,
                    tiers={"host_used_bytes": 3000, "host_capacity_bytes": 12000, "host_used_blocks": 3,
                           "host_capacity_blocks": 12, "host_hits": 5, "host_read_bytes": 5000,
                           "host_written_bytes": 9000, "loads": 2})
    rows = {name[len(C + "kv_cache_tier_"):]: dict(r) for name, r in tier_rows(s, 16, ("device", "host")).items()}
    assert set(rows) == {d.name[len(C + "kv_cache_tier_"):] for d in metric_defs.ALL if "kv_cache_tier_" in d.name}
    device, host = ("device",), ("host",)
    assert {k: r.get(device) for k, r in rows.items()} == {
        "usage_perc": 0.25, "used_blocks": 16, "capacity_blocks": 64, "used_bytes": 16 * 1024,
        "capacity_bytes": 64 * 1024, "hits": 3, "read_bytes": None, "written_bytes": None}
    assert {k: r[host] for k, r in rows.items()} == {
        "usage_perc": 0.25, "used_blocks": 3, "capacity_blocks": 12, "used_bytes": 3000, "capacity_bytes": 12000,
        "hits": 5, "read_bytes": 5000, "written_bytes": 9000}
    assert tier_rows(EngineStats(), 16, ("device", "disk"))[C + "kv_cache_tier_usage_perc"] == [
        (device, 0.0), (("disk",), 0.0)]  # a tier with nothing counted yet reads 0, not an error
