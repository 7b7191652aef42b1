"""The benchmark and profiling scripts run in CI at their --smoke size (seconds each), so they cannot rot:
each is run as a program and its outputs are checked (JSON fields, a real PNG, the exit status)."""
import json
import shutil
import subprocess
import sys

import pytest

from tests.server_utils import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_script(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *args] if args[0].endswith(".py") else list(args)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def test_optimization_ladder_smoke(tmp_path):
    out, png = tmp_path / "ladder.json", tmp_path / "ladder.png"
    proc = run_script("profiling/benchmarks/optimization_ladder.py", "--smoke", "--json", str(out), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    rungs = report["rungs"]
    assert [r["rung"][0] for r in rungs[:3]] == ["1", "2", "3"] and rungs[-1]["rung"].startswith("5")
    for r in rungs:
        if r["config"] is None:  # no quantization mode on this device (yet): said, not skipped silently
            assert r["note"].startswith("n/a") and r["note"] in proc.stdout
            continue
        for key in ("output_tok_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "kv_reserved_mib",
                    "kv_held_mib", "kv_waste", "speedup"):
            assert r[key] >= 0, key
        assert r["output_tokens"] == report["workload"]["output_tokens"]  # ignore_eos: the same work on every rung
    assert rungs[0]["speedup"] == 1.0
    # structural, not timed: static reserves prompt + max_tokens up front, paging only what tokens fill
    assert rungs[1]["kv_waste"] < 0.04 < rungs[0]["kv_waste"]
    assert rungs[2]["prefix_hit_rate"] > 0 and rungs[-1]["spec_acceptance"] > 0
    assert is_png(png)


def test_roofline_smoke_with_a_measured_run(tmp_path):
    measured = tmp_path / "run.json"
    measured.write_text(json.dumps({"workload": {"requests": 2, "prompt_tokens": 400, "output_tokens": 100},
                                    "rungs": [{"rung": "a run", "output_tokens": 100, "prefill_tokens_computed": 400,
                                               "steps": 60, "wall_s": 2.0}]}))
    out, png = tmp_path / "roofline.json", tmp_path / "roofline.png"
    proc = run_script("profiling/benchmarks/roofline.py", "--smoke", "--chips", "cpu,h100,h200", "--measured", str(measured),
                      "--json", str(out), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    chips = {c["name"]: c for c in report["chips"]}
    assert len(chips) == 3 and all(c["peak_flops"] > 0 and c["bandwidth"] > 0 for c in chips.values())
    for step in report["steps"]:
        assert step["bound"] in ("compute", "bandwidth") and step["intensity"] > 0
        if step["label"].startswith("decode b=1 "):  # a matrix-vector step is bandwidth-bound on every chip
            assert step["bound"] == "bandwidth"
    assert [p["label"] for p in report["measured"]] == ["a run"] and report["measured"][0]["flops_per_s"] > 0
    assert is_png(png)


def test_cpu_profile_smoke(tmp_path):
    trace, ops = tmp_path / "trace.json", tmp_path / "ops.json"
    proc = run_script("profiling/benchmarks/cpu_profile.py", "--smoke", "--trace", str(trace), "--json", str(ops))
    assert proc.returncode == 0, proc.stderr
    table = json.loads(ops.read_text())
    names = {r["op"] for r in table["ops"]}
    assert {"attention", "mlp"} <= names  # the engine's NVTX hooks, routed to profiler ranges
    assert table["steps"] > 0 and abs(sum(table["phase_shares"].values()) - 1) < 1e-6
    assert json.loads(trace.read_text())["traceEvents"]


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and "GPU " in subprocess.run([smi, "-L"], capture_output=True, text=True).stdout


@pytest.mark.skipif(_has_gpu(), reason="checks the scripts' refusal on a machine without a GPU")
@pytest.mark.parametrize("script", [["profiling/gpu/nsys.sh"], ["profiling/gpu/ncu.sh", "decode_attention", "decode"]])
def test_nsys_and_ncu_refuse_without_a_gpu_in_one_line(script):
    proc = run_script("bash", *script, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "GPU" in lines[0] and proc.stdout == ""


def test_ladder_picks_up_quantization_modes_when_engine_config_grows_them(monkeypatch):
    from dataclasses import dataclass

    from profiling.benchmarks import optimization_ladder as ol
    from runtime.engine_config import flag

    today = ol.ladder({})
    assert [r.label for r in today[3:7]] == ["4 + quantized (as shipped)", "4 + quantized (int8)", "4 + quantized (q4)",
                                             "4 + quantized (fp8)"]
    assert today[0].config["quantization"] == "none"  # rungs 1-3: float weights, so rung 4 shows the gain

    @dataclass
    class WithQuantization:
        quantization: str | None = flag(None, "weights", choices=(None, "int8", "int4"))

    monkeypatch.setattr(ol, "EngineConfig", WithQuantization)
    rungs = ol.ladder({"speculative": "ngram"})
    assert [r.label for r in rungs[3:6]] == ["4 + quantized (as shipped)", "4 + quantized (int8)",
                                             "4 + quantized (int4)"]
    assert rungs[-1].config == {**rungs[5].config, "speculative": "ngram"}  # speculation on top of the last mode


def test_quant_quality_smoke_measures_every_mode_and_the_shipped_blocks(tmp_path):
    from runtime.engine_config import QUANTIZATION_MODES

    out = tmp_path / "q.json"
    proc = run_script("profiling/quality/quant_quality.py", "--smoke", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [r["path"] for r in report["paths"]] == ["float", "as shipped", "as shipped + bf16 KV", "bf16 weights",
                                                    *QUANTIZATION_MODES]
    assert 0.5 < report["bf16_kv_top1_agreement_vs_as_shipped"] <= 1.0
    assert report["paths"][0]["top1_agreement_vs_float"] == 1.0 and report["positions"] == 512
    assert all(r["perplexity"] > 1 for r in report["paths"]) and "llama.cpp" in proc.stdout


def test_kv_cache_quality_smoke_scores_every_kv_dtype_in_every_case(tmp_path):
    out = tmp_path / "kv.json"
    proc = run_script("profiling/quality/kv_cache_quality.py", "--smoke", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    cases = json.loads(out.read_text())["cases"]
    assert list(cases) == ["text", "long", "long past 150", "multi-turn"]
    for rows in cases.values():
        assert list(rows) == ["float32", "bf16", "int8", "fp8_e4m3", "fp8_e4m3 @1.0"]
        assert rows["bf16"]["ppl_change"] == 0.0 and rows["bf16"]["top1_agreement"] == 1.0
        assert all(r["perplexity"] > 1 and abs(r["ppl_change"]) < 0.05 for r in rows.values())


def test_kv_scale_granularity_smoke_simulates_the_static_cache_exactly(tmp_path):
    """The per-token figures come from a simulation: its static rows must be the engine's 8-bit caches'."""
    out = tmp_path / "granularity.json"
    proc = run_script("profiling/quality/kv_scale_granularity.py", "--smoke", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    for rows in json.loads(out.read_text())["cases"].values():
        for dtype in ("int8", "fp8_e4m3"):
            assert rows[f"{dtype} static (sim)"] == rows[f"{dtype} static (engine)"]
            assert {f"{dtype} per-token", f"{dtype} per-token fp16"} <= set(rows)


def test_fp8_quality_sweep_smoke_swaps_only_the_layers_a_configuration_names():
    proc = run_script("profiling/quality/fp8_quality_sweep.py", "--smoke", "--positions", "64",
                      "--only", "kernel rowwise", "first and last")
    assert proc.returncode == 0, proc.stderr
    rows = {line[:52].strip(): line.split()[-1] for line in proc.stdout.splitlines()[2:]}
    assert set(rows) == {"kernel rowwise: w per channel x a per token", "rowwise, first and last layer float"}
    assert rows["rowwise, first and last layer float"] == "100.0%"  # the tiny model has 2 layers: none swapped
    assert float(rows["kernel rowwise: w per channel x a per token"].rstrip("%")) < 100.0


def test_bench_tp_smoke_splits_steps_into_compute_communication_and_bubble(tmp_path):
    out = tmp_path / "tp.json"
    proc = run_script("profiling/benchmarks/bench_tp.py", "--smoke", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    one, tp2, pp2 = report["rows"]
    assert [(r["tp"], r["pp"]) for r in (one, tp2, pp2)] == [(1, 1), (2, 1), (1, 2)] and report["multi_gpu"] is False
    assert one["decode"]["comm_ms"] == 0 and tp2["decode"]["comm_ms"] > 0 and tp2["prefill"]["steps"] > 0
    assert one["decode"]["bubble_ms"] == tp2["decode"]["bubble_ms"] == 0 < pp2["decode"]["bubble_ms"]
    assert pp2["decode"]["comm_ms"] > 0 and pp2["decode"]["compute_ms"] > 0
    assert "multi-GPU run: no" in proc.stdout and proc.stdout.count("identical greedy tokens: yes") == 2


def test_bench_multiturn_smoke_compares_tiers_with_the_same_engine_without(tmp_path):
    out = tmp_path / "multiturn.json"
    proc = run_script("profiling/benchmarks/bench_multiturn.py", "--smoke", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert set(rows) == {"off", "host", "host+disk", "bigger pool", "restart warm", "restart cold",
                         "no hit, off", "no hit, disk"}
    assert rows["host"]["tiers"]["host_hits"] > 0 and rows["restart warm"]["tiers"]["disk_hits"] > 0
    assert not rows["no hit, disk"]["tiers"].get("disk_hits") and not rows["off"]["tiers"]
    assert report["identical"] and report["identical_restart"] and report["identical_to_bigger_pool"]  # tiny model
    assert "greedy tokens identical" in proc.stdout


@pytest.mark.parametrize("argv", [
    ["profiling/benchmarks/bench_generate.py", "--llama-bench"],
    ["profiling/benchmarks/bench_generate.py", "--vllm-python"],
    ["profiling/benchmarks/bench_offline.py", "--vllm-python"],
    ["profiling/benchmarks/bench_serving.py", "--vllm-python"],
    ["profiling/quality/quant_quality.py", "--llama-cpp-python"],
    ["profiling/quality/llama_cpp_emulation.py", "--llama-cpp-python"],
])
def test_a_missing_peer_program_is_refused_before_the_model_loads(argv):
    proc = run_script(*argv, "/nonexistent/peer", timeout=60)
    assert proc.returncode == 2, proc.stderr[-400:]
    assert f"argument {argv[1]}: /nonexistent/peer: not an executable file" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
