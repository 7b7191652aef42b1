"""What each optimization buys, measured: one fixed workload (profiling/common/ladder_workload.py) run as a
ladder in one process, each rung adding one optimization to the one before:

  1 static batching, KV reserved for prompt + max_tokens    2 + continuous batching, paged KV
  3 + prefix caching    4 + quantized weights (each --quantization mode this device has)
  5 + speculative decoding (n-gram prompt lookup)

    python profiling/benchmarks/optimization_ladder.py [--model PATH] [--requests 16] [--max-num-seqs 8] [--threads N]
        [--json profiling/out/ladder.json] [--png profiling/out/ladder.png] [--smoke]

Per rung: output tok/s, TTFT and TPOT P50/P99 (every request arrives at t=0, so TTFT includes the
queue), KV reserved vs holding tokens (time-averaged over steps; profiling/common/kv_occupancy.py) and the
speed-up over rung 1. Greedy, ignore_eos: every rung generates exactly the same number of tokens.
--smoke: a tiny random-weight model and a few requests, in seconds (CI); its results go to
profiling/out/smoke/, never to profiling/out/ladder.json, the file the chat page's About panel shows
(and only when it measured the served model: profiling/common/ladder_files.py records which, where, when).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass, fields

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from profiling.common.engine_workload import warm_up  # noqa: E402
from profiling.common.kv_occupancy import OccupancyMeter  # noqa: E402
from profiling.common.ladder_files import output_paths, run_record  # noqa: E402
from profiling.common.ladder_plot import plot_ladder  # noqa: E402
from profiling.common.ladder_workload import LadderRequest, LadderShape, describe, ladder_workload  # noqa: E402
from profiling.common.report_files import write_report  # noqa: E402
from profiling.common.workloads import percentile  # noqa: E402
from runtime.build import build_engine  # noqa: E402
from runtime.device import resolve_device  # noqa: E402
from runtime.engine import LLMEngine  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
from runtime.errors import UserError  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402

NO_QUANT = "n/a (no quantization mode on this device)"


@dataclass
class Rung:
    label: str
    config: dict | None  # EngineConfig fields on top of the common ones; None: not run
    note: str = ""


def quantization_modes() -> list[str]:
    """The --quantization choices EngineConfig declares, if it has that field, but the float one."""
    f = next((f for f in fields(EngineConfig) if f.name == "quantization"), None)
    return [] if f is None else [m for m in f.metadata.get("choices", ()) if m not in (None, "none", "off")]


def ladder(spec: dict) -> list[Rung]:
    """The rungs, each adding one optimization; spec: the speculative decoding settings of rung 5.
    Rungs 1-3 run float weights (a GGUF dequantized), so rung 4 shows what quantized weights buy:
    the GGUF's own blocks (as shipped), then each mode quantizing the float weights at load."""
    modes = quantization_modes()
    floats = {"quantization": "none"} if modes else {}
    static = Rung("1 static batching", {**floats, "scheduler": "static", "enable_prefix_caching": False})
    paged = Rung("2 + continuous, paged KV", {**static.config, "scheduler": "continuous"})
    prefix = Rung("3 + prefix caching", {**paged.config, "enable_prefix_caching": True})
    quant = ([Rung(f"4 + quantized ({m or 'as shipped'})", {**prefix.config, "quantization": m})
              for m in [None, *modes]] if modes else [Rung("4 + quantized weights", None, NO_QUANT)])
    spec_on = Rung("5 + speculative (n-gram)", {**(quant[-1].config or prefix.config), **spec})
    return [static, paged, prefix, *quant, spec_on]


