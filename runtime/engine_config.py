"""Engine settings, their command-line flags (shared by every entry point), and memory sizing."""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass

from runtime.errors import UserError

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'2GiB', '512MiB', '1.5G', '1000000' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise UserError(f"invalid memory size {text!r} (examples: 2GiB, 512MiB, 1e9 bytes as 1000000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass
class EngineConfig:
    model: str | None = None  # .gguf file, HF folder, or None for the default model
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # auto: float32 on cpu, bfloat16 on cuda
    backend: str = "auto"  # torch | cute | auto
    block_size: int = 16
    kv_cache_memory: int | None = None  # bytes; None: sized from free memory
    kv_cache_fraction: float = 0.1  # of available host memory on cpu (gpu: 0.85 of free device memory)
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 64
    max_model_len: int | None = None
    scheduler: str = "continuous"
    enable_prefix_caching: bool = True
    speculative: str | None = None  # ngram | draft
    num_speculative_tokens: int = 4
    draft_model: str | None = None
    ngram_min: int = 1
    ngram_max: int = 4
    seed: int = 0  # of sampled requests that set none
    log_ledger: bool = True

    def __post_init__(self) -> None:
        positive = {"block_size": self.block_size, "max_num_batched_tokens": self.max_num_batched_tokens,
                    "max_num_seqs": self.max_num_seqs,
                    "max_model_len": 1 if self.max_model_len is None else self.max_model_len}
        bad = next((k for k, v in positive.items() if not isinstance(v, int) or v < 1), None)
        if bad:
            raise UserError(f"{bad} must be a positive integer, got {positive[bad]!r}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 0:
            raise UserError(f"kv_cache_memory must be >= 0 bytes, got {self.kv_cache_memory}")
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise UserError(f"kv_cache_fraction must be in (0, 1], got {self.kv_cache_fraction}")
        if self.scheduler not in ("continuous", "static"):
            raise UserError(f"unknown scheduler {self.scheduler!r} (continuous or static)")
        if self.scheduler == "static" and self.speculative:
            raise UserError("speculative decoding needs the continuous scheduler (static batches verify no drafts)")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct)")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="compute dtype (auto: float32 on cpu, bfloat16 on gpu)")
    g.add_argument("--backend", default="auto", choices=["auto", "torch", "cute"],
                   help="kernel backend (auto: CuTe kernels on an sm_90 GPU, torch reference otherwise; on the CPU the "
                        "torch backend runs fp32 attention (prefill and paged decode) and the fused norm/rope/silu ops "
                        "in C kernels unless CUTE_SERVE_CPU_KERNELS=0)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: 16)")
    g.add_argument("--kv-cache-memory", type=parse_bytes, default=None,
                   help="KV cache budget, e.g. 2GiB (default: sized from free memory)")
    g.add_argument("--max-num-batched-tokens", type=int, default=1024, help="token budget of one step")
    g.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one step")
    g.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the model's)")
    g.add_argument("--scheduler", choices=["continuous", "static"], default="continuous",
                   help="continuous (iteration-level) batching, or static batches for comparison")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="share KV blocks of common prompt prefixes across requests (default: on)")
    g.add_argument("--speculative", choices=["ngram", "draft"], default=None, help="speculative decoding proposer")
    g.add_argument("--num-speculative-tokens", type=int, default=4, help="draft tokens per step (default: 4)")
    g.add_argument("--draft-model", default=None, help="draft model path for --speculative draft")
    g.add_argument("--ngram-min", type=int, default=1, help="smallest n-gram to match (default: 1)")
    g.add_argument("--ngram-max", type=int, default=4, help="largest n-gram to match (default: 4)")
    g.add_argument("--engine-seed", dest="engine_seed", type=int, default=0,
                   help="seed for requests that do not set one")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, backend=args.backend, block_size=args.block_size,
        kv_cache_memory=args.kv_cache_memory, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, scheduler=args.scheduler,
        enable_prefix_caching=args.enable_prefix_caching, speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens, draft_model=args.draft_model,
        ngram_min=args.ngram_min, ngram_max=args.ngram_max, seed=args.engine_seed,
    )


def available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
