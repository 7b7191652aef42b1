"""Batch-1 greedy decode speed (W1-style): our engine with the GGUF's quantized weights as shipped and
with fp32 weights (--quantization none), transformers' generate, llama.cpp (llama-cpp-python, when
this Python imports it) on the same GGUF, and vLLM's CPU build (in the Python --vllm-python names, on the
same weights dequantized, after the others, once per --vllm-dtypes: float32 and its CPU default bfloat16);
same model and prompt, one run.

    python profiling/benchmarks/bench_generate.py [--model PATH] [--new-tokens 128] [--repeats 3] [--vllm-python PY]
        [--vllm-dtypes float32,bfloat16] [--long-context 2048] [--llama-bench PATH]

Prints TTFT and decode tokens/s of each and the ratios against our quantized path ("per-layer": the
same weights without the fused decode step, runtime/accel/cpu_decode_step.py). The long-context row
decodes after a --long-context-token prompt (the shipped text, repeated), with the default bf16 KV
cache and with --kv-cache-dtype float32. --llama-bench: llama.cpp's C++ benchmark on the same GGUF and
threads, run after ours (`-p 0 -n 128 -d 0,N`), and our decode rates as ratios of its tg128 and
tg128 @ dN (targets: 1.5x and 1.3x). Prefix caching is off: the prompts repeat.
With `--device cuda`:
an 8B-shaped random model on the GPU instead, TPOT against its weight-bandwidth floor and batch-64
throughput (profiling/gpu/bench_generate_gpu.py); `--dry-run` lists those cases without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import runtime  # noqa: E402,F401  first: it sets OpenMP's barrier spin before torch loads (runtime/omp_wait.py)
from profiling.common.executable_arg import executable  # noqa: E402
from profiling.common.vllm_peer import vllm_python  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def ours(engine, ids: list[int], n: int) -> tuple[float, float, list[int]]:
    """(TTFT s, decode tokens/s, tokens) for one greedy request."""
    from runtime.sampling_params import SamplingParams
    engine.add_request(f"bench-{time.perf_counter_ns()}", ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    out = None
    while engine.has_unfinished_requests():
        out = (engine.step() or [out])[-1]  # the last output holds the metrics
    m = out.metrics
    return m["ttft"], (n - 1) / (m["e2e"] - m["ttft"]), out.outputs[0].token_ids


def transformers_run(model, ids: list[int], n: int) -> tuple[float, float, list[int]]:
    """Same measurement with transformers: a 1-token generate for TTFT, then the full generate."""
    import torch
    x = torch.tensor([ids])
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
        total = time.perf_counter() - t0
    return ttft, (n - 1) / max(total - ttft, 1e-9), out[0, len(ids):].tolist()


def llama_cpp_run(llm, ids: list[int], n: int) -> tuple[float, float, list[int]]:
    """Same measurement with llama.cpp's greedy generate (reset first: it would reuse the cached prompt)."""
    llm.reset()
    out: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(ids, top_k=1, temp=0.0):
        if not out:
            first = time.perf_counter()
        out.append(tok)
        if len(out) == n:
            break
    return first - t0, (n - 1) / max(time.perf_counter() - first, 1e-9), out


def llama_cpp_model(path: str):
    if not path.endswith(".gguf"):
        return None  # an HF folder: llama.cpp reads GGUF files only
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    import torch

    return Llama(model_path=path, n_threads=torch.get_num_threads(), n_ctx=2048, verbose=False)


# Runs in vLLM's Python (profiling/common/vllm_peer.py): the same measurement as transformers_run, repeats times.
VLLM_SCRIPT = r"""
import json, sys, time


def main():  # vLLM starts its engine core with spawn: everything runs under the main guard
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.load(open(sys.argv[1]))
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=2048, seed=0)
    prompt = TokensPrompt(prompt_token_ids=spec["ids"])

    def generate(n):
        params = SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True)
        return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids

    generate(8)  # warm-up
    runs = []
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        generate(1)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        tokens = generate(spec["n"])
        total = time.perf_counter() - t0
        runs.append([ttft, (spec["n"] - 1) / max(total - ttft, 1e-9), list(tokens)])
    json.dump({"engine": "vllm-cpu:" + spec["dtype"], "runs": runs}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
"""


def vllm_rows(python: str, path: str, ids: list[int], n: int, repeats: int, dtype: str) -> tuple[str, list]:
    from profiling.common.vllm_peer import run_vllm_script

    result = run_vllm_script(python, path, VLLM_SCRIPT, {"ids": ids, "n": n, "repeats": repeats, "dtype": dtype})
    return result["engine"], result["runs"]