def run_rung(make_engine, workload: list[LadderRequest], config: dict) -> dict:
    engine: LLMEngine = make_engine(config)
    warm_up(engine)  # kernels built and weights touched before the clock starts; its prompts share nothing
    meter = OccupancyMeter(engine.ledger.bytes_per_token)
    t0 = time.perf_counter()
    for i, r in enumerate(workload):
        engine.add_request(str(i), r.prompt_ids, SamplingParams(temperature=0, max_tokens=r.max_tokens,
                                                                ignore_eos=True), arrival_time=t0)
    done = {}
    while engine.has_unfinished_requests():
        s0 = time.perf_counter()
        outs = engine.step()
        meter.sample(engine, time.perf_counter() - s0)
        done.update((o.request_id, o) for o in outs if o.finished)
    wall = time.perf_counter() - t0
    outs = [done[str(i)] for i in range(len(workload))]
    ttft = [o.metrics["ttft"] for o in outs]
    tpot = [o.metrics["tpot"] for o in outs if o.metrics["tpot"] is not None]
    stats = engine.stats
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {"wall_s": wall, "output_tokens": tokens, "output_tok_s": tokens / wall,
              "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
              "tpot_p50": percentile(tpot, 50), "tpot_p99": percentile(tpot, 99), **meter.summary(),
              "steps": stats.steps, "preemptions": stats.preemptions,
              "prefill_tokens_computed": stats.computed_prefill_tokens,
              "prefix_hit_rate": stats.prefix_cache_hit_rate, "spec_acceptance": stats.spec_acceptance_rate,
              "spec_acceptance_by_kind": acceptance_by_kind(workload, outs),
              "tokens": [o.outputs[0].token_ids for o in outs]}
    del engine
    gc.collect()
    return result


def acceptance_by_kind(workload: list[LadderRequest], outs) -> dict[str, float]:
    """Accepted / proposed draft tokens per request kind (copy-heavy vs chat)."""
    sums: dict[str, list[int]] = {}
    for r, o in zip(workload, outs):
        s = sums.setdefault(r.kind, [0, 0])
        s[0] += o.metrics["spec_accepted"]
        s[1] += o.metrics["spec_proposed"]
    return {k: a / p for k, (a, p) in sums.items() if p}


def run_ladder(make_engine, workload: list[LadderRequest], rungs: list[Rung]) -> list[dict]:
    rows = []
    for rung in rungs:
        row = {"rung": rung.label, "config": rung.config, "note": rung.note}
        if rung.config is not None:
            try:
                row.update(run_rung(make_engine, workload, rung.config))
            except UserError as exc:  # e.g. a quantization mode this device cannot run
                row.update(config=None, note=f"n/a ({exc})")
        rows.append(row)
        print(f"  {format_row(row, rows[0])}", flush=True)
    base_tokens = rows[0].get("tokens")
    for row in rows:
        if "output_tok_s" in row:
            row["speedup"] = row["output_tok_s"] / rows[0]["output_tok_s"]
            row["same_tokens_as_rung1"] = row["tokens"] == base_tokens
    for row in rows:
        row.pop("tokens", None)
    return rows


HEADER = (f"{'rung':<28}{'out tok/s':>10}{'speed-up':>9}{'TTFT p50/p99 s':>16}{'TPOT p50/p99 ms':>17}"
          f"{'KV reserved/holding MiB':>25}{'waste':>7}")


def format_row(row: dict, base: dict) -> str:
    if "output_tok_s" not in row:
        return f"{row['rung']:<28}{row['note']}"
    speedup = row["output_tok_s"] / base["output_tok_s"]
    extra = (f"  prefix hits {row['prefix_hit_rate']:.0%}" if row["prefix_hit_rate"] else "") + (
        f"  spec accept {row['spec_acceptance']:.0%}" if row["spec_acceptance"] else "")
    return (f"{row['rung']:<28}{row['output_tok_s']:>10.1f}{speedup:>8.2f}x"
            f"{row['ttft_p50']:>8.2f}/{row['ttft_p99']:<7.2f}{row['tpot_p50'] * 1e3:>8.1f}/{row['tpot_p99'] * 1e3:<8.1f}"
            f"{row['kv_reserved_mib']:>15.1f}/{row['kv_held_mib']:<9.1f}{row['kv_waste']:>7.1%}{extra}")


