"""Multi-turn chat over a KV pool too small for its working set: what the tiers below the pool buy.

N conversations x M turns share a system prompt; each turn resends the whole history (the answers
the engine gave included) plus a new user message, and the turns arrive interleaved (turn t of every
conversation, then turn t + 1), so a conversation's blocks are evicted before its next turn. The pool
holds about a quarter of the working set. Runs, in one process, on the same prompts:
  off        no tiers: a history the pool dropped is recomputed
  host       --kv-offload-bytes (host memory)
  host+disk  --kv-offload-bytes and --kv-disk-path
  restart    the last turn again after a restart: the disk tier holding the histories (warm) vs a
             fresh directory (cold)
  no hit     every prompt unique: the tiers' cost when nothing comes back
and prints TTFT p50/p99 and output tokens/s, each as a ratio to `off`. Greedy tokens are compared too.

    python profiling/benchmarks/bench_multiturn.py [--conversations 8] [--turns 4] [--smoke]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import runtime  # noqa: E402,F401  first: it sets OpenMP's barrier spin before torch loads

# isort: split
from runtime.build import build_engine  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
from runtime.llm import LLM  # noqa: E402
from runtime.load import load_model  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402


def tokens(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)  # past the special tokens at the front of the vocabulary
    return [rng.randrange(min(100, vocab // 4), vocab) for _ in range(n)]


def conversations(args, vocab: int) -> list[tuple[list[int], list[list[int]]]]:
    """Per conversation, its system prompt (shared) and the user messages of its turns (token ids)."""
    shared = tokens(1, args.system_tokens, vocab)
    return [(shared, [tokens(100 * c + t + 7, args.user_tokens, vocab) for t in range(args.turns)])
            for c in range(args.conversations)]


def unique_prompts(args, vocab: int) -> list[tuple[list[int], list[list[int]]]]:
    """As many one-turn prompts as the conversations have turns, none sharing a block with another."""
    return [(tokens(1000 + i, args.system_tokens, vocab), [tokens(5000 + i, args.user_tokens, vocab)])
            for i in range(args.conversations * args.turns)]


def run(engine, convos, args, replay: list[list[int]] | None = None) -> dict:
    """The conversations turn by turn (each resending its history), or with replay just those prompts once."""
    llm = LLM.from_engine(engine)
    params = SamplingParams(temperature=0, max_tokens=args.answer_tokens, ignore_eos=True)
    histories = [list(system) for system, _ in convos]
    ttfts, outs, produced, prompts = [], [], 0, []
    start = time.perf_counter()
    for t in range(1 if replay else len(convos[0][1])):
        prompts = replay or [h + turns[t] for h, (_, turns) in zip(histories, convos)]
        for h, p, o in zip(histories, prompts, llm.generate(prompts, params, use_tqdm=False)):
            answer = o.outputs[0].token_ids
            h[:] = p + answer
            ttfts.append(o.metrics["ttft"])
            outs.append(answer)
            produced += len(answer)
    wall = time.perf_counter() - start
    ttfts.sort()
    return {"p50": statistics.median(ttfts), "p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "tok_s": produced / wall, "tokens": outs, "tiers": dict(engine.stats.tiers), "last": prompts}


def engine_for(model, args, **tiers):
    cfg, tensors, tok, _ = model() if callable(model) else model
    config = EngineConfig(kv_cache_memory=args.pool_blocks * args.block_bytes, log_ledger=False,
                          max_num_seqs=args.conversations, **tiers)
    return build_engine(config, cfg, dict(tensors), tok)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=256)
    p.add_argument("--user-tokens", type=int, default=64)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--smoke", action="store_true", help="the tests' tiny random model, a few turns")
    args = p.parse_args()
    if args.smoke:
        from tests.tiny_engine import byte_tokenizer, tiny_weights

        cfg, tensors = tiny_weights()
        model = (cfg, tensors, byte_tokenizer(), "")
        args.conversations, args.turns, args.system_tokens, args.user_tokens, args.answer_tokens = 8, 3, 64, 16, 8
    else:
        model = load_model(None)
    cfg = model[0]
    args.block_bytes = 16 * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * cfg.num_layers
    longest = args.system_tokens + args.turns * (args.user_tokens + args.answer_tokens)
    args.working = args.system_tokens + args.conversations * (longest - args.system_tokens)  # distinct tokens
    args.pool_blocks = max(args.working // 16 // 4, 2 * longest // 16)  # a quarter of it, or two histories
    convos = conversations(args, cfg.vocab_size)
    big = 4 * args.working // 16 * args.block_bytes
    with tempfile.TemporaryDirectory() as warm_dir, tempfile.TemporaryDirectory() as cold_dir:
        rows = {}
        for name, tiers in [("off", {}), ("host", {"kv_offload_bytes": big}),
                            ("host+disk", {"kv_offload_bytes": big // 4, "kv_disk_path": warm_dir})]:
            with engine_for(model, args, **tiers) as e:
                rows[name] = run(e, convos, args)
        last = rows["host+disk"]["last"]  # the last turn again, after a restart: its history is on disk
        with engine_for(model, args, kv_disk_path=warm_dir) as e:
            rows["restart warm"] = run(e, convos, args, replay=last)
        with engine_for(model, args, kv_disk_path=cold_dir) as e:
            rows["restart cold"] = run(e, convos, args, replay=last)
        unique = unique_prompts(args, cfg.vocab_size)
        with engine_for(model, args) as e:
            rows["no hit, off"] = run(e, unique, args)
        with engine_for(model, args, kv_disk_path=cold_dir + "-u") as e:
            rows["no hit, disk"] = run(e, unique, args)
    report(rows, args)
    return 0


def report(rows: dict, args) -> None:
    print(f"{args.conversations} conversations x {args.turns} turns, system prompt {args.system_tokens} tokens, "
          f"user {args.user_tokens}, answers {args.answer_tokens}; KV pool {args.pool_blocks} blocks "
          f"({args.pool_blocks * 16 / args.working:.0%} of the working set); load average {os.getloadavg()[0]:.1f}")
    print(f"{'run':<15} {'TTFT p50 s':>10} {'p99 s':>7} {'tok/s':>7} {'p50 vs':>8} {'tok/s vs':>9}  tier hits")
    base = {"restart warm": "restart cold", "restart cold": "restart cold", "no hit, disk": "no hit, off"}
    for name, r in rows.items():
        ref = rows[base.get(name, "off")]
        hits = {k: int(v) for k, v in r["tiers"].items() if k.endswith("_hits")}
        print(f"{name:<15} {r['p50']:>10.3f} {r['p99']:>7.3f} {r['tok_s']:>7.1f} {ref['p50'] / r['p50']:>7.2f}x "
              f"{r['tok_s'] / ref['tok_s']:>8.2f}x  {hits or '-'}")
    same = all(rows[n]["tokens"] == rows["off"]["tokens"] for n in ("host", "host+disk"))
    same_restart = rows["restart warm"]["tokens"] == rows["restart cold"]["tokens"]
    print(f"greedy tokens identical: host and host+disk vs off {same}; restart warm vs cold {same_restart}")


if __name__ == "__main__":
    sys.exit(main())
