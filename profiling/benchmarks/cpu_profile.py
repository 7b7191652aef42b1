"""Where a CPU engine step's time goes, per torch op: the engine workload of profiling/common/engine_workload.py
under torch.profiler. Writes a Chrome trace (open in chrome://tracing or https://ui.perfetto.dev), a
JSON per-op table, and prints the top ops by self CPU time beside the engine's own phase shares.

    python profiling/benchmarks/cpu_profile.py [--model PATH] [--requests 8] [--max-tokens 32] [--rows 15]
        [--threads N] [--trace profiling/out/cpu_trace.json] [--json profiling/out/cpu_ops.json] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import runtime.nvtx as nvtx  # noqa: E402
from profiling.common.engine_workload import add_requests, run, warm_up, workload_engine  # noqa: E402
from profiling.common.report_files import OUT, make_parents  # noqa: E402


def label_phases() -> None:
    """Route the engine's NVTX hooks to torch.profiler ranges: the trace and the table then show schedule,
    prepare, attention, mlp, sample and output, and time spent in the C kernels (invisible to the profiler
    as ops) lands in the self time of the range that called them."""
    stack = []

    def push(name: str) -> None:
        stack.append(torch.profiler.record_function(name))
        stack[-1].__enter__()

    def pop() -> None:
        stack.pop().__exit__(None, None, None)

    nvtx.ON, nvtx.push, nvtx.pop = True, push, pop


def op_table(prof, rows: int) -> list[dict]:
    """The top ops by self CPU time: calls, self and total milliseconds, share of all self time."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3,
             "total_ms": e.cpu_time_total / 1e3, "self_share": e.self_cpu_time_total / total} for e in events[:rows]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rows", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; --smoke: 1)")
    ap.add_argument("--trace", default=os.path.join(OUT, "cpu_trace.json"))
    ap.add_argument("--json", default=os.path.join(OUT, "cpu_ops.json"))
    ap.add_argument("--smoke", action="store_true", help="the tiny random model, 4 requests x 8 tokens (CI)")
    args = ap.parse_args()
    if args.threads or args.smoke:  # the tiny model's ops are too small to share between threads
        torch.set_num_threads(args.threads or 1)
    if args.smoke:
        args.requests, args.max_tokens = min(args.requests, 4), min(args.max_tokens, 8)
    engine = workload_engine(args.model, args.smoke)
    warm_up(engine)
    add_requests(engine, args.requests, args.max_tokens)
    label_phases()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        steps = run(engine)
    rows = op_table(prof, args.rows)
    make_parents(args.trace, args.json)
    prof.export_chrome_trace(args.trace)
    shares = engine.stats.times.shares()
    with open(args.json, "w") as f:
        json.dump({"requests": args.requests, "max_tokens": args.max_tokens, "steps": steps,
                   "threads": torch.get_num_threads(), "phase_shares": shares, "ops": rows}, f, indent=2)
    print(f"{args.requests} requests x {args.max_tokens} tokens, {steps} steps, torch threads: {torch.get_num_threads()}; "
          f"engine phases: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    print(f"{'op':<44}{'calls':>7}{'self ms':>10}{'total ms':>10}{'self %':>8}")
    for r in rows:
        print(f"{r['op'][:43]:<44}{r['calls']:>7}{r['self_ms']:>10.1f}{r['total_ms']:>10.1f}{r['self_share']:>8.1%}")
    print(f"wrote {args.trace} (chrome://tracing, ui.perfetto.dev) and {args.json}")


if __name__ == "__main__":
    main()
