"""On paper: the memory ledger and communication volume per step of a TP x PP x DP deployment.

    python profiling/parallel_ledger.py [--gpu-gib 80] [--decode-batch 256] [--prefill-tokens 8192] [--context 8192]

The formulas (docs/parallelism.md shows them with the numbers this prints):
- weights per GPU: ((layers / PP) x layer parameters + vocab x hidden for the embedding on the first stage,
  as much again for the LM head on the last) / TP x bytes per parameter (the busiest stage: the first);
- KV per token per GPU: 2 (K and V) x (layers / PP) x max(1, KV heads / TP) x head_dim x bytes;
- KV budget per GPU: GPU memory x utilization - weights - activation reserve; tokens a replica holds:
  that budget / KV per token per GPU (every GPU of a replica holds its slice of every token);
- TP traffic per GPU per step: 2 all-reduces per layer of [tokens, hidden] (after o_proj and down),
  a ring all-reduce sending 2 (TP - 1) / TP of the message, over the stage's layers;
- PP traffic per stage boundary per step: [tokens, hidden] x 2 (hidden states and residual);
- DP traffic per step: none (replicas share nothing; a router spreads requests).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from runtime.kv.cache import plan_kv_cache  # noqa: E402
from runtime.parallel.plan import Layout, local_config, rank_shard  # noqa: E402
from weights.config import ModelConfig  # noqa: E402

GIB = 2**30


def llama(name: str, layers: int, hidden: int, heads: int, intermediate: int) -> ModelConfig:
    """A Llama 3.1 shape: 8 KV heads of 128, a 128,256-token vocabulary, untied head."""
    return ModelConfig("llama", 128256, hidden, intermediate, layers, heads, 8, 128, name=name)


LLAMA_8B = llama("Llama 3.1 8B", 32, 4096, 32, 14336)
LLAMA_70B = llama("Llama 3.1 70B", 80, 8192, 64, 28672)


def layer_params(m: ModelConfig) -> int:
    return (m.num_parameters() - 2 * m.vocab_size * m.hidden_size - m.hidden_size) // m.num_layers


def kv_bytes_per_token(m: ModelConfig, layout: Layout, dtype: torch.dtype) -> int:
    """The engine's own ledger line for rank 0 (the first stage, which takes the extra layer)."""
    local = local_config(m, rank_shard(m, 0, layout.tp), layout.layers(m, 0))
    return plan_kv_cache(local, 0, 16, dtype).bytes_per_token


@dataclass(frozen=True)
class Plan:
    model: ModelConfig
    tp: int
    pp: int
    dp: int
    nodes: int
    why: str


def ledger(plan: Plan, args) -> dict:
    m, tp, pp, b = plan.model, plan.tp, plan.pp, args.bytes
    layout = Layout(tp, pp)
    layout.check(m)
    first, last = layout.layers(m, 0)
    layers = last - first  # the first stages take the extra layer
    ends = 2 if pp == 1 else 1  # the embedding and the head; under PP the first stage has the embedding only
    weights = (layers * layer_params(m) + ends * m.vocab_size * m.hidden_size) / tp * b
    kv_token = kv_bytes_per_token(m, layout, {2: torch.bfloat16, 4: torch.float32, 1: torch.float8_e4m3fn}[b])
    budget = args.gpu_gib * GIB * args.utilization - weights - args.activation_gib * GIB
    tokens = max(0, budget) / kv_token
    ring = 2 * (tp - 1) / tp
    tp_step = lambda n: layers * 2 * ring * n * m.hidden_size * b  # noqa: E731  bytes one GPU sends per step
    pp_step = lambda n: 2 * n * m.hidden_size * b  # noqa: E731  bytes per stage boundary per step
    return {"weights_gib": weights / GIB, "kv_kib_per_token": kv_token / 1024, "kv_budget_gib": budget / GIB,
            "tokens": tokens, "seqs_at_context": tokens / args.context,
            "tp_decode_mib": tp_step(args.decode_batch) / 2**20, "tp_prefill_mib": tp_step(args.prefill_tokens) / 2**20,
            "pp_decode_mib": pp_step(args.decode_batch) / 2**20, "pp_prefill_mib": pp_step(args.prefill_tokens) / 2**20}


