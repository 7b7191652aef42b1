"""Decode speed on a GPU: `python profiling/benchmarks/bench_generate.py --device cuda [--dry-run] [--json PATH]`.

A random-weight Llama of Llama 3 8B's shape in bf16 (built on the GPU, no download), through the
engine: TPOT at batch 1 against its floor (weight bytes / the device copy bandwidth measured here:
each decode step reads every weight once), and throughput at batch 64; for the cute backend and, as
the peer in the same run, the torch reference backend. Targets: TPOT at batch 1 within 1.3x the floor.
"""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass

PROMPT_TOKENS = 128
NEW_TOKENS = 64
MAX_MODEL_LEN = 1024


@dataclass(frozen=True)
class GenerateCase:
    backend: str
    batch: int

    @property
    def name(self) -> str:
        return f"llama3-8b-shape bf16 {self.backend} batch {self.batch}"


CASES = [GenerateCase(backend, batch) for backend in ("cute", "torch") for batch in (1, 64)]


def _engine(backend: str):
    import torch

    from profiling.common.random_llama import llama3_8b_config, numbered_tokenizer, random_tensors
    from runtime.build import build_engine
    from runtime.engine_config import EngineConfig

    cfg = llama3_8b_config(MAX_MODEL_LEN)
    config = EngineConfig(device="cuda", dtype="bfloat16", backend=backend, kv_cache_memory=8 << 30,
                          max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=MAX_MODEL_LEN,
                          enable_prefix_caching=False, log_ledger=False)
    return build_engine(config, cfg, random_tensors(cfg, "cuda", torch.bfloat16), numbered_tokenizer(cfg.vocab_size))


def _generate(engine, batch: int) -> dict:
    """Greedy batch of random prompts: decode TPOT (median over requests) and output tok/s (wall)."""
    import torch

    from runtime.sampling_params import SamplingParams

    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i in range(batch):
        ids = torch.randint(0, engine.model_config.vocab_size, (PROMPT_TOKENS,), generator=g).tolist()
        engine.add_request(f"b{batch}-{i}-{time.perf_counter_ns()}", ids, params)
    start, tpots = time.perf_counter(), []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                m = out.metrics
                tpots.append((m["e2e"] - m["ttft"]) / (NEW_TOKENS - 1))
    wall = time.perf_counter() - start
    return {"tpot_ms": round(1e3 * statistics.median(tpots), 3), "out_tok_s": round(batch * NEW_TOKENS / wall, 1)}


def run(dry_run: bool) -> list[dict]:
    if dry_run:
        return [{"case": c.name, "prompt": PROMPT_TOKENS, "new_tokens": NEW_TOKENS, "dry_run": True} for c in CASES]
    import torch

    from profiling.gpu.bench_kernels import time_ms
    from profiling.gpu.decode_bench import copy_bandwidth

    bandwidth = copy_bandwidth(time_ms)
    torch.cuda.empty_cache()  # the copy's 4 GiB go back before the model's weights arrive
    rows = []
    for backend in dict.fromkeys(c.backend for c in CASES):
        engine = _engine(backend)
        floor_ms = engine.model_runner.model.weight_bytes() / (bandwidth * 1e9) * 1e3
        _generate(engine, 1)  # warm-up: first launches, allocator
        for case in (c for c in CASES if c.backend == backend):
            row = {"case": case.name, "copy_gb_s": round(bandwidth), **_generate(engine, case.batch)}
            if case.batch == 1:
                row |= {"floor_ms": round(floor_ms, 3), "tpot_vs_floor": round(row["tpot_ms"] / floor_ms, 2)}
            rows.append(row)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    by_case = {r["case"]: r for r in rows}
    for batch in (1, 64):
        cute, ref = (by_case[GenerateCase(b, batch).name] for b in ("cute", "torch"))
        cute["vs_torch_backend"] = round(ref["tpot_ms"] / cute["tpot_ms"], 2)
    return rows
