"""vLLM's official Grafana dashboards (tests/data/vllm_dashboards/), the routers' model-server protocol
and our own dashboard (deploy/grafana/) all find their series on our /metrics after a short workload;
/metrics passes promtool's parser and lint (bar what vLLM's own names trip), and our dashboard's
PromQL parses."""
import shutil
import subprocess

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.paths import REPO
from tests.runtime.server.observability import dashboards as d
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

VLLM_BOARDS = sorted((REPO / "tests" / "data" / "vllm_dashboards").glob("*.json"))
OUR_BOARD = REPO / "deploy" / "grafana" / "cute_serve.json"
MODEL = "tiny"
PROMTOOL = shutil.which("promtool")
NEEDS_PROMTOOL = pytest.mark.skipif(PROMTOOL is None, reason="needs Debian's prometheus package (.ci/run installs it)")
# Series of vLLM features this engine does not have: the dashboards' rows for them stay empty, as
# vLLM's own do when the feature is off. Each must be absent here and queried by some dashboard.
NOT_APPLICABLE = {
    "up": "made by Prometheus itself for each scrape target",
    "vllm:num_requests_kv_fetch_by_stage": "a KV connector's async loads",
    "vllm:mm_cache_": "the multimodal input cache: no multimodal models here",
    "vllm:lora_requests_info": "LoRA adapters",
    "vllm:engine_sleep_state": "sleep mode",
    "vllm:sleep_mode_operation_duration_seconds": "sleep mode",
    "vllm:rl_weight_update_operation_duration_seconds": "RL weight updates",
    "vllm:estimated_": "model FLOPs utilization (--enable-mfu-metrics)",
    "vllm:kv_block_": "KV block residency sampling (--kv-cache-metrics)",
    "vllm:nixl_num_descriptors": "NIXL's memory descriptors per transfer (blocks go over TCP here)",
    "vllm:nixl_post_time_seconds": "NIXL's time to post a transfer (a fetch here is one TCP request)",
    "vllm:nixl_num_failed_notifications": "NIXL's completion notifications (TCP answers the fetch itself)",
    "vllm:nixl_num_notifications_after_expiry": "NIXL's completion notifications (TCP answers the fetch itself)",
    "vllm:kv_offload_lookup_": "the OffloadingConnector's lookup delays (a lookup here is an index check)",
    "vllm:kv_offload_cpu_cache_read_usage_perc": "the OffloadingConnector's read and write pressure",
    "vllm:kv_offload_cpu_cache_write_usage_perc": "the OffloadingConnector's read and write pressure",
    "vllm:kv_offload_allocation_failure": "the OffloadingConnector's allocator (a full host tier evicts to disk)",
    "vllm:kv_offload_load_size": "per-transfer size histograms (cute_serve:kv_cache_tier_* count bytes per tier)",
    "vllm:kv_offload_store_size": "per-transfer size histograms (cute_serve:kv_cache_tier_* count bytes per tier)",
    "vllm:simple_kv_offload_": "the SimpleCPUOffloadConnector",
}
# the Gateway API Inference Extension's model-server protocol (what the routers scrape), by vLLM's names
PROTOCOL = {"vllm:num_requests_waiting": (), "vllm:num_requests_running": (), "vllm:kv_cache_usage_perc": (),
            "vllm:cache_config_info": ("block_size", "num_gpu_blocks")}


@pytest.fixture(scope="module")
def scrape():
    """/metrics after a short workload touching every feature the dashboards chart: streamed and
    whole completions and chats, a prefix hit, speculation, a grammar, a client error."""
    from runtime.spec.ngram import NgramProposer

    engine = tiny_engine(num_blocks=64)
    engine.config.num_speculative_tokens = 3
    engine.set_proposer(NgramProposer(1, 3))
    with live_server(engine, model_name=MODEL) as srv:
        post = lambda path, body: httpx.post(srv.url + path, json=body, timeout=60)  # noqa: E731
        repeat = {"prompt": [7, 8, 9, 10] * 12, "max_tokens": 6, "ignore_eos": True, "temperature": 0,
                  "logit_bias": {"8": 100}}
        for body in (repeat, repeat, {**repeat, "stream": True}, {"prompt": "x", "max_tokens": 2,
                                                                  "guided_choice": ["yes", "no"]}):
            assert post("/v1/completions", body).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        assert post("/v1/chat/completions", chat).status_code == 200
        assert post("/v1/completions", {"prompt": "x", "temperature": -1}).status_code == 400
        srv.wait_idle()
        text = httpx.get(srv.url + "/metrics").text
    families = list(text_string_to_metric_families(text))
    samples = d.by_name([(s.name, s.labels) for f in families for s in f.samples])
    return text, families, samples


