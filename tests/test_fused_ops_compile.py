"""The fused elementwise kernels compile for sm_90a on the CPU with the SASS their design needs (128-bit
global loads and stores, no 16-bit element accesses, no local memory, registers within the budget),
the checker fails a kernel that lacks them, and the family exports and links ahead of time."""
from __future__ import annotations

import ctypes
import dataclasses

import pytest

from cute_kernels.hopper.fused_family import FUSED_OPS, MAX_REGISTERS, fused_sass_problems
from cute_kernels.hopper.fused_spec import FusedOpSpec

cutlass = pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")

# One variant per op, each at its most register-hungry size.
VARIANTS = [FusedOpSpec("add_rms_norm", "bfloat16", 8192, True), FusedOpSpec("add_rms_norm", "float16", 16384),
            FusedOpSpec("rope", "bfloat16", 128), FusedOpSpec("silu_and_mul", "float16"),
            FusedOpSpec("write_kv", "bfloat16")]


@pytest.fixture(autouse=True)
def _private_tmpdir(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the DSL's cache


@pytest.fixture(scope="module")
def stats():
    from cute_kernels.toolchain.sass import find_nvdisasm, sass_stats

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    return {spec: sass_stats(FUSED_OPS.compile(spec, True).artifacts["cubin"]) for spec in VARIANTS}


@pytest.mark.parametrize("spec", VARIANTS, ids=lambda s: s.name)
def test_compiles_to_vectorized_loads_and_stores_without_spills(stats, spec):
    from cute_kernels.toolchain.check import common_problems

    s = stats[spec]
    assert s.global_load_128 >= 1 and s.global_store_128 >= 1
    assert s.global_16bit == 0 and s.spills == 0 and s.stack_bytes == 0
    assert s.registers is not None and 0 < s.registers <= MAX_REGISTERS
    assert fused_sass_problems(spec, s) == [] and common_problems(FUSED_OPS, s) == []


def test_the_checker_fails_a_kernel_off_the_vector_path(stats):
    from cute_kernels.toolchain.check import common_problems

    good = stats[VARIANTS[0]]
    scalar = dataclasses.replace(good, global_load_128=0, global_store_128=0, global_16bit=12)
    assert len(fused_sass_problems(VARIANTS[0], scalar)) == 3
    spilled = dataclasses.replace(good, local_load=2, registers=MAX_REGISTERS + 1)
    assert len(common_problems(FUSED_OPS, spilled)) == 2


def test_one_compile_serves_every_row_count_and_width():
    from cute_kernels.hopper.fused_compile import fake_fused_arguments

    args = fake_fused_arguments(FusedOpSpec("rope", "bfloat16", 64))
    assert FUSED_OPS.shim_abi[0] == (tuple(args[0].dynamic_shapes_mask), tuple(args[0].dynamic_strides_mask))
    FUSED_OPS.check_shim_abi(FusedOpSpec("rope", "bfloat16", 64))  # what the C shim packs


def test_family_exports_and_links_one_library(tmp_path):
    from cute_kernels.hopper.fused_aot import AotFusedOps, FusedOpsArgsC
    from cute_kernels.toolchain.aot_build import build
    from cute_kernels.toolchain.aot_link import find_cuda_toolkit

    if find_cuda_toolkit() is None:
        pytest.skip("no CUDA 13 headers + cudart")
    specs = [FusedOpSpec("silu_and_mul", "bfloat16"), FusedOpSpec("write_kv", "bfloat16")]
    manifest = build(tmp_path, [(FUSED_OPS, s) for s in specs], ("static",), log=lambda line: None)
    assert set(manifest["variants"]) == {s.name for s in specs}
    lib = AotFusedOps(tmp_path / "libcute_kernels_static.so", manifest)  # checks the args struct size
    launch = lib.entry(specs[0].name, "launch", [ctypes.POINTER(FusedOpsArgsC), ctypes.c_void_p])
    assert launch(ctypes.byref(FusedOpsArgsC()), None) == -1, "a launch before the load is refused"
