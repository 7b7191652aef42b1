"""Self-distillation of the draft heads on this machine's CPUs, for the default model or any --model:

    python profiling/quality/train_heads.py [--kind medusa|eagle|both] [--prompts 400] [--out DIR] [--smoke]

1. data: the engine answers training prompts (runtime/spec/prompts.py, chat template applied) at several
   temperatures; the target's final hidden state at each response position is recorded on the way
   (runtime/spec/distill.py) and cached with --data-cache (fp16).
2. the draft vocabulary: the tokens the target emitted most; its teacher: the target's own distribution
   at every position over them, from its LM head (runtime/spec/training.py).
3. training (AdamW, one-cycle), 4. evaluation on held-out greedy answers: each draft position's
   acceptance given the earlier ones and the mean accepted length, exactly what greedy verification would
   accept on them (up to the float order of the verify path).
Heads go to --out (default: the cache --speculative medusa|eagle reads; runtime/spec/data/ holds the shipped
ones), named for the target (runtime/spec/heads.py's heads_file). --smoke: every stage in seconds (CI).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from runtime.build import build_engine  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
from runtime.load import load_model  # noqa: E402
from runtime.spec.distill import Samples, collect  # noqa: E402
from runtime.spec.head_proposer import head_rows  # noqa: E402
from runtime.spec.heads import CACHE, KINDS, HeadConfig, heads_file, make_head, save_heads  # noqa: E402
from runtime.spec.prompts import training_prompts  # noqa: E402
from runtime.spec.training import draft_vocab, evaluate, fit, teacher  # noqa: E402


def _args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="the target (default: the default model)")
    ap.add_argument("--kind", default="both", choices=(*KINDS, "both"))
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--temperatures", default="0,0.7,1.0")
    ap.add_argument("--seed", type=int, default=0, help="which prompts (a shuffle of them) and the sampling seeds")
    ap.add_argument("--data-minutes", type=float, default=float("inf"), help="cut generation after this long")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--heads", type=int, default=4, help="Medusa heads / EAGLE unrolled steps")
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=1024, help="the EAGLE-style block's MLP width")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--out", default=CACHE)
    ap.add_argument("--data-cache", default=None, help="a .pt file: load the data from it if present, else save it "
                    "there; several, comma-separated: their data together")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run of every stage (CI)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.prompts, args.temperatures, args.max_tokens, args.epochs = 4, "0,1.0", 12, 1
        args.draft_vocab, args.inter, args.heads = 512, 64, 2
    return args


def data(args, engine, tokenizer) -> Samples:
    paths = args.data_cache.split(",") if args.data_cache else []
    if paths and all(os.path.exists(p) for p in paths):
        return Samples.concat([Samples(**torch.load(p)) for p in paths])
    if len(paths) > 1:
        raise SystemExit(f"--data-cache: {', '.join(p for p in paths if not os.path.exists(p))} missing "
                         "(several files are only read; generate each with its own run)")
    prompts = [tokenizer.encode_chat([{"role": "user", "content": p}])
               for p in training_prompts(args.prompts, args.seed)]
    temps = [float(t) for t in args.temperatures.split(",")]
    t0 = time.perf_counter()
    samples = collect(engine, prompts, temps, args.max_tokens, args.seed, args.data_minutes * 60)
    print(f"data: {len(samples.temperatures)} answers, {samples.tokens.shape[0]} tokens in "
          f"{time.perf_counter() - t0:.0f} s")
    if args.data_cache:
        torch.save(vars(samples), args.data_cache)
    return samples


def run(args) -> dict:
    cfg, tensors, tokenizer, _ = load_model(args.model)
    engine = build_engine(EngineConfig(device="cpu", kv_cache_memory=1 << 30, max_num_seqs=48, log_ledger=False),
                          cfg, tensors, tokenizer)
    samples = data(args, engine, tokenizer)
    train, held = samples.split(max(2, min(10, len(samples.temperatures) // 4)))  # every 10th of each temperature held out
    model = engine.model_runner.model
    draft_ids = draft_vocab(train.tokens, args.draft_vocab, sorted(tokenizer.eos_token_ids))
    out = head_rows(model, draft_ids)
    coverage = float(torch.isin(held.tokens, draft_ids).float().mean())
    print(f"draft vocabulary: {len(draft_ids)} tokens, covering {coverage:.1%} of held-out answer tokens")
    t0 = time.perf_counter()
    teach = teacher(train.hidden, out)
    emb, emb_held = (model.embedding(s.tokens).to(torch.float16) for s in (train, held))
    print(f"teacher distributions: {time.perf_counter() - t0:.0f} s")
    results = {"coverage": coverage, "train_tokens": int(train.tokens.shape[0]), "kinds": {}}
    os.makedirs(args.out, exist_ok=True)
    for kind in KINDS if args.kind == "both" else (args.kind,):
        head = make_head(HeadConfig(kind, cfg.hidden_size, args.heads, args.inter, cfg.name, cfg.vocab_size))
        print(f"{kind}: {sum(p.numel() for p in head.parameters()) / 1e6:.2f}M parameters")
        t0 = time.perf_counter()
        fit(head, train, out, teach, emb, args.epochs, args.batch, args.lr, args.heads)
        seconds = time.perf_counter() - t0
        ev = evaluate(head.eval(), held, out, draft_ids, emb_held, args.heads)
        path = os.path.join(args.out, heads_file(kind, cfg.name))
        save_heads(path, head, draft_ids)
        print(f"{kind}: trained in {seconds:.0f} s; held-out greedy acceptance by position "
              f"{', '.join(f'{a:.0%}' for a in ev['acceptance_by_position'])}, mean accepted "
              f"{ev['mean_accepted']:.2f} of {args.heads} ({ev['chains']} chains); {path} "
              f"({os.path.getsize(path) / 2**20:.1f} MiB)")
        results["kinds"][kind] = {**ev, "train_seconds": seconds, "path": path}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    run(_args())
