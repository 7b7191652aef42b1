"""Offline throughput: 64 requests (prompts 32-512 tokens, outputs 16-256, greedy or sampled, ignore_eos,
token-id prompts), run side by side by (a) transformers' batched generate, (b) our static batching, (c) our
continuous batching, with the weights as loaded (a GGUF's quantized blocks) or, as continuous-fp32,
dequantized to fp32 (continuous-int8 / -q4: those --quantization modes), (d) llama.cpp one request at a
time (engine llama.cpp, llama-cpp-python in this Python), and (e) vLLM's CPU build when it is installed
(in this Python, or the one --vllm-python names: vLLM pins its own torch, so it usually lives in a
separate virtual environment), once per --vllm-dtypes (float32 and bfloat16, its CPU default here).
--ttft-prompt N adds one N-token prompt's TTFT, ours and each vLLM run's, prefix caching off.

    python profiling/benchmarks/bench_offline.py [--engines continuous,continuous-fp32,static,transformers] [--hf-batch 16]
        [--vllm-python /path/to/venv/bin/python] [--vllm-dtypes float32,bfloat16] [--ttft-prompt 2000]
        [--kv-bytes N] [--temperature T --top-p P] [--json out.json]

Prints useful output tokens/s (requested tokens only), TTFT/TPOT P50/P99, ratios, and where a step's
time goes in the continuous engine. A smaller --kv-bytes shows the two schedulers under memory
pressure: static reserves prompt + max_tokens up front, continuous takes blocks as tokens arrive.
An engine name may end in :DTYPE, that run's --kv-cache-dtype (e.g. continuous:float32,continuous:int8):
under a budget that forces preemptions with float32, the table of KV tokens, preemptions and throughput
per dtype shows what a narrower cache buys.
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

# isort: split
import torch  # noqa: E402

from profiling.common.executable_arg import executable  # noqa: E402
from profiling.common.vllm_peer import run_vllm_script, vllm_python  # noqa: E402
from profiling.common.workloads import offline_workload, percentile  # noqa: E402
from runtime.build import build_engine  # noqa: E402
from runtime.engine_config import KV_CACHE_DTYPES, EngineConfig  # noqa: E402
from runtime.llm import LLM  # noqa: E402
from runtime.load import load_model  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402


def run_ours(model_path, workload, name: str, args) -> dict:
    """name: continuous or static, with -fp32 / -int8 / -q4 for that --quantization (fp32: none), and
    :DTYPE for that --kv-cache-dtype (default: --kv-cache-dtype)."""
    name, _, kv_dtype = name.partition(":")
    policy, _, weights = name.partition("-")
    cfg, tensors, tok, _ = load_model(model_path)
    engine = build_engine(EngineConfig(device="cpu", backend="torch", kv_cache_memory=args.kv_bytes, scheduler=policy,
                                    max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                                    log_ledger=False, enable_prefix_caching=args.enable_prefix_caching,
                                    quantization={"fp32": "none"}.get(weights, weights or None),
                                    kv_cache_dtype=kv_dtype or args.kv_cache_dtype, deterministic=args.deterministic),
                          cfg, tensors, tok)
    llm = LLM.from_engine(engine)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    engine.stats.times.__init__()
    warm_prefill = engine.stats.computed_prefill_tokens
    params = [SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=i, max_tokens=r.max_tokens,
                             ignore_eos=True) for i, r in enumerate(workload)]
    t0 = time.perf_counter()
    outs = llm.generate([r.prompt_ids for r in workload], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    useful = sum(len(o.outputs[0].token_ids) for o in outs)
    ttft = [o.metrics["ttft"] for o in outs]
    tpot = [o.metrics["tpot"] for o in outs if o.metrics["tpot"] is not None]
    return {"engine": name + (f":{kv_dtype}" if kv_dtype else ""), "kv_dtype": engine.ledger.kv_dtype,
            "kv_tokens": engine.ledger.max_tokens, "wall_s": wall, "useful_tok_s": useful / wall, "useful_tokens": useful,
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "tpot_p50": percentile(tpot, 50), "tpot_p99": percentile(tpot, 99),
            "steps": engine.stats.steps, "preemptions": engine.stats.preemptions,
            "computed_prefill_tokens": engine.stats.computed_prefill_tokens - warm_prefill, "time_shares": engine.stats.times.shares(),
            "tokens": [o.outputs[0].token_ids for o in outs]}


def run_transformers(model_path, workload, batch: int, temperature: float, top_p: float) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(model_path), gguf_file=os.path.basename(model_path),
                                                 dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    t0 = time.perf_counter()
    useful, e2e = 0, []
    for i in range(0, len(workload), batch):
        group = workload[i:i + batch]
        width = max(len(r.prompt_ids) for r in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(group):  # left padding
            ids[j, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[j, width - len(r.prompt_ids):] = 1
        n = max(r.max_tokens for r in group)
        with torch.no_grad():
            sampling = (dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature
                        else dict(do_sample=False))
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **sampling)
        done = time.perf_counter() - t0
        useful += sum(r.max_tokens for r in group)
        e2e += [done] * len(group)
    wall = time.perf_counter() - t0
    return {"engine": f"transformers(b={batch})", "wall_s": wall, "useful_tok_s": useful / wall, "useful_tokens": useful,
            "e2e_p50": percentile(e2e, 50)}


def run_llama_cpp(model_path, workload) -> dict:
    """llama.cpp (llama-cpp-python) on the same GGUF, greedy, one request at a time."""
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_threads=torch.get_num_threads(), n_ctx=2048, verbose=False)
    t0, useful = time.perf_counter(), 0
    for r in workload:
        llm.reset()
        for i, _ in enumerate(llm.generate(r.prompt_ids, top_k=1, temp=0.0)):
            if i + 1 == r.max_tokens:
                break
        useful += r.max_tokens
    wall = time.perf_counter() - t0
    return {"engine": "llama.cpp(1 at a time)", "wall_s": wall, "useful_tok_s": useful / wall, "useful_tokens": useful}


VLLM_SCRIPT = r"""
import json, statistics, sys, time


