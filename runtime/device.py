"""Where the engine runs: its device and dtype, and how much memory the KV cache may take."""
from __future__ import annotations

import torch

from runtime.engine_config import EngineConfig, available_host_memory
from runtime.errors import UserError


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on the CPU (exact parity with references), bf16 on a GPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"invalid device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available")
    return device


DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "half": torch.float16}  # --dtype's values, as vLLM spells them


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute (activation) dtype. On the CPU it is float32 whatever --dtype says: there bfloat16 is
    how float weights are held (resolve_weight_dtype), and float16 has no kernel (UserError)."""
    if name != "auto" and name not in DTYPES:
        raise UserError(f"unknown dtype {name!r} (choose from auto, {', '.join(DTYPES)})")
    if device.type == "cpu":
        if DTYPES.get(name) == torch.float16:
            raise UserError(f"--dtype {name}: no CPU kernel runs float16; use bfloat16, float32 or auto")
        return torch.float32
    return default_dtype(device) if name == "auto" else DTYPES[name]


def _bf16_checkpoint(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether the checkpoint's matrices are stored in bf16 (a GGUF's quantized blocks are no float tensors)."""
    matrices = [t for t in tensors.values() if isinstance(t, torch.Tensor) and t.dim() == 2]
    return bool(matrices) and all(t.dtype == torch.bfloat16 for t in matrices)


def resolve_weight_dtype(name: str, device: torch.device, tensors: dict[str, torch.Tensor]) -> torch.dtype | None:
    """bfloat16 where float linear weights are held in bf16 on the CPU (cute_kernels/cpu/bf16_gemm.py), None
    for the compute dtype. auto: bf16 for a bf16 checkpoint on a CPU with AVX-512 BF16 (vdpbf16ps),
    as loaded; float32 elsewhere (no native bf16 product, or a float32 / float16 checkpoint)."""
    from cute_kernels.cpu.bf16_gemm import native_bf16

    if device.type != "cpu":
        return None
    if name == "auto":
        return torch.bfloat16 if _bf16_checkpoint(tensors) and native_bf16() else None
    return torch.bfloat16 if DTYPES[name] == torch.bfloat16 else None


GPU_E4M3_COMPUTE = (torch.bfloat16, torch.float16)  # what the e4m3 variants dequantize to
KV_DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}


def default_kv_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """--kv-cache-dtype auto: bf16 for float32 compute on the CPU (the C attention kernels built), else the
    compute dtype. Long-context decode reads the cache at memory bandwidth, and bf16 halves its
    bytes for a perplexity change within noise of float32's (docs/serving.md, KV cache dtypes). Widening
    bf16 is a 16-bit shift, so every CPU (AVX2, AVX-512, portable C) takes it and gives the same tokens."""
    from cute_kernels.cpu.decode_attention import unavailable_reason  # builds the kernel on first use

    if device.type == "cpu" and dtype == torch.float32 and unavailable_reason() is None:
        return torch.bfloat16
    return dtype


def resolve_kv_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's element type for --kv-cache-dtype; UserError where no kernel reads that cache: on the CPU
    float32 compute reads every type; on CUDA, bf16 / fp16 compute reads its own type and fp8_e4m3 (the
    Hopper kernels' e4m3 variants; cute_backend.py)."""
    kv_dtype = default_kv_dtype(dtype, device) if name == "auto" else KV_DTYPES[name]
    if kv_dtype == dtype:
        return kv_dtype
    if device.type == "cuda" and kv_dtype == torch.float8_e4m3fn and dtype in GPU_E4M3_COMPUTE:
        return kv_dtype
    if device.type == "cuda":
        raise UserError(f"--kv-cache-dtype {name} differs from the compute dtype ({dtype}): on CUDA only fp8_e4m3 "
                        "under bfloat16 or float16 compute is read by a kernel (use --kv-cache-dtype auto or fp8_e4m3)")
    if device.type != "cpu" or dtype != torch.float32:
        raise UserError(f"--kv-cache-dtype {name} differs from the compute dtype ({dtype}): only float32 compute "
                        "on the CPU reads a cache of another type (use --kv-cache-dtype auto)")
    return kv_dtype


def kv_budget(config: EngineConfig, device: torch.device, ranks: int = 1) -> int:
    """Bytes for one rank's KV cache; read once the weights are resident, so free memory no longer counts them."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    if device.type == "cuda":
        torch.cuda.empty_cache()  # load-time temporaries held by the caching allocator are free memory too
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.85)
    # ranks on the CPU share the host's memory: each takes its part of the fraction
    return int(available_host_memory() * config.kv_cache_fraction / ranks)
