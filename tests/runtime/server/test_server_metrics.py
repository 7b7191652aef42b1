"""/metrics parses with prometheus_client's own parser, and its numbers agree with what was sent."""
import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

P = "cute_serve:"


def scrape(url):
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples[(P + name, tuple(sorted(labels.items())))]


def test_metrics_agree_with_the_traffic():
    prompts = [[65 + i] * (20 + 7 * i) for i in range(5)]
    max_tokens = [3, 5, 8, 4, 6]
    with live_server(tiny_engine(num_blocks=64)) as srv:
        empty = scrape(srv.url)
        assert value(empty, "prompt_tokens_total") == 0 and value(empty, "kv_cache_total_blocks") == 64
        for p, m in zip(prompts, max_tokens):
            body = {"prompt": p, "max_tokens": m, "ignore_eos": True, "stream": len(p) % 2 == 0}
            assert httpx.post(srv.url + "/v1/completions", json=body, timeout=30).status_code == 200
        # the same long prompt again: its full blocks come from the prefix cache
        again = {"prompt": prompts[-1], "max_tokens": 2, "ignore_eos": True}
        assert httpx.post(srv.url + "/v1/completions", json=again, timeout=30).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True}
        chat_reply = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=30).json()
        chat_prompt = chat_reply["usage"]["prompt_tokens"]
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "temperature": -1}).status_code == 400
        srv.wait_idle()
        s = scrape(srv.url)

    n = len(prompts) + 2
    assert value(s, "prompt_tokens_total") == sum(map(len, prompts)) + len(prompts[-1]) + chat_prompt
    generated = sum(max_tokens) + 2 + 3
    assert value(s, "generation_tokens_total") == generated
    assert value(s, "request_success_total", finished_reason="length") == n
    assert value(s, "request_success_total", finished_reason="abort") == 0
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_time_per_output_token_seconds"):
        assert value(s, hist + "_count") == n, hist
        assert value(s, hist + "_bucket", le="+Inf") == n
    assert value(s, "inter_token_latency_seconds_count") == generated - n  # one gap per token after the first
    assert value(s, "time_to_first_token_seconds_sum") > 0
    assert value(s, "e2e_request_latency_seconds_sum") >= value(s, "time_to_first_token_seconds_sum")
    assert value(s, "num_requests_running") == 0 and value(s, "num_requests_waiting") == 0
    assert value(s, "kv_cache_used_blocks") == 0 and value(s, "kv_cache_usage_perc") == 0
    assert value(s, "prefix_cache_hits_total") == 32  # the repeated 48-token prompt: 2 blocks (never the last)
    assert 0 < value(s, "prefix_cache_hit_rate") < 1
    hit_rate = value(s, "prefix_cache_hits_total") / value(s, "prefix_cache_queries_total")
    assert value(s, "prefix_cache_hit_rate") == hit_rate
    assert value(s, "spec_decode_acceptance_rate") == 0


def test_gauges_show_a_request_in_flight():
    with live_server(tiny_engine(num_blocks=64)) as srv:
        body = {"prompt": [1] * 40, "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            next(lines)
            s = scrape(srv.url)
            assert value(s, "num_requests_running") == 1
            assert value(s, "kv_cache_used_blocks") >= 3
            assert value(s, "kv_cache_usage_perc") == value(s, "kv_cache_used_blocks") / 64
            assert value(s, "kv_cache_used_bytes") > 0
        srv.wait_idle()


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
        assert value(s, "spec_decode_num_draft_tokens_total") == stats.spec_proposed > 0
        assert value(s, "spec_decode_num_accepted_tokens_total") == stats.spec_accepted
        assert value(s, "prefix_cache_blocks") == srv.engine.pool.num_cached > 0
        assert value(s, "prefix_cache_hits_total") > 0
        assert value(s, "prefix_cache_evictions_total") == srv.engine.pool.evictions
