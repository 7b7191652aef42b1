"""Tensor and pipeline parallelism: where a step's time goes with the model split over TP x PP ranks.

    python profiling/benchmarks/bench_tp.py [--model PATH | --even-135m] [--layouts 1x1,2x1,1x2] [--device cpu|cuda]
        [--prompts 4] [--prompt-tokens 192] [--max-tokens 32] [--threads N] [--json out.json] [--smoke]

Rank 0's forward time per step, prefill steps and decode steps apart, split into communication (the
all-reduces after o_proj and down and of the embedding, the all-gather of the sampled logits, the
broadcast of the step's chunks, and under PP the activations rank 0 sends on; time spent waiting
for a slower TP rank counts as communication), bubble (under PP: rank 0 idle after its stage's
micro-batches, waiting for the last stage's logits: the later stages' compute and their transfers)
and compute (the rest). A step's batch runs as up to PP micro-batches, so a decode step of 4
sequences fills 2 stages, a one-sequence step cannot. On the CPU the ranks share the machine's
cores (each gets cores / ranks threads), so TP and PP there show the cost of the split, not a
speed-up; on GPUs each rank has its own device. Layouts that do not fit the model (heads not
divisible, fewer layers than stages) or the GPUs present are reported as skipped.
--smoke: a tiny random model (4 KV heads), in seconds (CI).
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
from runtime.errors import UserError  # noqa: E402
from runtime.parallel.layers import COMM  # noqa: E402
from runtime.parallel.plan import Layout, threads_per_rank  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402

# SmolLM2-135M's sizes with 8 query / 4 KV heads of 72 (its 9 / 3 split only by 3): random weights
EVEN_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=72)


def load(args) -> tuple:
    if args.even_135m or (args.smoke and args.model is None):
        from tests.tiny_engine import byte_tokenizer, tiny_weights  # the unit tests' random models

        if args.even_135m:
            from runtime.load import load_model
            from tests.hf_tiny import our_config, state_dict, tiny_hf_model

            real, _, tok, _ = load_model(None)  # its tokenizer, for prompts and outputs
            hf = tiny_hf_model("llama", vocab_size=real.vocab_size, max_position_embeddings=2048, **EVEN_135M)
            return our_config(hf), state_dict(hf), tok, "random llama of SmolLM2-135M's sizes, 8 heads / 4 KV heads"
        cfg, tensors = tiny_weights(num_key_value_heads=4)
        return cfg, tensors, byte_tokenizer(), "tiny random 2-layer llama (4 KV heads)"
    from runtime.load import load_model

    cfg, tensors, tok, path = load_model(args.model)
    return cfg, tensors, tok, os.path.basename(path)


def prompts_for(tok, n: int, tokens: int) -> list[list[int]]:
    text = " ".join(f"Item {i}: a short note on topic {i % 7} and why it matters." for i in range(tokens))
    ids = tok.encode(text)
    return [ids[i * 7: i * 7 + tokens] for i in range(n)]


def skip_reason(cfg, layout: Layout, device: str) -> str | None:
    try:
        layout.check(cfg)
    except UserError as exc:
        return str(exc)
    if device.startswith("cuda") and torch.cuda.device_count() < layout.world_size:
        return f"needs {layout.world_size} GPUs, {torch.cuda.device_count()} visible"
    return None


def parse_layouts(text: str) -> list[Layout]:
    """'1x1,2x1,1x2' -> TP x PP layouts; a bare N is TP N."""
    out = []
    for item in text.split(","):
        tp, _, pp = item.strip().partition("x")
        out.append(Layout(int(tp), int(pp or 1)))
    return out


def measure(cfg, tensors, tok, layout: Layout, args, prompts: list[list[int]]) -> dict:
    config = EngineConfig(device=args.device, kv_cache_memory=args.kv_bytes, log_ledger=False,
                          tensor_parallel_size=layout.tp, pipeline_parallel_size=layout.pp)
    COMM.sync = args.device.startswith("cuda")
    with build_engine(config, cfg, dict(tensors), tok) as engine:
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
        engine.add_request("warm-up", [1, 2, 3], SamplingParams(temperature=0, max_tokens=2))
        while engine.has_unfinished_requests():
            engine.step()
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        phases = {"prefill": [0, 0.0, 0.0, 0.0], "decode": [0, 0.0, 0.0, 0.0]}  # steps, forward, comm, bubble s
        tokens: dict[str, list[int]] = {}
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            prefill, forward = engine.stats.computed_prefill_tokens, engine.stats.times.forward
            COMM.reset()
            for out in engine.step():
                if out.finished:
                    tokens[out.request_id] = out.outputs[0].token_ids
            phase = phases["prefill" if engine.stats.computed_prefill_tokens > prefill else "decode"]
            phase[0] += 1
            phase[1] += engine.stats.times.forward - forward
            phase[2] += COMM.seconds + COMM.broadcast_seconds + COMM.p2p_seconds
            phase[3] += COMM.bubble_seconds
        wall = time.perf_counter() - t0
    n = layout.world_size
    row = {"tp": layout.tp, "pp": layout.pp, "wall_s": wall, "output_tok_s": len(prompts) * args.max_tokens / wall,
           "threads_per_rank": threads_per_rank(n) if n > 1 else torch.get_num_threads(),
           "tokens": [tokens[f"r{i}"] for i in range(len(prompts))]}
    for name, (steps, fwd, comm, bubble) in phases.items():
        per = 1e3 / max(steps, 1)
        row[name] = {"steps": steps, "forward_ms": fwd * per, "comm_ms": comm * per, "bubble_ms": bubble * per,
                     "compute_ms": (fwd - comm - bubble) * per}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (--smoke: a tiny random model)")
    ap.add_argument("--layouts", "--sizes", default=None, help="TP x PP layouts, comma-separated (default: 1x1,2x1,1x2; "
                                                               "the default model's 9 heads split by 3, so 1x1,3x1,1x2 "
                                                               "there); a bare N is N x 1")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv-bytes", type=int, default=256 << 20, help="per rank")
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads of TP=1 (default: all cores; TP=N "
                                                                "ranks get cores / N each)")
    ap.add_argument("--even-135m", action="store_true", help="a random model of SmolLM2-135M's sizes whose heads "
                                                                 "split by 2 (8 query, 4 KV)")
    ap.add_argument("--smoke", action="store_true", help="seconds: a tiny random model, short prompts")
    args = ap.parse_args()
    if args.smoke:
        args.prompt_tokens, args.max_tokens, args.kv_bytes = min(args.prompt_tokens, 48), min(args.max_tokens, 8), 16 << 20
        torch.set_num_threads(1)  # a tiny model's ops are too small to share: TP=1 gets one thread too
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, tensors, tok, name = load(args)
    layouts = parse_layouts(args.layouts or ("1x1,2x1,1x2" if cfg.num_heads % 2 == 0 else "1x1,3x1,1x2"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    multi_gpu = args.device.startswith("cuda") and gpus > 1
    print(f"{name}; {args.prompts} prompts x {args.prompt_tokens} tokens, {args.max_tokens} output tokens each; "
          f"device {args.device}; GPUs visible: {gpus}; multi-GPU run: {'yes' if multi_gpu else 'no'}")
    prompts = prompts_for(tok, args.prompts, args.prompt_tokens)
    rows = []
    print(f"{'TPxPP':>5}{'threads':>8}  {'phase':<8}{'steps':>6}{'step ms':>9}{'compute':>9}{'comm':>8}{'bubble':>8}"
          f"{'comm %':>8}{'bubble %':>9}{'tok/s':>8}")
    for layout in layouts:
        name = f"{layout.tp}x{layout.pp}"
        why = skip_reason(cfg, layout, args.device)
        if why:
            print(f"{name:>5}  skipped: {why}")
            continue
        r = measure(cfg, tensors, tok, layout, args, prompts)
        rows.append(r)
        for phase in ("prefill", "decode"):
            p = r[phase]
            fwd = p["forward_ms"] or 1.0
            print(f"{name:>5}{r['threads_per_rank']:>8}  {phase:<8}{p['steps']:>6}{p['forward_ms']:>9.1f}"
                  f"{p['compute_ms']:>9.1f}{p['comm_ms']:>8.1f}{p['bubble_ms']:>8.1f}{p['comm_ms'] / fwd:>8.0%}"
                  f"{p['bubble_ms'] / fwd:>9.0%}" + (f"{r['output_tok_s']:>8.1f}" if phase == "decode" else ""))
    if len(rows) > 1:
        base = rows[0]
        for r in rows[1:]:
            print(f"{r['tp']}x{r['pp']} vs {base['tp']}x{base['pp']}: decode step "
                  f"{r['decode']['forward_ms'] / base['decode']['forward_ms']:.2f}x, "
                  f"prefill step {r['prefill']['forward_ms'] / base['prefill']['forward_ms']:.2f}x; "
                  f"identical greedy tokens: {'yes' if r['tokens'] == base['tokens'] else 'no'}")
    if args.json:
        report = {"model": name, "device": args.device, "gpus": gpus, "multi_gpu": multi_gpu,
                  "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
                  "skipped": [f"{x.tp}x{x.pp}" for x in layouts if (x.tp, x.pp) not in {(r["tp"], r["pp"]) for r in rows}]}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