def exempt(name: str) -> bool:
    return name.startswith(tuple(NOT_APPLICABLE))


def misses(board, samples, skip_exempt: bool) -> list[str]:
    choices = d.variable_choices(board)
    out = []
    for q in d.queries(board):
        for sel in d.selectors(q.expr, MODEL, choices):
            if skip_exempt and exempt(sel.name):
                continue
            why = d.unresolved(sel, samples)
            if why is not None:
                out.append(f"{q.dashboard} / {q.panel}: {why}")
    return sorted(set(out))


@pytest.mark.parametrize("board", VLLM_BOARDS, ids=lambda p: p.name)
def test_every_vllm_dashboard_query_finds_its_series(scrape, board):
    _, _, samples = scrape
    assert any(True for _ in d.queries(board))
    assert misses(board, samples, skip_exempt=True) == []


def test_what_the_dashboards_query_but_we_lack_is_named_and_absent(scrape):
    _, _, samples = scrape
    queried = {sel.name for board in VLLM_BOARDS for q in d.queries(board) for sel in d.selectors(q.expr, MODEL, {})}
    for prefix, why in NOT_APPLICABLE.items():
        names = {n for n in queried if n.startswith(prefix)}
        assert names, f"no dashboard queries {prefix} any more: drop it from NOT_APPLICABLE"
        assert not names & set(samples), f"{names & set(samples)} is exported now: drop it from NOT_APPLICABLE ({why})"


def test_the_model_server_protocol_series(scrape):
    _, families, samples = scrape
    kinds = {f.name: f.type for f in families}
    for name, labels in PROTOCOL.items():
        assert kinds.get(name) == "gauge", name
        [series] = samples[name]
        assert series["model_name"] == MODEL and all(series.get(label) for label in labels), series


def test_our_dashboard_resolves_and_covers_the_seed(scrape):
    _, _, samples = scrape
    assert misses(OUR_BOARD, samples, skip_exempt=False) == []
    exprs = [q.expr for q in d.queries(OUR_BOARD)]
    for hist in ("time_to_first_token_seconds", "request_time_per_output_token_seconds", "inter_token_latency_seconds"):
        for q in ("0.5", "0.95", "0.99"):
            assert any(f"histogram_quantile({q}," in e and f"vllm:{hist}_bucket" in e for e in exprs), (hist, q)
    for series in ("cute_serve:request_slo_attained_total", "cute_serve:kv_cache_tier_usage_perc",
                   "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                   "vllm:spec_decode_num_accepted_tokens_total", "vllm:num_requests_waiting"):
        assert any(series in e for e in exprs), series


@NEEDS_PROMTOOL
def test_our_dashboard_promql_parses(tmp_path):
    """promtool parses each query (Grafana's variables filled) as a recording rule's expression."""
    choices = d.variable_choices(OUR_BOARD)
    rules = []
    for i, q in enumerate(d.queries(OUR_BOARD)):
        if q.panel.startswith("variable "):
            continue
        expr = q.expr
        for interval in d.INTERVALS:
            expr = expr.replace(interval, "1m")
        for name, values in choices.items():
            expr = expr.replace(f"${name}", values[0])
        expr = expr.replace("$model_name", MODEL).replace("$job", ".*").replace("$instance", ".*")
        rules.append(f"      - record: dashboard:query_{i}\n        expr: {expr!r}\n")
    path = tmp_path / "rules.yml"
    path.write_text("groups:\n  - name: dashboard\n    rules:\n" + "".join(rules))
    run = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@NEEDS_PROMTOOL
def test_metrics_pass_promtool(scrape):
    """promtool check metrics parses the exposition; its lint may only object to what vLLM's names
    are: colons (every vllm: name) and a histogram named ..._total (vllm:iteration_tokens_total)."""
    text, _, _ = scrape
    run = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert run.returncode in (0, 3), run.stdout + run.stderr  # 3: lint findings only
    allowed = ("metric names should not contain ':'",
               'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix')
    lint = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    odd = [line for line in lint if not line.endswith(allowed)]
    assert lint and not odd, "\n".join(odd)
