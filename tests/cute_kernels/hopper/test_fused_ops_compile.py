"""The fused elementwise kernels compile for sm_90a on the CPU with the SASS their design needs (128-bit
global loads and stores, no 16-bit element accesses, no local memory, registers within the budget),
the checker fails a kernel that lacks them, and the family exports and links ahead of time."""
from __future__ import annotations

import ctypes
import dataclasses

import pytest

from cute_kernels.hopper.fused.fused_family import FUSED_OPS, MAX_REGISTERS, fused_sass_problems
from cute_kernels.hopper.fused.fused_spec import FusedOpSpec

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
    from cute_kernels.hopper.fused.fused_compile import fake_fused_arguments

    args = fake_fused_arguments(FusedOpSpec("rope", "bfloat16", 64))
    assert FUSED_OPS.shim_abi[0] == (tuple(args[0].dynamic_shapes_mask), tuple(args[0].dynamic_strides_mask))
    FUSED_OPS.check_shim_abi(FusedOpSpec("rope", "bfloat16", 64))  # what the C shim packs


def test_family_exports_and_links_one_library(tmp_path):
    from cute_kernels.hopper.fused.fused_aot import AotFusedOps, FusedOpsArgsC
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


_MOCK_DSL = r"""
/* Stand-ins for the DSL's exported entry points and the cudart calls the shim makes. */
#include <stdint.h>
#include <string.h>
#include <cuda_runtime.h>
#define EXPORT __attribute__((visibility("default")))
EXPORT unsigned char mock_desc[6][24];
EXPORT int32_t mock_nargs, mock_load_calls;
EXPORT float mock_scalar;
EXPORT void *mock_stream;
void _mlir_PREFIX_cuda_init(void **a) { *((struct { void *l; cudaError_t *ret; } *)a)->ret = cudaSuccess; }
void _mlir_PREFIX_cuda_load_to_device(void **a) {
    mock_load_calls++; *((struct { void *l; int32_t *d; cudaError_t *ret; } *)a)->ret = cudaSuccess; }
void CIFACE(void **args, int32_t n) {
    mock_nargs = n;
    for (int i = 0; i < 5; i++) memcpy(mock_desc[i], args[i], 24);
    memcpy(mock_desc[5], args[5], 16);
    mock_scalar = *(float *)args[6]; mock_stream = *(void **)args[7];
    *(int32_t *)args[8] = 0;
}
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { return "mockError"; }
const char *cudaGetErrorString(cudaError_t e) { return "mock"; }
"""


def test_shim_packs_every_operand_in_order(tmp_path):
    """The real shim, compiled against a real exported header, linked to mocks of the DSL's entry
    points: a launch from torch tensors reaches the DSL function with exactly these descriptors."""
    import re
    import struct
    import subprocess

    import torch

    from cute_kernels.hopper.fused.fused_aot import AotFusedOps
    from cute_kernels.hopper.fused.fused_host import prepare_write_kv
    from cute_kernels.toolchain.aot_export import export_variant
    from cute_kernels.toolchain.aot_link import _cc, _cflags, compile_common, compile_shim, find_cuda_toolkit

    kit = find_cuda_toolkit()
    if kit is None:
        pytest.skip("no CUDA 13 headers + cudart")
    spec = FusedOpSpec("write_kv", "bfloat16")
    export_variant(FUSED_OPS, spec, tmp_path / spec.name)
    header = (tmp_path / spec.name / f"{spec.name}.h").read_text()
    ciface = re.search(r"void (_mlir_\w+__mlir_ciface_\w+)\(void \*\*args", header)[1]
    (tmp_path / "mock.c").write_text(_MOCK_DSL.replace("PREFIX", spec.name).replace("CIFACE", ciface))
    objects = [compile_shim(spec.name, tmp_path / spec.name, tmp_path / "shim.o", kit, FUSED_OPS.shim),
               compile_common(tmp_path / "common.o", kit)]
    subprocess.run([_cc(), *_cflags(kit), "-c", str(tmp_path / "mock.c"), "-o", str(tmp_path / "mock.o")], check=True)
    so = tmp_path / "mock.so"
    subprocess.run([_cc(), "-shared", "-o", str(so), *map(str, objects), str(tmp_path / "mock.o")], check=True)

    qkv = torch.zeros(5, 12 * 128, dtype=torch.bfloat16)
    k, v = qkv[:, 8 * 128:10 * 128].view(5, 2, 128), qkv[:, 10 * 128:].view(5, 2, 128)
    caches = [torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16) for _ in range(2)]
    slots = torch.tensor([0, 17, -1, 63, 5])
    lib = AotFusedOps(so, {"variants": [spec.name]})
    lib.launch(prepare_write_kv(k, v, *caches, slots), stream=0x5EED)
    value = lambda ctype, sym: ctype.in_dll(lib.lib, sym).value  # noqa: E731
    assert value(ctypes.c_int32, "mock_nargs") == 9 and value(ctypes.c_int32, "mock_load_calls") == 1
    assert value(ctypes.c_void_p, "mock_stream") == 0x5EED
    desc = [bytes(row) for row in (ctypes.c_ubyte * 24 * 6).in_dll(lib.lib, "mock_desc")]
    matrix = lambda i: struct.unpack_from("<Qiiq", desc[i])  # noqa: E731
    assert matrix(0) == (k.data_ptr(), 5, 256, 12 * 128) and matrix(1) == (v.data_ptr(), 5, 256, 12 * 128)
    assert matrix(2) == (caches[0].data_ptr(), 64, 256, 256) and matrix(3) == (caches[1].data_ptr(), 64, 256, 256)
    assert matrix(4) == matrix(0), "the unused operand is a placeholder"
    assert struct.unpack_from("<Qi", desc[5]) == (slots.data_ptr(), 5)
