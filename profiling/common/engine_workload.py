"""A short fixed engine workload for profilers (nsys, ncu, torch.profiler): a few requests of mixed
prompt lengths decoding together, so prefill, decode, sampling and output all show, after a warm-up
that keeps compilation and first-touch out of the profile.

    python profiling/common/engine_workload.py [--model PATH] [--requests 8] [--max-tokens 32] [--smoke]
        [--cuda-profiler-range]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from profiling.common.workloads import offline_workload  # noqa: E402
from runtime.build import build_engine  # noqa: E402
from runtime.engine import LLMEngine  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402


def workload_engine(model: str | None, smoke: bool, kv_bytes: int = 256 << 20) -> LLMEngine:
    """The default (or given) model on the best device here; --smoke: the unit tests' tiny random model."""
    if smoke and model is None:
        from tests.tiny_engine import tiny_engine

        return tiny_engine(num_blocks=512)
    from runtime.load import load_model

    cfg, tensors, tok, _ = load_model(model)
    return build_engine(EngineConfig(kv_cache_memory=kv_bytes, log_ledger=False), cfg, tensors, tok)


def add_requests(engine: LLMEngine, requests: int, max_tokens: int) -> None:
    vocab = (3, min(engine.model_config.vocab_size, 49000))
    for i, r in enumerate(offline_workload(requests, prompt_range=(16, 256), output_range=(max_tokens, max_tokens),
                                           seed=1, vocab_range=vocab)):
        engine.add_request(f"w{i}", r.prompt_ids, SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True))


def run(engine: LLMEngine, cuda_profiler_range: bool = False) -> int:
    """Step until every request is done; returns the steps taken. cuda_profiler_range: bracket the steps
    with cudaProfilerStart/Stop, where nsys (--capture-range=cudaProfilerApi) and ncu
    (--profile-from-start off) begin and end, so the warm-up stays out of their reports."""
    import torch

    ranged = cuda_profiler_range and torch.cuda.is_available()
    if ranged:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    if ranged:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    return steps


def warm_up(engine: LLMEngine) -> None:
    add_requests(engine, 2, 4)
    run(engine)
    engine.reset_stats()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--cuda-profiler-range", action="store_true", help="for nsys/ncu: profile the measured steps only")
    args = ap.parse_args()
    engine = workload_engine(args.model, args.smoke)
    warm_up(engine)
    add_requests(engine, args.requests, args.max_tokens)
    t0 = time.perf_counter()
    steps = run(engine, args.cuda_profiler_range)
    wall = time.perf_counter() - t0
    print(f"{args.requests} requests x {args.max_tokens} tokens on {engine.device}: {steps} steps in {wall:.2f} s "
          f"({engine.stats.generated_tokens / wall:.1f} tok/s)")


if __name__ == "__main__":
    main()
