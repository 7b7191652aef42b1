"""Host side of the FP8 GEMM (pure torch; testable on the CPU): check the operands and scales, pick
the variant. The torch entry points that launch are in fp8_gemm_launch.py.

Operands (fp8_gemm_ref's contract): a [M, K] and b [N, K] e4m3, K-contiguous; scales fp32 in one of
fp8_quant's two modes, told apart by their shapes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cute_kernels.fp8_quant import BLOCK, E4M3

from .fp8_gemm_spec import TILE_K, Fp8GemmSpec, num_splits, spec_for

ALIGN_ELEMENTS = 16  # TMA moves 16-byte rows: K (e4m3) and N (bf16 C, e4m3 B) multiples of 16


@dataclass
class Fp8GemmLaunch:
    spec: Fp8GemmSpec
    a: torch.Tensor  # e4m3 [M, K]
    b: torch.Tensor  # e4m3 [N, K]
    out: torch.Tensor  # bf16 [M, N]
    scale_a: torch.Tensor  # fp32, 2-D
    scale_b: torch.Tensor  # fp32, 2-D
    workspace: torch.Tensor | None = None  # fp32 [splits, M, N] when spec.split_k; summed into out

    def kernel_tensors(self) -> tuple[torch.Tensor, ...]:
        """In the argument order of Fp8GemmSm90.__call__ (before the stream)."""
        c = self.workspace if self.spec.split_k else self.out
        return self.a, self.b, c, self.scale_a, self.scale_b


def scale_mode_of(m: int, n: int, k: int, scale_a: torch.Tensor, scale_b: torch.Tensor) -> str:
    k_blocks, n_blocks = -(-k // BLOCK), -(-n // BLOCK)
    if tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (n, 1):
        return "rowwise"
    if tuple(scale_a.shape) == (m, k_blocks) and tuple(scale_b.shape) == (n_blocks, k_blocks):
        return "block128"
    raise ValueError(f"fp8 gemm: scales {tuple(scale_a.shape)} x {tuple(scale_b.shape)} for M={m}, N={n}, K={k}: "
                     f"expected [{m}, 1] x [{n}, 1] (rowwise) or [{m}, {k_blocks}] x [{n_blocks}, {k_blocks}] "
                     "(128x128 blocks)")


def _check_operand(x: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    if x.dim() != 2 or x.dtype != dtype:
        raise ValueError(f"fp8 gemm: {name} is {x.dtype} {tuple(x.shape)}; expected 2-D {dtype}")
    if not x.is_contiguous() or x.data_ptr() % 16:
        raise ValueError(f"fp8 gemm: {name} must be contiguous (row-major) and 16-byte aligned")


def check_splits(splits: int, k: int) -> None:
    """Every split must own at least one k-tile: splits x ceil(k_tiles / splits) covers k_tiles once."""
    k_tiles = -(-k // TILE_K)
    if splits < 1 or splits > k_tiles or -(-k_tiles // -(-k_tiles // splits)) != splits:
        raise ValueError(f"fp8 gemm: {splits} K splits of {k_tiles} k-tiles would leave a split empty")


def prepare_fp8_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                     out: torch.Tensor | None = None, splits: int | None = None) -> Fp8GemmLaunch:
    """What the kernel reads for these operands; ValueError for anything no variant takes.
    splits: K split across that many CTAs per output tile (default: num_splits' choice)."""
    _check_operand(a, "a", E4M3)
    _check_operand(b, "b", E4M3)
    (m, k), (n, k_b) = a.shape, b.shape
    if k != k_b:
        raise ValueError(f"fp8 gemm: a is [{m}, {k}] but b is [{n}, {k_b}]: K differs")
    if k % ALIGN_ELEMENTS or n % ALIGN_ELEMENTS or k == 0 or n == 0:
        raise ValueError(f"fp8 gemm: N={n} and K={k} must be positive multiples of {ALIGN_ELEMENTS} (TMA rows)")
    mode = scale_mode_of(m, n, k, scale_a, scale_b)
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.dtype != torch.float32 or not s.is_contiguous():
            raise ValueError(f"fp8 gemm: {name} must be contiguous float32, got {s.dtype}")
    if len({t.device for t in (a, b, scale_a, scale_b)}) != 1:
        raise ValueError("fp8 gemm: operands and scales must be on one device")
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    else:
        _check_operand(out, "out", torch.bfloat16)
        if tuple(out.shape) != (m, n):
            raise ValueError(f"fp8 gemm: out is {tuple(out.shape)}, expected [{m}, {n}]")
    splits = num_splits(m, n, k) if splits is None else splits
    check_splits(splits, k)
    if splits == 1:
        return Fp8GemmLaunch(spec_for(mode, m), a, b, out, scale_a, scale_b)
    workspace = torch.empty(splits, m, n, dtype=torch.float32, device=a.device)
    return Fp8GemmLaunch(Fp8GemmSpec(mode, 64, 64, split_k=True), a, b, out, scale_a, scale_b, workspace)


def check_quant_rows_input(x: torch.Tensor) -> None:
    """What the per-token quantizer takes: 2-D bf16 CUDA rows, K a multiple of 16."""
    if x.dim() != 2 or x.dtype != torch.bfloat16 or not x.is_cuda:
        raise ValueError(f"fp8 row quantization: x is {x.dtype} {tuple(x.shape)} on {x.device}; expected 2-D bf16 CUDA")
    _check_operand(x, "x", torch.bfloat16)
    if x.shape[1] % ALIGN_ELEMENTS:
        raise ValueError(f"fp8 row quantization: K={x.shape[1]} must be a multiple of {ALIGN_ELEMENTS}")