# label -> (--quantization, fused CPU decode step on): "per-layer" is the path before the fused step
ENGINES = {"ours q (shipped)": (None, True), "ours q per-layer": (None, False), "ours fp32": ("none", True)}
# --deterministic adds these beside the others, interleaved with them
DETERMINISTIC = {"ours q determ.": (None, True, True), "ours fp32 determ.": ("none", True, True)}


def our_engine(cfg, tensors, tok, quantization: str | None, fused: bool, deterministic: bool = False,
               kv_dtype: str = "auto"):
    """Ours on the CPU; quantization "none" also means float32 weights (an HF checkpoint would keep its bf16)."""
    from runtime.build import build_engine
    from runtime.engine_config import EngineConfig

    engine = build_engine(EngineConfig(device="cpu", backend="torch", kv_cache_memory=256 << 20, log_ledger=False,
                                       quantization=quantization, deterministic=deterministic, kv_cache_dtype=kv_dtype,
                                       dtype="float32" if quantization == "none" else "auto",
                                       enable_prefix_caching=False), cfg, dict(tensors), tok)
    if not fused:
        engine.model_runner.model.decode_step = None
    return engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a .gguf file or an HF folder (default: SmolLM2-135M-Instruct); "
                    "'ours q' is the weights as loaded: a GGUF's blocks, an HF checkpoint's bf16 (or float32)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write results here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dry-run", action="store_true", help="--device cuda: list the cases, run nothing")
    ap.add_argument("--vllm-python", type=executable, default=None, help="a Python with vLLM's CPU build (default: this one, when it "
                    "imports vllm); vLLM runs after the others, in its own process, on the fp32 weights")
    ap.add_argument("--vllm-dtypes", default="float32,bfloat16", help="vLLM runs once per dtype (bfloat16: its CPU "
                    "default on AVX-512 BF16 machines; float32 must give ours fp32's greedy tokens)")
    ap.add_argument("--deterministic", action="store_true", help="also our engines with --deterministic")
    ap.add_argument("--no-peers", action="store_true", help="our engines only (no transformers, llama.cpp)")
    ap.add_argument("--long-context", type=int, default=2048, help="the long-context row's prompt tokens (0: none)")
    ap.add_argument("--llama-bench", type=executable, default=None, help="a llama-bench binary: its tg128 rows beside ours")
    args = ap.parse_args()
    if args.device == "cuda":
        return gpu_main(args)
    import torch
    from transformers import AutoModelForCausalLM

    from runtime.load import load_model

    cfg, tensors, tok, path = load_model(args.model)
    engines = {**ENGINES, **(DETERMINISTIC if args.deterministic else {})}
    runners = {label: (ours, our_engine(cfg, tensors, tok, *how)) for label, how in engines.items()}
    print(f"ours q holds {runners['ours q (shipped)'][1].model_runner.model.quantization()}", flush=True)
    if not args.no_peers:
        where = dict(pretrained_model_name_or_path=os.path.dirname(path), gguf_file=os.path.basename(path)) \
            if path.endswith(".gguf") else dict(pretrained_model_name_or_path=path)
        runners["transformers"] = (transformers_run, AutoModelForCausalLM.from_pretrained(**where,
                                                                                          dtype=torch.float32).eval())
    if not args.no_peers and (llm := llama_cpp_model(path)) is not None:
        runners["llama.cpp"] = (llama_cpp_run, llm)
    ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    n = args.new_tokens
    for run, model in runners.values():
        run(model, ids, 8)  # warm-up
    rows: dict[str, list] = {k: [] for k in runners}
    for _ in range(args.repeats):  # interleaved so drifts in machine load hit all
        for k, (run, model) in runners.items():
            rows[k].append(run(model, ids, n))
    if (python := vllm_python(args.vllm_python)) is not None:
        for dtype in args.vllm_dtypes.split(","):
            label, runs = vllm_rows(python, path, ids, n, args.repeats, dtype)
            rows[label] = runs
    res = {k: {"ttft_ms": 1000 * statistics.median(r[0] for r in v), "decode_tok_s": statistics.median(r[1] for r in v)}
           for k, v in rows.items()}
    same = "transformers" in rows and rows["ours fp32"][0][2] == rows["transformers"][0][2]
    print(f"prompt {len(ids)} tokens, {n} new tokens, greedy, {torch.get_num_threads()} threads, median of "
          f"{args.repeats}" + ("" if "llama.cpp" in runners else "; llama.cpp: llama-cpp-python not importable"))
    print(f"{'engine':<18}{'TTFT ms':>10}{'decode tok/s':>14}{'ours q / this':>15}")
    q = res["ours q (shipped)"]["decode_tok_s"]
    for k, v in res.items():
        print(f"{k:<18}{v['ttft_ms']:>10.1f}{v['decode_tok_s']:>14.1f}{q / v['decode_tok_s']:>14.2f}x")
    vllm_same = {k: v[0][2] == rows["ours fp32"][0][2] for k, v in rows.items() if k.startswith("vllm-cpu:float32")}
    print(f"identical tokens, ours fp32 and transformers: {same}; ours q fused and per-layer: "
          f"{rows['ours q (shipped)'][0][2] == rows['ours q per-layer'][0][2]}"
          + "".join(f"; ours fp32 and {k}: {v}" for k, v in vllm_same.items())
          + ("; ours q and ours q determ.: " + str(rows["ours q (shipped)"][0][2] == rows["ours q determ."][0][2])
             if args.deterministic else "")
          + ("" if any(k.startswith("vllm") for k in rows) else "; vLLM: not installed here (--vllm-python PATH)"))
    long_rows = long_context_rows(cfg, tensors, tok, args.long_context, n, args.repeats)
    peer = llama_bench_rows(args, path, args.long_context, res, long_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**res, "identical_tokens_fp32": same, "prompt_tokens": len(ids), "new_tokens": n,
                       "long_context": long_rows, "llama_bench": peer}, f, indent=2)


