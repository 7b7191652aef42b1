"""Engine settings, their command-line flags (shared by every entry point), and memory sizing."""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import Field, dataclass, field, fields
from typing import Any, get_args, get_type_hints

from runtime.errors import UserError

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'2GiB', '512MiB', '1.5G', '1000000' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise UserError(f"invalid memory size {text!r} (examples: 2GiB, 512MiB, 1e9 bytes as 1000000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def flag(default: Any, help: str, **add_argument: Any) -> Any:
    """A field that is also a flag of the engine group: --field-name, or the name in flag=; other keys
    (choices, type) go to add_argument, else the type follows the annotation (bool: --[no-]name)."""
    return field(default=default, metadata={"help": help, **add_argument})


# --quantization (runtime/accel/quantization.py holds the weights so). Default (no flag): a GGUF's
# block-quantized weights (Q4_0, Q4_1, Q8_0) stay as shipped on the CPU, float checkpoints stay float;
# these modes quantize float weights at load (a GGUF's are dequantized first).
QUANTIZATION_MODES: dict[str, str] = {
    "int8": "int8 weights with a scale per 32 (Q8_0 layout); int8 activations in blocks of 32 (CPU)",
    "q4": "4-bit weights in groups of 32 with a scale and a minimum each (Q4_1 layout), the LM head as int8; "
          "int8 activations (CPU)",
    "fp8": "e4m3 weights with per-output-channel scales, activations quantized per token (W8A8); "
           "the CuTe FP8 GEMM on sm_90, a dequantizing path elsewhere; the LM head stays in the compute dtype",
}
CPU_ONLY = ("int8", "q4")
FLOAT_MODE = "none"  # every weight in float (a GGUF dequantized at load)
QUANTIZATION_CHOICES = (*QUANTIZATION_MODES, FLOAT_MODE)
SCHEDULERS = ("continuous", "static")
KV_CACHE_DTYPES = ("auto", "float32", "bf16", "fp8_e4m3", "int8")
KV_ROLES = ("prefill", "decode", "both")
GENERATION_CONFIGS = ("auto", "vllm")


@dataclass
class EngineConfig:
    model: str | None = flag(None, "a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct)")
    device: str = flag("auto", "cpu, cuda, cuda:N or auto (default: %(default)s)")
    dtype: str = flag("auto", "weight and compute dtype, as vLLM spells it. GPU: the compute dtype (auto: bfloat16). "
                      "CPU: activations stay float32 and bfloat16 holds float weights in bf16 (vdpbf16ps on "
                      "AVX-512 BF16, widened to fp32 elsewhere); auto: bf16 for a bf16 checkpoint where the CPU "
                      "has AVX-512 BF16, else float32; float16 / half: GPU only",
                      choices=("auto", "half", "float16", "bfloat16", "float", "float32"))
    backend: str = flag("auto", "kernel backend (auto: CuTe kernels on an sm_90 GPU, torch reference otherwise; on the "
                        "CPU the torch backend runs fp32 attention (prefill and paged decode) and the fused "
                        "norm/rope/silu ops in C kernels unless CUTE_SERVE_CPU_KERNELS=0)",
                        choices=("auto", "torch", "cute"))
    quantization: str | None = flag(
        None, "how linear weights are held (default: a GGUF's Q4_0/Q4_1/Q8_0 weights stay quantized on the CPU, "
        f"float checkpoints stay float); {FLOAT_MODE}: dequantize everything to float; "
        + "; ".join(f"{k}: {v}" for k, v in QUANTIZATION_MODES.items()), choices=QUANTIZATION_CHOICES)
    kv_cache_dtype: str = flag("auto", "KV cache element type (auto: bf16 for float32 compute on the CPU, else the "
                               "compute dtype); on the CPU bf16 halves float32's bytes a token takes (twice the "
                               "tokens per budget, quality: docs/serving.md), int8 and fp8_e4m3 quarter them "
                               "(an fp32 scale per layer and KV head; quality: docs/serving.md); the C attention "
                               "kernels widen every type to fp32 on load; on CUDA, fp8_e4m3 halves bf16's "
                               "bytes (the cute backend's kernels)", choices=KV_CACHE_DTYPES)
    calculate_kv_scales: bool = flag(False, "with --kv-cache-dtype int8 or fp8_e4m3: compute the scales by a "
                                     "calibration pass over a shipped text at start even when the checkpoint "
                                     "carries k_scale / v_scale (without it the checkpoint's are used; a checkpoint "
                                     "without them is calibrated all the same)")
    block_size: int = flag(16, "tokens per KV block (default: %(default)s)")
    kv_cache_memory: int | None = flag(None, "KV cache budget, e.g. 2GiB (default: sized from free memory)",
                                       type=parse_bytes)  # bytes
    kv_cache_fraction: float = 0.1  # of available host memory on cpu (gpu: 0.85 of free device memory)
    kv_offload_bytes: int = flag(0, "host-memory tier below the KV pool, e.g. 16GiB (default 0: none; pays on a "
                                 "GPU, where it is pinned host memory)", type=parse_bytes)
    kv_disk_path: str | None = flag(None, "disk tier below the KV pool: evicted prefix blocks are written here and "
                                    "read back on a hit, across restarts (default: none)")
    kv_disk_bytes: int = flag(8 << 30, "the disk tier's budget (default 8GiB)", type=parse_bytes)
    kv_events_config: str | None = flag(None, "publish the prefix cache's blocks as vLLM's KV events for routers: "
                                        "vLLM's JSON, e.g. '{\"enable_kv_cache_events\": true}' (docs/serving.md)")
    kv_role: str = flag("both", "prefill/decode disaggregation (docs/disaggregation.md): prefill serves its finished "
                        "prompts' KV blocks to decode instances over TCP; decode fetches them (kv_transfer_params)",
                        choices=KV_ROLES)
    kv_transfer_host: str = flag("127.0.0.1", "prefill: the address decode instances fetch KV blocks from (bound)")
    kv_transfer_port: int = flag(0, "prefill: its KV block port (default 0: a free one, announced per request)")
    kv_transfer_timeout: float = flag(10.0, "decode: seconds a KV transfer may stall before it recomputes the prompt")
    kv_hold_timeout: float = flag(480.0, "prefill: seconds a finished prompt's KV waits to be fetched (vLLM's default)")
    max_num_batched_tokens: int = flag(1024, "token budget of one step")
    max_num_seqs: int = flag(64, "most sequences in one step")
    max_model_len: int | None = flag(None, "context limit (default: the model's)")
    scheduler: str = flag("continuous", "continuous (iteration-level) batching, or static batches for comparison",
                          choices=SCHEDULERS)
    enable_prefix_caching: bool = flag(True, "share KV blocks of common prompt prefixes across requests (default: on)")
    speculative: str | None = flag(None, "speculative decoding proposer (docs/speculative.md)",
                                   choices=("ngram", "suffix", "draft", "medusa", "eagle"))
    num_speculative_tokens: int = flag(4, "draft tokens per step (default: %(default)s)")
    draft_model: str | None = flag(None, "draft model path for --speculative draft")
    speculative_model: str | None = flag(None, "trained heads for --speculative medusa|eagle (default: the "
                                         "default model's, shipped in runtime/spec/data/)")
    ngram_min: int = flag(1, "smallest n-gram to match (default: %(default)s)")
    ngram_max: int = flag(4, "largest n-gram to match (default: %(default)s)")
    tensor_parallel_size: int = flag(1, "split the model over N processes (torch.distributed: gloo on the CPU, NCCL over "
                                     "N GPUs), each holding 1/N of the weights and of the KV heads; --kv-cache-memory "
                                     "is then per rank (default: %(default)s)")
    pipeline_parallel_size: int = flag(1, "split the model's layers over P stages, each holding its layers' weights "
                                       "and KV; composes with --tensor-parallel-size (TP x PP ranks); a step's "
                                       "batch runs as up to P micro-batches (default: %(default)s)")
    distributed_executor_backend: str = flag("auto", "how the ranks start: mp spawns them on this machine; "
                                             "external_launcher: torchrun (or any launcher setting RANK, WORLD_SIZE, "
                                             "MASTER_ADDR, MASTER_PORT) started every rank, on any node, and rank 0 "
                                             "serves; auto: external_launcher when RANK and WORLD_SIZE are set",
                                             choices=("auto", "mp", "external_launcher"))
    distributed_timeout: float = flag(600.0, "seconds the ranks wait for each other at start (default: %(default)s)")
    seed: int = flag(0, "seed for requests that do not set one", flag="--engine-seed")
    enforce_eager: bool = flag(False, "run every step eagerly (default: decode steps on CUDA replay CUDA graphs "
                               "captured at start for batch sizes 1, 2, 4, ... up to --max-num-seqs)")
    generation_config: str = flag("auto", "sampling defaults for what a request leaves unset: 'auto' takes a model "
                                  "folder's generation_config.json (temperature, top_p, top_k, min_p, "
                                  "repetition_penalty, max_new_tokens); 'vllm' ignores it", choices=GENERATION_CONFIGS)
    deterministic: bool = flag(False, "batch-invariant inference: a request's tokens depend only on the request "
                               "(its seed), not on what runs beside it, the prefix cache, chunking, speculation or "
                               "preemption (README, Deterministic inference)")
    log_ledger: bool = True

    def __post_init__(self) -> None:
        positive = {"block_size": self.block_size, "max_num_batched_tokens": self.max_num_batched_tokens,
                    "max_num_seqs": self.max_num_seqs, "tensor_parallel_size": self.tensor_parallel_size,
                    "pipeline_parallel_size": self.pipeline_parallel_size,
                    "max_model_len": 1 if self.max_model_len is None else self.max_model_len}
        bad = next((k for k, v in positive.items() if not isinstance(v, int) or v < 1), None)
        if bad:
            raise UserError(f"{bad} must be a positive integer, got {positive[bad]!r}")
        if not self.distributed_timeout > 0:
            raise UserError(f"distributed_timeout must be > 0 seconds, got {self.distributed_timeout}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 0:
            raise UserError(f"kv_cache_memory must be >= 0 bytes, got {self.kv_cache_memory}")
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise UserError(f"kv_cache_fraction must be in (0, 1], got {self.kv_cache_fraction}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UserError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r} (choose from {', '.join(KV_CACHE_DTYPES)})")
        if self.scheduler not in SCHEDULERS:
            raise UserError(f"unknown scheduler {self.scheduler!r} ({' or '.join(SCHEDULERS)})")
        if self.generation_config not in GENERATION_CONFIGS:
            raise UserError(f"unknown generation_config {self.generation_config!r} ({' or '.join(GENERATION_CONFIGS)})")
        if self.quantization not in (None, *QUANTIZATION_CHOICES):
            raise UserError(f"unknown quantization {self.quantization!r} (choose from {', '.join(QUANTIZATION_CHOICES)})")
        if self.deterministic and self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            raise UserError("deterministic: not with tensor_parallel_size or pipeline_parallel_size > 1 (the ranks "
                            "do not take it yet)")
        if self.scheduler == "static" and self.speculative:
            raise UserError("speculative decoding needs the continuous scheduler (static batches verify no drafts)")


def _flag_fields() -> list[Field]:
    """The EngineConfig fields that are command-line flags, in declaration (and --help) order."""
    return [f for f in fields(EngineConfig) if "help" in f.metadata]


def _flag_name(f: Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The "engine" argument group, generated from EngineConfig's fields (defaults and help live there)."""
    g = parser.add_argument_group("engine")
    hints = get_type_hints(EngineConfig)
    for f in _flag_fields():
        kwargs = {k: v for k, v in f.metadata.items() if k != "flag"}
        kind = next((a for a in get_args(hints[f.name]) if a is not type(None)), hints[f.name])  # X | None -> X
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind is not str:  # str flags take argparse's default: the text as given
            kwargs.setdefault("type", kind)
        g.add_argument(_flag_name(f), default=f.default, **kwargs)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the parsed engine flags describe; fields that are no flag keep their defaults."""
    # argparse's dest for a flag: --engine-seed -> args.engine_seed
    return EngineConfig(**{f.name: getattr(args, _flag_name(f)[2:].replace("-", "_")) for f in _flag_fields()})


def available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
