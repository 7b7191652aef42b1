"""Multi-turn chat over a KV pool too small for its working set: what the tiers below the pool buy.

N conversations x M turns share a system prompt; each turn resends the whole history (the answers
the engine gave included) plus a new user message, and the turns arrive interleaved (turn t of every
conversation, then turn t + 1), so a conversation's blocks are evicted before its next turn. The pool
holds about a quarter of the working set. Runs, in one process, on the same prompts:
  off        no tiers: a history the pool dropped is recomputed
  host       --kv-offload-bytes (host memory)
  host+disk  --kv-offload-bytes and --kv-disk-path
  bigger pool  no tiers, the host tier's bytes added to the pool instead (on the CPU both are RAM)
  restart    the last turn again after a restart: the disk tier holding the histories (warm) vs a
             fresh directory (cold)
  no hit     every prompt unique: the tiers' cost when nothing comes back
and prints TTFT p50/p99 and output tokens/s, each as a ratio to `off`. Greedy tokens are compared too.

    python profiling/benchmarks/bench_multiturn.py [--conversations 8] [--turns 4] [--smoke]
    python profiling/benchmarks/bench_multiturn.py --only-no-hit --no-hit-reps 6   # the 3% question
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import runtime  # noqa: E402,F401  first: it sets OpenMP's barrier spin before torch loads

# isort: split
import torch  # noqa: E402

from runtime.build import build_engine  # noqa: E402
from runtime.device import default_kv_dtype  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
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


def unique_prompts(args, vocab: int, rep: int = 0) -> list[tuple[list[int], list[list[int]]]]:
    """As many one-turn prompts as the conversations have turns, none sharing a block with another (nor
    with another repetition's)."""
    n = args.conversations * args.turns
    first = rep * n
    return [(tokens(1000 + first + i, args.system_tokens, vocab), [tokens(10**6 + first + i, args.user_tokens, vocab)])
            for i in range(n)]


def run(engine, convos, args) -> dict:
    """Turns in interleaved order (turn t of every conversation, then turn t + 1), at most --concurrency
    in flight; a turn goes in, with its conversation's whole history, once the previous answer is back."""
    params = SamplingParams(temperature=0, max_tokens=args.answer_tokens, ignore_eos=True)
    histories = [list(system) for system, _ in convos]
    order = deque((c, t) for t in range(len(convos[0][1])) for c in range(len(convos)))
    busy: dict[str, tuple[int, list[int]]] = {}  # request id -> (conversation, prompt)
    last: list[list[int]] = [[] for _ in convos]  # each conversation's last prompt
    ttfts, answers, by_turn = [], {}, {}
    start = time.perf_counter()
    while order or busy:
        while order and len(busy) < args.concurrency and order[0][0] not in {c for c, _ in busy.values()}:
            c, t = order.popleft()
            last[c] = histories[c] + convos[c][1][t]
            engine.add_request(f"c{c}t{t}", last[c], params)
            busy[f"c{c}t{t}"] = (c, last[c])
        for out in engine.step():
            if out.finished:
                c, prompt = busy.pop(out.request_id)
                answers[out.request_id] = out.outputs[0].token_ids
                histories[c] = prompt + answers[out.request_id]
                ttfts.append(out.metrics["ttft"])
                by_turn.setdefault(int(out.request_id.split("t")[1]), []).append(out.metrics["ttft"])
    wall = time.perf_counter() - start
    ttfts.sort()
    return {"p50": statistics.median(ttfts), "p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "tok_s": sum(map(len, answers.values())) / wall, "tokens": answers, "tiers": dict(engine.stats.tiers),
            "last": last, "by_turn": [statistics.median(by_turn[t]) for t in sorted(by_turn)]}


def engine_for(model, args, extra_blocks: int = 0, **tiers):
    cfg, tensors, tok, _ = model
    config = EngineConfig(kv_cache_memory=(args.pool_blocks + extra_blocks) * args.block_bytes, log_ledger=False,
                          max_num_seqs=args.concurrency, deterministic=args.deterministic, **tiers)
    return build_engine(config, cfg, dict(tensors), tok)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-tokens", type=int, default=256)
    p.add_argument("--user-tokens", type=int, default=256, help="each turn's new message (a document, a tool result)")
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight at once")
    p.add_argument("--smoke", action="store_true", help="the tests' tiny random model, a few turns")
    p.add_argument("--deterministic", action="store_true", help="batch-invariant engines: the greedy-identity "
                   "line then holds whatever came from a tier (without it a cached prefix and a fresh prefill "
                   "reduce in other orders and may part at a near tie)")
    p.add_argument("--no-hit-reps", type=int, default=1, help="no-hit off/disk pairs, alternating which runs "
                   "first, each on prompts of its own: the 3%% question needs more than one pair on a noisy machine")
    p.add_argument("--only-no-hit", action="store_true", help="skip the multi-turn and restart runs")
    p.add_argument("--json", help="also write the rows (ratios included) to this file")
    args = p.parse_args()
    if args.smoke:
        from tests.tiny_engine import byte_tokenizer, tiny_weights

        cfg, tensors = tiny_weights()
        model = (cfg, tensors, byte_tokenizer(), "")
        args.conversations, args.turns, args.system_tokens, args.user_tokens, args.answer_tokens = 6, 3, 64, 32, 8
    else:
        model = load_model(None)
    cfg = model[0]
    element = default_kv_dtype(torch.float32, torch.device("cpu")).itemsize  # the engines' --kv-cache-dtype auto
    args.block_bytes = 16 * 2 * cfg.num_kv_heads * cfg.head_dim * element * cfg.num_layers
    longest = args.system_tokens + args.turns * (args.user_tokens + args.answer_tokens)
    args.working = args.system_tokens + args.conversations * (longest - args.system_tokens)  # distinct tokens
    # a quarter of it, or what the requests in flight need at most
    args.pool_blocks = max(args.working // 16 // 4, args.concurrency * (longest // 16 + 2))
    convos = conversations(args, cfg.vocab_size)
    with tempfile.TemporaryDirectory() as warm_dir, tempfile.TemporaryDirectory() as cold_dir:
        rows = {} if args.only_no_hit else multi_turn_rows(model, convos, args, warm_dir, cold_dir)
        rows.update(no_hit_rows(model, args, cold_dir))
    report(rows, args)
    return 0


def multi_turn_rows(model, convos, args, warm_dir: str, cold_dir: str) -> dict:
    rows = {}
    big = 4 * args.working // 16 * args.block_bytes
    for name, tiers in [("off", {}), ("host", {"kv_offload_bytes": big}),
                        ("host+disk", {"kv_offload_bytes": big // 4, "kv_disk_path": warm_dir})]:
        with engine_for(model, args, **tiers) as e:
            rows[name] = run(e, convos, args)
    with engine_for(model, args, extra_blocks=big // args.block_bytes) as e:  # the host tier's bytes as pool
        rows["bigger pool"] = run(e, convos, args)
    # the last turns again, after a restart: their histories are on disk
    last = [([], [prompt]) for prompt in rows["host+disk"]["last"]]
    with engine_for(model, args, kv_disk_path=warm_dir) as e:
        rows["restart warm"] = run(e, last, args)
    with engine_for(model, args, kv_disk_path=cold_dir) as e:
        rows["restart cold"] = run(e, last, args)
    return rows


def no_hit_rows(model, args, cold_dir: str) -> dict:
    """Off and disk on unique prompts, --no-hit-reps pairs; odd pairs run disk first, so a drift in the
    machine's speed during a pair counts against each side equally often. Tok/s is over all pairs."""
    runs: dict[str, list[dict]] = {"no hit, off": [], "no hit, disk": []}
    for rep in range(args.no_hit_reps):
        unique = unique_prompts(args, model[0].vocab_size, rep)
        order = [("no hit, off", {}), ("no hit, disk", {"kv_disk_path": f"{cold_dir}-u{rep}"})]
        for name, tiers in order[::-1] if rep % 2 else order:
            with engine_for(model, args, **tiers) as e:
                runs[name].append(run(e, unique, args))
    pairs = args.no_hit_pairs = [d["tok_s"] / o["tok_s"] for o, d in zip(runs["no hit, off"], runs["no hit, disk"])]
    if len(pairs) > 1:
        print("no-hit disk vs off, tok/s per pair: " + " ".join(f"{r:.3f}x" for r in pairs)
              + f"; median {statistics.median(pairs):.3f}x")
    return {name: merged(rs) for name, rs in runs.items()}


def merged(runs: list[dict]) -> dict:
    """One row for repeated runs: tokens per second over their summed wall time, the median p50 TTFT and
    the worst p99, the tiers' counters summed."""
    made = [sum(map(len, r["tokens"].values())) for r in runs]
    tiers: dict[str, float] = {}
    for r in runs:
        for k, v in r["tiers"].items():
            tiers[k] = tiers.get(k, 0) + v
    return runs[0] | {"p50": statistics.median(r["p50"] for r in runs), "p99": max(r["p99"] for r in runs),
                      "tok_s": sum(made) / sum(n / r["tok_s"] for n, r in zip(made, runs)), "tiers": tiers}


def report(rows: dict, args) -> None:
    print(f"{args.conversations} conversations x {args.turns} turns, system prompt {args.system_tokens} tokens, "
          f"user {args.user_tokens}, answers {args.answer_tokens}; KV pool {args.pool_blocks} blocks "
          f"({args.pool_blocks * 16 / args.working:.0%} of the working set); load average {os.getloadavg()[0]:.1f}")
    print(f"{'run':<15} {'TTFT p50 s':>10} {'p99 s':>7} {'tok/s':>7} {'p50 vs':>8} {'tok/s vs':>9}  tier hits")
    base = {"restart warm": "restart cold", "restart cold": "restart cold", "no hit, off": "no hit, off",
            "no hit, disk": "no hit, off"}
    for name, r in rows.items():
        ref = rows[base.get(name, "off")]
        hits = {k: int(v) for k, v in r["tiers"].items() if k.endswith("_hits")}
        print(f"{name:<15} {r['p50']:>10.3f} {r['p99']:>7.3f} {r['tok_s']:>7.1f} {ref['p50'] / r['p50']:>7.2f}x "
              f"{r['tok_s'] / ref['tok_s']:>8.2f}x  {hits or '-'}")
    same = same_restart = same_pool = None
    if "off" in rows:
        same = all(rows[n]["tokens"] == rows["off"]["tokens"] for n in ("host", "host+disk"))
        same_restart = rows["restart warm"]["tokens"] == rows["restart cold"]["tokens"]
        # a hit from below and a hit in a pool big enough compute the same chunks: the fair identity check on
        # a quantized model, whose last bits follow the chunking (a recompute runs other chunks than a hit)
        same_pool = rows["host"]["tokens"] == rows["bigger pool"]["tokens"]
        print(f"greedy tokens identical: host and host+disk vs off {same}; restart warm vs cold {same_restart}; "
              f"host vs bigger pool {same_pool}")
    if args.json:
        keep = ("p50", "p99", "tok_s", "tiers")
        out = {name: {k: r[k] for k in keep} | {"p50_vs": rows[base.get(name, "off")]["p50"] / r["p50"]}
               for name, r in rows.items()}
        with open(args.json, "w") as f:
            json.dump({"rows": out, "identical": same, "identical_restart": same_restart,
                       "identical_to_bigger_pool": same_pool, "no_hit_pairs": args.no_hit_pairs}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
