"""Ahead-of-time FP8 kernels: the GEMM and the quantizer export, link and open (struct sizes agree
with the C ABI) without the DSL's help at run time; torch -> C argument marshalling on the CPU."""
from __future__ import annotations

import ctypes

import pytest
import torch

from cute_kernels.fp8_quant import quantize_rowwise
from cute_kernels.hopper.fp8_gemm.fp8_gemm_aot import (
    AotFp8Kernels,
    Fp8GemmArgsC,
    Fp8QuantArgsC,
    gemm_c_args,
    quant_c_args,
)
from cute_kernels.hopper.fp8_gemm.fp8_gemm_family import FP8_GEMM, FP8_GEMM_SPLITK, FP8_QUANT
from cute_kernels.hopper.fp8_gemm.fp8_gemm_host import prepare_fp8_gemm
from cute_kernels.hopper.fp8_gemm.fp8_gemm_spec import Fp8GemmSpec, Fp8QuantRowsSpec


def test_gemm_c_args_carry_pointers_sizes_and_strides():
    (a, sa), (b, sb) = quantize_rowwise(torch.randn(3, 64)), quantize_rowwise(torch.randn(32, 64))
    launch = prepare_fp8_gemm(a, b, sa, sb)
    c = gemm_c_args(*launch.kernel_tensors())
    assert (c.a, c.b, c.c) == (a.data_ptr(), b.data_ptr(), launch.out.data_ptr())
    assert (c.m, c.n, c.k, c.scale_cols, c.scale_b_rows) == (3, 32, 64, 1, 32)
    assert (c.a_stride, c.b_stride, c.c_stride, c.scale_a_stride, c.scale_b_stride) == (64, 64, 32, 1, 1)


def test_split_k_c_args_carry_the_workspace():
    (a, sa), (b, sb) = quantize_rowwise(torch.randn(2, 4096)), quantize_rowwise(torch.randn(1024, 4096))
    launch = prepare_fp8_gemm(a, b, sa, sb, splits=4)
    c = gemm_c_args(*launch.kernel_tensors())
    assert c.c == launch.workspace.data_ptr() and (c.splits, c.c_split_stride, c.c_stride) == (4, 2 * 1024, 1024)
    assert gemm_c_args(*prepare_fp8_gemm(a, b, sa, sb, splits=1).kernel_tensors()).splits == 1
    with pytest.raises(ValueError, match="contiguous"):
        gemm_c_args(a, b, launch.workspace.transpose(0, 1), sa, sb)


def test_quant_c_args_and_layout_refusals():
    x = torch.zeros(4, 48, dtype=torch.bfloat16)
    q, scale = torch.empty(4, 48, dtype=torch.float8_e4m3fn), torch.empty(4, 1)
    c = quant_c_args(x, q, scale)
    assert (c.m, c.k, c.x_stride, c.q_stride) == (4, 48, 48, 48)
    with pytest.raises(ValueError, match="compiled layout"):
        quant_c_args(torch.zeros(48, 4, dtype=torch.bfloat16).t(), q, scale)


SPLIT = Fp8GemmSpec("rowwise", 64, 64, split_k=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    from cute_kernels.toolchain.aot_build import build
    from cute_kernels.toolchain.aot_link import find_cuda_toolkit

    if find_cuda_toolkit() is None:
        pytest.skip("no CUDA 13 headers + cudart")
    out = tmp_path_factory.mktemp("aot_fp8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(out.parent))
        manifest = build(out, [(FP8_GEMM, Fp8GemmSpec("rowwise", 64, 64)), (FP8_QUANT, Fp8QuantRowsSpec()),
                               (FP8_GEMM_SPLITK, SPLIT)], flavors=("static",), log=lambda line: None)
    return out, manifest


def test_build_opens_with_matching_structs_and_refuses_launch_before_load(built):
    out, manifest = built
    assert set(manifest["variants"]) == {"fp8_gemm_rowwise_64x64", "fp8_quant_rows_bf16", SPLIT.name}
    kernels = AotFp8Kernels(out / "libcute_kernels_static.so", manifest)  # checks both struct sizes
    for variant, struct in (("fp8_gemm_rowwise_64x64", Fp8GemmArgsC), ("fp8_quant_rows_bf16", Fp8QuantArgsC),
                            (SPLIT.name, Fp8GemmArgsC)):
        launch = kernels.entry(variant, "launch", [ctypes.POINTER(struct), ctypes.c_void_p])
        assert launch(ctypes.byref(struct()), None) == -1  # CUTE_AOT_NOT_LOADED
