"""Is a step compute- or bandwidth-bound? Arithmetic intensity (FLOP per byte moved) and bound of
prefill and decode steps for a model, batch and context on a chip: H100 / H200 from their published
peaks, or this CPU with its FLOP rate and bandwidth measured here in a second or two. Draws a roofline
PNG with the steps on it, and measured runs from the benchmarks' JSON (optimization_ladder.py,
bench_offline.py) as the useful FLOP/s they reached.

    python profiling/benchmarks/roofline.py [--model PATH|smollm2-135m|llama3-8b|llama3-70b] [--chips cpu,h100,h200]
        [--prompt 512] [--batches 1,8,64,256] [--context 512] [--measured profiling/out/ladder.json ...]
        [--png profiling/out/roofline.png] [--json profiling/out/roofline.json] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from profiling.common.report_files import OUT, write_report  # noqa: E402
from profiling.common.roofline_model import (  # noqa: E402
    PUBLISHED,
    Chip,
    StepCost,
    decode,
    kv_bytes_per_token,
    measure_cpu,
    prefill,
    run_cost,
)
from profiling.common.roofline_plot import plot_roofline  # noqa: E402
from weights.config import ModelConfig  # noqa: E402

PRESETS = {  # architecture only: no file needed
    "smollm2-135m": ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, 8192, tie_word_embeddings=True,
                                name="SmolLM2-135M"),
    "llama3-8b": ModelConfig("llama", 128256, 4096, 14336, 32, 32, 8, 128, 8192, name="Llama-3-8B"),
    "llama3-70b": ModelConfig("llama", 128256, 8192, 28672, 80, 64, 8, 128, 8192, name="Llama-3-70B"),
}


def model_config(model: str | None) -> ModelConfig:
    """A preset, or the architecture read from a .gguf file's metadata / an HF folder's config.json."""
    if model in PRESETS:
        return PRESETS[model]
    from weights.default import resolve_model_path

    path = resolve_model_path(model)
    if os.path.isdir(path):
        from weights.jsonfile import read_json_object
        from weights.load_hf import config_from_hf

        return config_from_hf(read_json_object(os.path.join(path, "config.json")), path)
    from weights.gguf_metadata import open_gguf, read_metadata
    from weights.load_gguf import config_from_metadata

    reader = open_gguf(path)
    cfg = config_from_metadata(read_metadata(reader), {t.name for t in reader.tensors}, path)
    cfg.name = os.path.basename(path)
    return cfg


def measured_points(paths: list[str], cfg: ModelConfig, chip: Chip, context: int) -> list[dict]:
    """(intensity, useful FLOP/s) of each run in the benchmarks' JSON under the same cost model; the
    ladder's JSON gives its workload's mean prompt and context, other files fall back to --context."""
    points = []
    for path in paths:
        data = json.load(open(path))
        runs, w = (data["rungs"], data["workload"]) if isinstance(data, dict) else (data, None)
        prompt = w["prompt_tokens"] / w["requests"] if w else context
        ctx = prompt + w["output_tokens"] / w["requests"] / 2 if w else context
        for r in runs:
            out = r.get("output_tokens", r.get("useful_tokens"))
            pre = r.get("prefill_tokens_computed", r.get("computed_prefill_tokens"))
            if out is None or pre is None or not r.get("steps"):
                continue  # a rung that did not run, or a peer engine without step counts
            cost = run_cost(cfg, chip.dtype_bytes, r.get("rung", r.get("engine")), r["steps"], pre, out, prompt, ctx)
            points.append({"label": cost.label, "source": os.path.basename(path), "intensity": cost.intensity,
                           "flops_per_s": cost.flops / r["wall_s"]})
    return points


def recorded_threads(paths: list[str]) -> int | None:
    """The torch thread count the first measured run that records one used (the ladder's JSON does)."""
    for path in paths:
        data = json.load(open(path))
        if isinstance(data, dict) and data.get("threads"):
            return data["threads"]
    return None


def table(cfg: ModelConfig, chip: Chip, steps: list[StepCost]) -> list[dict]:
    print(f"{chip.name}: {chip.peak_flops / 1e12:.3g} TFLOP/s, {chip.bandwidth / 1e9:.3g} GB/s, ridge "
          f"{chip.ridge:.1f} FLOP/byte ({chip.source})")
    print(f"  {'step':<24}{'GFLOP':>10}{'MB moved':>11}{'FLOP/byte':>11}{'bound':>11}{'time >=':>11}{'tok/s <=':>12}")
    rows = []
    for s in steps:
        t = s.time_bound(chip)
        print(f"  {s.label:<24}{s.flops / 1e9:>10.2f}{s.bytes / 1e6:>11.1f}{s.intensity:>11.1f}{s.bound(chip):>11}"
              f"{t * 1e3:>9.2f}ms{s.tokens / t:>12.0f}")
        rows.append({**asdict(s), "intensity": s.intensity, "bound": s.bound(chip), "time_s": t, "chip": chip.name})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help=f"a model path or a preset: {', '.join(PRESETS)} (default: "
                                                  "the default model)")
    ap.add_argument("--chips", default="cpu,h100,h200")
    ap.add_argument("--prompt", type=int, default=512, help="prefill: prompt tokens per sequence")
    ap.add_argument("--prefill-batch", type=int, default=1)
    ap.add_argument("--batches", default="1,8,64,256", help="decode batch sizes")
    ap.add_argument("--context", type=int, default=512, help="decode: KV tokens per sequence")
    ap.add_argument("--measured", nargs="*", default=None,
                    help="benchmark JSON files to plot as measured points on the CPU roof (default: "
                         "profiling/out/ladder.json if it exists)")
    ap.add_argument("--measure-seconds", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for the CPU roof (default: those the measured JSON ran with, else torch's)")
    ap.add_argument("--png", default=os.path.join(OUT, "roofline.png"))
    ap.add_argument("--json", default=os.path.join(OUT, "roofline.json"))
    ap.add_argument("--smoke", action="store_true", help="the SmolLM2-135M preset, a short CPU measurement (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.measure_seconds = args.model or "smollm2-135m", 0.3
    cfg = model_config(args.model)
    default_measured = os.path.join(OUT, "ladder.json")
    paths = args.measured if args.measured is not None else [p for p in [default_measured] if os.path.exists(p)]
    threads = args.threads or recorded_threads(paths)
    if threads:  # the CPU roof at the thread count the measured runs used
        torch.set_num_threads(threads)
    chips = [measure_cpu(args.measure_seconds) if c == "cpu" else PUBLISHED[c] for c in args.chips.split(",")]
    print(f"{cfg.name}: {cfg.num_parameters() / 1e6:.0f}M parameters, KV {kv_bytes_per_token(cfg, 1)} bytes/token "
          f"per byte of dtype; prefill {args.prefill_batch}x{args.prompt}, decode at context {args.context}")
    report = {"model": cfg.name, "chips": [], "steps": [], "measured": []}
    for chip in chips:
        steps = [prefill(cfg, chip.dtype_bytes, args.prefill_batch, args.prompt)] + [
            decode(cfg, chip.dtype_bytes, int(b), args.context) for b in args.batches.split(",")]
        report["chips"].append({**asdict(chip), "ridge": chip.ridge})
        report["steps"] += table(cfg, chip, steps)
    cpu = next((c for c in chips if c.dtype_bytes == 4), None)
    if paths and cpu:
        report["measured"] = measured_points(paths, cfg, cpu, args.context)
        for p in report["measured"]:
            print(f"  measured {p['label']}: {p['intensity']:.1f} FLOP/byte, {p['flops_per_s'] / 1e9:.1f} useful GFLOP/s "
                  f"({p['flops_per_s'] / cpu.peak_flops:.0%} of the CPU's peak)")
    write_report(report, args.json, args.png, plot_roofline)


if __name__ == "__main__":
    main()