# label -> --kv-cache-dtype of the long-context rows (the weights as shipped, the fused step)
LONG = {"ours q, bf16 KV (default)": "auto", "ours q, float32 KV": "float32"}


def long_context_rows(cfg, tensors, tok, tokens: int, n: int, repeats: int) -> dict[str, dict]:
    """TTFT and decode tok/s after a `tokens`-token prompt, per LONG row (median of repeats, interleaved)."""
    if tokens <= 0:
        return {}
    from profiling.common.workloads import TEXT

    with open(TEXT) as f:
        text_ids = tok.encode(f.read())
    ids = (text_ids * (tokens // len(text_ids) + 1))[:tokens]
    engines = {label: our_engine(cfg, tensors, tok, None, True, kv_dtype=kv) for label, kv in LONG.items()}
    for engine in engines.values():
        ours(engine, ids[:64], 8)  # warm-up
    runs: dict[str, list] = {label: [] for label in engines}
    for _ in range(repeats):
        for label, engine in engines.items():
            runs[label].append(ours(engine, ids, n))
    rows = {label: {"ttft_ms": 1000 * statistics.median(r[0] for r in v), "decode_tok_s": statistics.median(r[1] for r in v)}
            for label, v in runs.items()}
    print(f"long context: prompt {tokens} tokens, then {n} new tokens, median of {repeats}")
    for label, row in rows.items():
        print(f"{label:<28}{row['ttft_ms']:>10.1f} ms TTFT{row['decode_tok_s']:>10.1f} decode tok/s")
    return rows


def llama_bench_rows(args: argparse.Namespace, path: str, depth: int, short: dict, long_rows: dict) -> dict[str, float]:
    """llama-bench's tg rows (at depth 0 and `depth`) and our decode rates as ratios of them."""
    if args.llama_bench is None:
        return {}
    import torch

    from profiling.common.llama_bench_peer import llama_bench

    rows = {r.name: r.tok_s for r in llama_bench(args.llama_bench, path, [0, depth] if depth else [0],
                                                 torch.get_num_threads(), args.new_tokens, args.repeats)}
    ours_short = short["ours q (shipped)"]["decode_tok_s"]
    print(f"llama-bench ({torch.get_num_threads()} threads): " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in rows.items()))
    tg = f"tg{args.new_tokens}"
    print(f"ours q short-context decode / llama-bench {tg}: {ours_short / rows[tg]:.2f}x (target 1.5x)")
    if long_rows:
        ours_long = long_rows["ours q, bf16 KV (default)"]["decode_tok_s"]
        print(f"ours q decode at {depth} context / llama-bench {tg} @ d{depth}: "
              f"{ours_long / rows[f'{tg} @ d{depth}']:.2f}x (target 1.3x)")
    return rows


def gpu_main(args: argparse.Namespace) -> int:
    from profiling.gpu import bench_generate_gpu

    rows = bench_generate_gpu.run(args.dry_run)
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
