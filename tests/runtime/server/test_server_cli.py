"""`python -m runtime.serve` as a user runs it (on a tiny model folder), and bench_serving end to end."""
import json
import socket
import subprocess
import sys

import httpx
import openai
import pytest

from profiling.benchmarks import bench_serving
from runtime.serve import intra_op_threads, parse_args
from tests.server_utils import REPO, serve_subprocess, wait_for_chat_page, write_tiny_model

SMALL_KV = ["--kv-cache-memory", "8MiB"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))


def test_help_and_defaults():
    res = subprocess.run([sys.executable, "-m", "runtime.serve", "--help"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0
    for flag in ("--host", "--port", "--api-key", "--max-queue", "--model", "--kv-cache-memory", "--max-model-len"):
        assert flag in res.stdout
    args = parse_args([])
    assert args.host == "127.0.0.1" and args.port == 8000  # never all interfaces unless asked


def test_loading_threads_are_set_inside_and_restored_after():
    import torch

    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), intra_op_threads(1):
        raise RuntimeError("a failed load")
    assert torch.get_num_threads() == before
    with intra_op_threads(None):  # tensor parallelism sets its own
        torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(before)


def test_taken_port_is_one_line_error_before_loading(tiny_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "runtime.serve", "--model", tiny_model, "--port", str(port)],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "Traceback" not in res.stderr
    assert "loading" not in res.stderr  # failed before the model load


def test_serve_starts_shows_ledger_and_serves_the_openai_client(tiny_model):
    with serve_subprocess("--model", tiny_model, "--api-key", "k", "--served-model-name", "tiny-cli", *SMALL_KV,
                          timeout=120) as (url, log):
        client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny-cli"]
        r = client.chat.completions.create(model="tiny-cli", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 4
        key = {"Authorization": "Bearer k"}
        wait_for_chat_page(url)
        page = httpx.get(url + "/", headers=key, follow_redirects=False)  # the chat UI is mounted at /
        assert page.status_code == 200 and "gradio" in page.text.lower()
        assert httpx.get(url + "/").status_code == 401  # behind the key too
        # ...and leaves the API's own answers to API paths: 405 for a wrong method, 404 in OpenAI's shape
        assert httpx.get(url + "/v1/completions", headers=key).status_code == 405
        missing = httpx.get(url + "/v1/nothing", headers=key)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        assert httpx.post(url + "/health").status_code == 405
        startup = log()
    assert "loading" in startup and "KV cache (bfloat16, " in startup
    assert f"chat page: {url}/" in startup


def test_bench_serving_launches_a_server_and_reports(tiny_model, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"prompt {i}", "max_tokens": 3 + i % 4}) for i in range(5)))
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "profiling/benchmarks/bench_serving.py", "--launch", "--model", tiny_model,
                          "--server-args", " ".join(SMALL_KV), "--workload", str(prompts), "--num-requests", "12",
                          "--rate", "40", "--concurrency", "4", "--slo-ttft", "10", "--slo-tpot", "10",
                          "--max-duration", "120", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "server settled after" in res.stdout  # the chat page built and start-up work done before the load
    summary = json.loads((tmp_path / "run.json").read_text())["summary"]
    assert summary["completed"] == 12 and summary["failed"] == 0
    assert summary["output_tokens"] == sum(3 + (i % 5) % 4 for i in range(12))  # ignore_eos: exact lengths
    for metric in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert 0 < summary[metric]["p50"] <= summary[metric]["p95"] <= summary[metric]["p99"]
    assert summary["goodput"] == pytest.approx(summary["request_throughput"])  # generous SLOs: all meet them
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "TTFT" in res.stdout and "goodput" in res.stdout


@pytest.mark.parametrize("url", ["http://example.com:8000", "http://localhost:8000", "http://10.0.0.1:8000"])
def test_bench_serving_refuses_hosts_other_than_loopback_ip(url, capsys):
    assert bench_serving.main(["--url", url, "--num-requests", "1"]) == 2
    assert "only targets 127.0.0.1" in capsys.readouterr().err


def test_grammar_budgets_reach_the_limits_and_nonpositive_ones_are_refused(capsys):
    from runtime.serve import grammar_limits

    limits = grammar_limits(parse_args(["--max-mask-cpu-ms", "4", "--max-mask-wait-ms", "30"]))
    assert (limits.mask_cpu_ms, limits.mask_wait_ms) == (4, 30)
    for flag in ("--max-mask-cpu-ms", "--max-mask-wait-ms", "--max-grammar-compile-seconds"):
        with pytest.raises(SystemExit) as exit_:
            parse_args([flag, "0"])
        assert exit_.value.code == 2 and flag in capsys.readouterr().err


def test_the_compile_cpu_share_reaches_the_limits_and_one_outside_0_1_is_refused(capsys):
    from runtime.serve import grammar_limits

    assert grammar_limits(parse_args(["--grammar-compile-cpu-share", "0.5"])).compile_cpu_share == 0.5
    assert grammar_limits(parse_args([])).compile_cpu_share == 0.25
    for bad in ("0", "1.5", "nan"):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--grammar-compile-cpu-share", bad])
        assert exit_.value.code == 2 and "--grammar-compile-cpu-share" in capsys.readouterr().err
