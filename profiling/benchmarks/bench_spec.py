"""Speculative decoding at batch 1 on the default model, in one run:
 (a) n-gram prompt lookup on copy-heavy prompts (greedy): decode tok/s on vs off, outputs identical;
 (b) a draft model: the best draft we can build offline is the target truncated to its first layers
     (no second model with this tokenizer ships offline); acceptance and speed, however they come out;
 (c) a high-temperature chat workload: what n-gram speculation gains or loses there.

    python profiling/benchmarks/bench_spec.py [--max-tokens 128] [--draft-layers 8] [--json out.json] [--png out.png]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runtime.build import (
    build_engine,
    draft_proposer,  # noqa: E402
)
from runtime.engine import LLMEngine  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
from runtime.llm import LLM  # noqa: E402
from runtime.load import load_model  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402
from runtime.spec.ngram import NgramProposer  # noqa: E402

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''
PARAGRAPH = ("The lighthouse keeper climbed the stairs every evening to light the lamp. He had done this for "
             "thirty years, and he never mised a single night, even during the worst storms of the winter.")
COPY_TASKS = [f"Repeat this code exactly, but rename the variable subtotal to base:\n\n{CODE}",
              f"Fix the typo in this paragraph and repeat the whole paragraph:\n\n{PARAGRAPH}"]
CHAT_TASKS = ["Tell me a short story about a dragon who learns to cook.", "What are three fun facts about octopuses?"]


def make_engine(cfg, tensors, tok) -> LLMEngine:
    return build_engine(EngineConfig(device="cpu", backend="torch", kv_cache_memory=512 << 20, log_ledger=False,
                                  num_speculative_tokens=4), cfg, dict(tensors), tok)


def truncated(cfg, tensors, layers: int):
    """The target's first `layers` decoder layers with its embeddings and final norm: a cheap self-draft."""
    import dataclasses

    keep = {k: v for k, v in tensors.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    return dataclasses.replace(cfg, num_layers=layers), keep


def measure(engine: LLMEngine, proposer, prompts, params) -> dict:
    engine.set_proposer(proposer)
    engine.stats.spec_proposed = engine.stats.spec_accepted = engine.stats.spec_verify_steps = 0
    llm = LLM.from_engine(engine)
    tokens, tps = [], []
    for p in prompts:  # batch 1: one request at a time
        out = llm.generate([p], params, use_tqdm=False)[0]
        m = out.metrics
        n = len(out.outputs[0].token_ids)
        tps.append((n - 1) / (m["e2e"] - m["ttft"]))
        tokens.append(out.outputs[0].token_ids)
    s = engine.stats
    return {"decode_tok_s": sum(tps) / len(tps), "tokens": tokens, "acceptance": s.spec_acceptance_rate,
            "mean_accepted_per_step": s.spec_mean_accepted_len}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None)
    args = ap.parse_args()
    cfg, tensors, tok, _ = load_model(None)
    engine = make_engine(cfg, tensors, tok)
    chat = lambda t: tok.encode_chat([{"role": "user", "content": t}])  # noqa: E731
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    hot = SamplingParams(temperature=1.0, top_p=0.95, seed=0, max_tokens=args.max_tokens)
    copy, chats = [chat(t) for t in COPY_TASKS], [chat(t) for t in CHAT_TASKS]
    measure(engine, None, [copy[0]], SamplingParams(temperature=0, max_tokens=8))  # warm-up
    dcfg, dtensors = truncated(cfg, tensors, args.draft_layers)
    draft = draft_proposer(dcfg, dtensors, cfg, engine.config, engine.device, engine.dtype)
    rows = []
    for name, prompts, params in [("copy, greedy", copy, greedy), ("chat, T=1.0", chats, hot)]:
        base = measure(engine, None, prompts, params)
        for label, prop in [("ngram", NgramProposer(1, 4)), (f"draft({args.draft_layers} layers)", draft)]:
            if label.startswith("draft") and "T=1.0" in name:
                continue
            r = measure(engine, prop, prompts, params)
            rows.append({"workload": name, "proposer": label, "off_tok_s": base["decode_tok_s"], "on_tok_s": r["decode_tok_s"],
                         "speedup": r["decode_tok_s"] / base["decode_tok_s"], "acceptance": r["acceptance"],
                         "accepted_per_step": r["mean_accepted_per_step"],
                         "identical": r["tokens"] == base["tokens"] if params.greedy else None})
    print(f"batch 1, {args.max_tokens} new tokens, K=4, float32 on {os.cpu_count()} cores")
    print(f"{'workload':<15}{'proposer':<18}{'off tok/s':>10}{'on tok/s':>10}{'speedup':>9}{'accept':>8}{'acc/step':>9}{'same':>6}")
    for r in rows:
        same = "-" if r["identical"] is None else ("yes" if r["identical"] else "NO")
        print(f"{r['workload']:<15}{r['proposer']:<18}{r['off_tok_s']:>10.1f}{r['on_tok_s']:>10.1f}{r['speedup']:>8.2f}x"
              f"{r['acceptance']:>8.0%}{r['accepted_per_step']:>9.2f}{same:>6}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=2)
    if args.png:
        plot(rows, args.png)


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['workload']}\n{r['proposer']}" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(range(len(rows)), [r["speedup"] for r in rows], color=["tab:green" if r["speedup"] >= 1 else "tab:red" for r in rows])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("decode speed-up vs no speculation")
    for i, r in enumerate(rows):
        ax.text(i, r["speedup"], f"{r['speedup']:.2f}x\nacc {r['acceptance']:.0%}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