def main():  # vLLM starts its engine core with spawn: everything runs under the main guard
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.load(open(sys.argv[1]))
    long_ids = spec["ttft_prompt"]
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=max(2048, len(long_ids) + 16), seed=0,
              enforce_eager=spec["eager"], enable_prefix_caching=False)
    prompts = [TokensPrompt(prompt_token_ids=r[0]) for r in spec["requests"]]
    # no per-request seeds: vLLM's CPU sampler fails on them ("CPU Generator does not use offset");
    # LLM(seed=0) seeds the run instead
    params = [SamplingParams(temperature=spec["temperature"], top_p=spec["top_p"], max_tokens=r[1],
                             ignore_eos=True) for r in spec["requests"]]
    llm.generate(prompts[:1], params[:1])
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    useful = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {"engine": "vllm-cpu:" + spec["dtype"], "wall_s": wall, "useful_tok_s": useful / wall,
              "useful_tokens": useful}
    if long_ids:  # TTFT of one long prompt: one output token, prefix caching off, the median of the repeats
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        times = []
        for _ in range(spec["ttft_repeats"]):
            t0 = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=long_ids)], one)
            times.append(time.perf_counter() - t0)
        result["long_ttft_s"] = statistics.median(times)
    json.dump(result, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
"""


def run_vllm(python: str, model_path: str, workload, dtype: str, long_ids: list[int], args) -> dict:
    spec = {"requests": [[r.prompt_ids, r.max_tokens] for r in workload], "temperature": args.temperature,
            "top_p": args.top_p, "dtype": dtype, "eager": args.vllm_eager, "ttft_prompt": long_ids,
            "ttft_repeats": args.repeats}
    return run_vllm_script(python, model_path, VLLM_SCRIPT, spec)


def long_prompt_ttft(model_path: str, long_ids: list[int], args) -> float:
    """Our default engine's TTFT for one long prompt (one output token, prefix caching off): the median of
    --repeats after a warm-up."""
    cfg, tensors, tok, _ = load_model(model_path)
    engine = build_engine(EngineConfig(device="cpu", backend="torch", kv_cache_memory=args.kv_bytes,
                                       max_num_batched_tokens=args.max_num_batched_tokens, log_ledger=False,
                                       enable_prefix_caching=False, deterministic=args.deterministic),
                          cfg, tensors, tok)
    times = []
    for i in range(args.repeats + 1):
        engine.add_request(f"long{i}", long_ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def print_table(results: list[dict], base: dict | None) -> None:
    print(f"{'engine':<20}{'useful tok/s':>13}{'wall s':>9}{'TTFT p50/p99 s':>17}{'TPOT p50/p99 ms':>18}{'vs cont.':>9}")
    for r in results:
        lat = (f"{r['ttft_p50']:.2f}/{r['ttft_p99']:.2f}" if "ttft_p50" in r else "-")
        tp = (f"{r['tpot_p50'] * 1e3:.0f}/{r['tpot_p99'] * 1e3:.0f}" if "tpot_p50" in r else "-")
        ratio = f"{base['useful_tok_s'] / r['useful_tok_s']:.2f}x" if base and r is not base else ""
        print(f"{r['engine']:<20}{r['useful_tok_s']:>13.1f}{r['wall_s']:>9.1f}{lat:>17}{tp:>18}{ratio:>9}")


def print_kv_table(results: list[dict]) -> None:
    """KV tokens, preemptions and throughput per KV cache dtype, when the runs held more than one."""
    runs = [r for r in results if "kv_dtype" in r]
    if len({r["kv_dtype"] for r in runs}) < 2:
        return
    first = runs[0]
    print(f"{'engine':<24}{'KV dtype':<15}{'KV tokens':>10}{'preemptions':>13}{'useful tok/s':>14}"
          f"{'vs ' + first['kv_dtype']:>16}")
    for r in runs:
        print(f"{r['engine']:<24}{r['kv_dtype']:<15}{r['kv_tokens']:>10}{r['preemptions']:>13}"
              f"{r['useful_tok_s']:>14.1f}{r['useful_tok_s'] / first['useful_tok_s']:>15.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--engines", default="continuous,continuous-fp32,static,transformers",
                    help="continuous[-fp32|-int8|-q4][:KV_DTYPE], static[-...], transformers, llama.cpp")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096,
                    help="step token budget of our engines (default 4096, what vLLM's offline LLM uses)")
    ap.add_argument("--kv-bytes", type=int, default=3 << 30)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                    help="our engines' KV cache element type (default: auto, the compute dtype)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 (default): greedy; above 0 every engine samples (ours seeded per request)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                    help="the prompts share no prefixes; under KV pressure the cache keeps a preempted "
                         "sequence's blocks for its recompute")
    ap.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=False,
                    help="our engines with --deterministic (batch-invariant; README, Deterministic inference)")
    ap.add_argument("--vllm-python", type=executable, default=None,
                    help="a Python interpreter that has vLLM's CPU build (default: this one, if it has vLLM)")
    ap.add_argument("--vllm-dtypes", default="float32,bfloat16",
                    help="vLLM runs once per dtype (bfloat16: its CPU default on AVX-512 BF16 machines)")
    ap.add_argument("--vllm-eager", action=argparse.BooleanOptionalAction, default=True,
                    help="vLLM with enforce_eager (starts in ~20 s instead of compiling for 70-100 s)")
    ap.add_argument("--ttft-prompt", type=int, default=0, metavar="TOKENS",
                    help="also the TTFT of one prompt of TOKENS random token ids, ours and vLLM's (0: skip)")
    ap.add_argument("--repeats", type=int, default=3, help="--ttft-prompt: the median of this many")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from weights.default import resolve_model_path

    path = resolve_model_path(args.model)
    workload = offline_workload(args.requests)
    print(f"workload: {len(workload)} requests, {sum(len(r.prompt_ids) for r in workload)} prompt tokens, "
          f"{sum(r.max_tokens for r in workload)} output tokens; {torch.get_num_threads()} threads")
    results = []
    for name in args.engines.split(","):
        if name.partition(":")[0].partition("-")[0] in ("continuous", "static"):
            results.append(run_ours(path, workload, name, args))
        elif name == "llama.cpp":
            results.append(run_llama_cpp(path, workload))
        elif name == "transformers":
            results.append(run_transformers(path, workload, args.hf_batch, args.temperature, args.top_p))
        r = results[-1]
        extra = (f" ({r['preemptions']} preemptions, {r['computed_prefill_tokens']} prefill tokens computed)"
                 if "preemptions" in r else "")
        print(f"  done: {r['engine']} {r['useful_tok_s']:.1f} useful tok/s{extra}", flush=True)
    long_ids = (torch.randint(3, 49000, (args.ttft_prompt,), generator=torch.Generator().manual_seed(7)).tolist()
                if args.ttft_prompt else [])
    if long_ids:
        ours_ttft = long_prompt_ttft(path, long_ids, args)
        print(f"  done: ours, {args.ttft_prompt}-token prompt TTFT {ours_ttft:.3f} s", flush=True)
    if (python := vllm_python(args.vllm_python)) is not None:
        for dtype in filter(None, args.vllm_dtypes.split(",")):
            results.append(run_vllm(python, path, workload, dtype, long_ids, args))
            print(f"  done: {results[-1]['engine']} {results[-1]['useful_tok_s']:.1f} useful tok/s", flush=True)
    else:
        print("  vLLM: not installed here; --vllm-python PATH runs it from another environment", flush=True)
    base = next((r for r in results if r["engine"] == "continuous"), None)
    print_table(results, base)
    print_kv_table(results)
    if long_ids:
        print(f"{args.ttft_prompt}-token prompt TTFT: ours {ours_ttft:.3f} s" + "".join(
            f"; {r['engine']} {r['long_ttft_s']:.3f} s ({r['long_ttft_s'] / ours_ttft:.2f}x ours)"
            for r in results if "long_ttft_s" in r))
    ours = {r["engine"]: r for r in results if "tokens" in r}
    if "continuous" in ours and "static" in ours:
        print("continuous and static outputs identical:", ours["continuous"]["tokens"] == ours["static"]["tokens"])
    if base and "continuous-fp32" in ours:
        print(f"continuous with the weights as loaded / fp32: "
              f"{base['useful_tok_s'] / ours['continuous-fp32']['useful_tok_s']:.2f}x")
    if base:
        print("continuous step time shares:", ", ".join(f"{k} {v:.1%}" for k, v in base["time_shares"].items()))
    if args.json:
        json.dump([{k: v for k, v in r.items() if k != "tokens"} for r in results], open(args.json, "w"), indent=2)


if __name__ == "__main__":
    main()