def engine_factory(args) -> tuple:
    """(make_engine(config overrides) -> LLMEngine, tokenizer, model name, its ModelConfig) for the real or the
    tiny model."""
    if args.smoke and args.model is None:
        from tests.tiny_engine import byte_tokenizer, tiny_weights  # the unit tests' 2-layer random model

        cfg, tensors = tiny_weights()
        tok, name = byte_tokenizer(), "tiny random 2-layer llama"
    else:
        from runtime.load import load_model

        cfg, tensors, tok, path = load_model(args.model)
        name = os.path.basename(path)
    common = dict(kv_cache_memory=args.kv_bytes, max_num_seqs=args.max_num_seqs, log_ledger=False,
                  max_num_batched_tokens=args.max_num_batched_tokens, device=args.device)
    return lambda config: build_engine(EngineConfig(**common, **config), cfg, dict(tensors), tok), tok, name, cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (--smoke: a tiny random model)")
    ap.add_argument("--smoke", action="store_true", help="seconds: a tiny random model and a few requests")
    ap.add_argument("--requests", type=int, default=None, help="default 16 (--smoke: 8)")
    ap.add_argument("--groups", type=int, default=4, help="distinct shared system prompts")
    ap.add_argument("--system-tokens", type=int, default=None, help="default 250 (--smoke: 120)")
    ap.add_argument("--copy-fraction", type=float, default=0.25)
    ap.add_argument("--max-num-seqs", type=int, default=8, help="batch size, the same on every rung")
    ap.add_argument("--max-num-batched-tokens", type=int, default=1024)
    ap.add_argument("--kv-bytes", type=int, default=None, help="KV budget, the same on every rung (default 1 GiB; "
                                                                 "--smoke: 16 MiB)")
    ap.add_argument("--spec-tokens", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=4,
                    help="shortest n-gram to match (default 4: shorter ones draft after common words, and a CPU "
                         "step at batch 8 pays for a draft only above ~45%% acceptance)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's; 1 keeps ratios steady on a shared, busy machine)")
    ap.add_argument("--json", default=None, help="default profiling/out/ladder.json (--smoke: profiling/out/smoke/)")
    ap.add_argument("--png", default=None, help="default profiling/out/ladder.png (--smoke: profiling/out/smoke/)")
    args = ap.parse_args()
    smoke = args.smoke
    try:
        json_path, png_path = output_paths(smoke, args.json, args.png)
    except UserError as exc:
        ap.error(str(exc))
    args.kv_bytes = args.kv_bytes or (16 << 20 if smoke else 1 << 30)
    if args.threads or smoke:  # a tiny model's ops are too small to share: one thread, no spinning on a busy box
        torch.set_num_threads(args.threads or 1)
    shape = LadderShape(requests=args.requests or (8 if smoke else 16), groups=args.groups,
                        system_tokens=args.system_tokens or (120 if smoke else 250), copy_fraction=args.copy_fraction,
                        output_range=(4, 24) if smoke else (16, 256), copy_tokens=24 if smoke else 160,
                        max_notes=3 if smoke else 30)
    make_engine, tok, model_name, model_cfg = engine_factory(args)
    workload = ladder_workload(tok, shape)
    info = describe(workload)
    spec = {"speculative": "ngram", "num_speculative_tokens": args.spec_tokens, "ngram_min": args.ngram_min}
    print(f"{model_name}; {info['requests']} requests ({info['copy_requests']} copy-heavy) in {info['groups']} "
          f"system-prompt groups, prompts {info['prompt_range'][0]}-{info['prompt_range'][1]} tokens "
          f"({info['prompt_tokens']} in all), outputs {info['output_range'][0]}-{info['output_range'][1]} "
          f"({info['output_tokens']} in all); batch {args.max_num_seqs}, torch threads: {torch.get_num_threads()}")
    print(HEADER)
    rows = run_ladder(make_engine, workload, ladder(spec))
    same = [f"{r['rung'][0]} {'yes' if r['same_tokens_as_rung1'] else 'no'}" for r in rows[1:] if "speedup" in r]
    print("greedy outputs identical to rung 1's: " + ", ".join(same))
    report = {"model": model_name, **run_record(model_cfg, resolve_device(args.device), smoke), "workload": info,
              "max_num_seqs": args.max_num_seqs, "threads": torch.get_num_threads(), "rungs": rows}
    write_report(report, json_path, png_path, plot_ladder)


if __name__ == "__main__":
    main()