PLANS = [
    Plan(LLAMA_8B, 1, 1, 8, 1, "15 GiB of weights fit one GPU: 8 replicas behind a router, no traffic between GPUs"),
    Plan(LLAMA_8B, 2, 1, 4, 1, "half the weights per GPU: more KV per replica for long contexts, NVLink traffic"),
    Plan(LLAMA_8B, 1, 1, 16, 2, "two nodes: 16 replicas, nothing crosses the nodes"),
    Plan(LLAMA_70B, 8, 1, 1, 1, "131 GiB of weights: one replica over the node's NVLink"),
    Plan(LLAMA_70B, 4, 1, 2, 1, "two replicas of TP 4: twice the replicas, each with less KV"),
    Plan(LLAMA_70B, 8, 2, 1, 2, "one replica over 16 GPUs: TP inside each node, PP across them (one boundary)"),
    Plan(LLAMA_70B, 8, 1, 2, 2, "two nodes as two TP 8 replicas: no traffic between the nodes"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="memory per GPU (H100: 80)")
    ap.add_argument("--utilization", type=float, default=0.9, help="the share of it the engine takes")
    ap.add_argument("--activation-gib", type=float, default=2.0, help="activation reserve per GPU")
    ap.add_argument("--bytes", type=int, default=2, choices=(1, 2, 4),
                    help="bytes per weight and KV element (BF16: 2, FP8: 1)")
    ap.add_argument("--decode-batch", type=int, default=256, help="sequences in a decode step")
    ap.add_argument("--prefill-tokens", type=int, default=8192, help="tokens in a prefill step")
    ap.add_argument("--context", type=int, default=8192, help="tokens per sequence, for sequences that fit")
    args = ap.parse_args()
    for m in (LLAMA_8B, LLAMA_70B):
        n = m.num_parameters()
        print(f"{m.name}: {n / 1e9:.2f}B parameters, {n * args.bytes / GIB:.1f} GiB at {args.bytes} B; KV "
              f"{2 * m.num_layers * m.num_kv_heads * m.head_dim * args.bytes / 1024:.0f} KiB/token")
    print(f"{'model':<14}{'TPxPPxDP':>9}{'nodes':>6}{'weights':>9}{'KV/tok':>8}{'KV budget':>10}{'tokens':>10}"
          f"{'seqs':>6}{'TP dec':>8}{'TP pre':>8}{'PP dec':>8}{'PP pre':>8}")
    print(f"{'':<14}{'':>9}{'':>6}{'GiB/GPU':>9}{'KiB':>8}{'GiB/GPU':>10}{'/replica':>10}{'@ctx':>6}"
          f"{'MiB/GPU':>8}{'MiB/GPU':>8}{'MiB':>8}{'MiB':>8}")
    for plan in PLANS:
        r = ledger(plan, args)
        pp = plan.pp > 1
        print(f"{plan.model.name.split()[-1]:<14}{f'{plan.tp}x{plan.pp}x{plan.dp}':>9}{plan.nodes:>6}"
              f"{r['weights_gib']:>9.1f}{r['kv_kib_per_token']:>8.1f}{r['kv_budget_gib']:>10.1f}{r['tokens']:>10,.0f}"
              f"{r['seqs_at_context']:>6.0f}{r['tp_decode_mib']:>8.1f}{r['tp_prefill_mib']:>8.0f}"
              f"{r['pp_decode_mib'] if pp else 0:>8.1f}{r['pp_prefill_mib'] if pp else 0:>8.0f}  {plan.why}")


if __name__ == "__main__":
    main()
