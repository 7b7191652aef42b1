"""Prefix caching: one shared ~1,000-token system prompt, 32 different short questions, all submitted
at once; the same workload with the cache on and off in one run.

    python profiling/benchmarks/bench_prefix.py [--model PATH] [--questions 32] [--json out.json]

Prints TTFT P50/P99 and prefill tokens actually computed, and the ratios off/on.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from profiling.common.workloads import percentile  # noqa: E402
from runtime.build import build_engine  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
from runtime.llm import LLM  # noqa: E402
from runtime.load import load_model  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402

TOPICS = ["astronomy", "cooking", "gardening", "history", "music", "chess", "sailing", "geology", "poetry", "robots"]


def system_prompt(target_tokens: int, tokenizer) -> str:
    rng = random.Random(0)
    rules = []
    while len(tokenizer.encode(" ".join(rules))) < target_tokens:
        a, b = rng.sample(TOPICS, 2)
        rules.append(f"Rule {len(rules) + 1}: when asked about {a}, relate it to {b} and answer in at most two sentences.")
    return " ".join(rules)


def run(model, enable: bool, prompts: list[list[int]], max_tokens: int) -> dict:
    cfg, tensors, tok, _ = load_model(model)
    engine = build_engine(EngineConfig(device="cpu", backend="torch", kv_cache_memory=1 << 30, log_ledger=False,
                                    enable_prefix_caching=enable), cfg, tensors, tok)
    llm = LLM.from_engine(engine)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # warm-up
    before = engine.stats.computed_prefill_tokens
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    wall = time.perf_counter() - t0
    ttft = [o.metrics["ttft"] for o in outs]
    return {"prefix_caching": enable, "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "prefill_tokens_computed": engine.stats.computed_prefill_tokens - before, "wall_s": wall,
            "hit_rate": engine.stats.prefix_cache_hit_rate, "tokens": [o.outputs[0].token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    _, _, tok, _ = load_model(args.model)
    system = system_prompt(args.system_tokens, tok)
    prompts = [tok.encode_chat([{"role": "system", "content": system},
                                {"role": "user", "content": f"Question {i}: tell me one fact about {TOPICS[i % 10]}."}])
               for i in range(args.questions)]
    print(f"{len(prompts)} requests, prompts {min(map(len, prompts))}-{max(map(len, prompts))} tokens "
          f"({sum(map(len, prompts))} in all), {args.max_tokens} output tokens each")
    on, off = run(args.model, True, prompts, args.max_tokens), run(args.model, False, prompts, args.max_tokens)
    print(f"{'prefix cache':<14}{'TTFT p50 s':>12}{'TTFT p99 s':>12}{'prefill tokens':>16}{'hit rate':>10}{'wall s':>9}")
    for r in (on, off):
        print(f"{'on' if r['prefix_caching'] else 'off':<14}{r['ttft_p50']:>12.3f}{r['ttft_p99']:>12.3f}"
              f"{r['prefill_tokens_computed']:>16}{r['hit_rate']:>10.1%}{r['wall_s']:>9.1f}")
    print(f"TTFT p50 off/on: {off['ttft_p50'] / on['ttft_p50']:.1f}x; prefill tokens off/on: "
          f"{off['prefill_tokens_computed'] / on['prefill_tokens_computed']:.1f}x; identical outputs: {on['tokens'] == off['tokens']}")
    if args.json:
        json.dump([{k: v for k, v in r.items() if k != "tokens"} for r in (on, off)], open(args.json, "w"), indent=2)


if __name__ == "__main__":
    main()
