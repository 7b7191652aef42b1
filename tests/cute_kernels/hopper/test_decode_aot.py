"""Ahead-of-time decode kernels: the decode and merge variants export and link beside the others,
the library opens without the DSL up to the first CUDA call, and the real C shims, linked to mocks
of the DSL's entry points, hand the kernels exactly the descriptors of the torch tensors."""
from __future__ import annotations

import ctypes
import ctypes.util
import re
import struct
import subprocess
import sys

import pytest
import torch

from cute_kernels.hopper.decode.decode_aot import AotDecodeKernels, decode_c_args
from cute_kernels.hopper.decode.decode_family import DECODE, DECODE_MERGE
from cute_kernels.hopper.decode.decode_host import prepare_decode_args
from cute_kernels.hopper.decode.decode_spec import DecodeMergeSpec, DecodeSpec
from tests.cute_kernels.hopper.test_aot import build_aot
from tests.cute_kernels.hopper.test_decode_attention import decode_case
from tests.paths import REPO

SPEC, MERGE = DecodeSpec("float16", 64), DecodeMergeSpec("float16", 64)


@pytest.fixture(scope="module")
def built(tmp_path_factory, toolkit):
    return build_aot(tmp_path_factory, [(DECODE, SPEC), (DECODE_MERGE, MERGE)], flavors=("shared",))


def launch_args(splits: int):
    args = decode_case([20, 70], heads=8, kv_heads=2, d=64, q_lens=[1, 3], dtype=torch.float16)
    return prepare_decode_args(args, splits)


_LOAD_WITHOUT_DSL = r"""
import ctypes, sys
from pathlib import Path
sys.modules["cutlass"] = None  # any DSL import now fails
from cute_kernels.hopper.decode.decode_aot import AotDecodeKernels
from cute_kernels.toolchain.aot_manifest import read_manifest
aot_dir, preload = sys.argv[1:3]
ctypes.CDLL(preload, mode=ctypes.RTLD_GLOBAL)  # as torch cu13x does for libcudart.so.13
kernels = AotDecodeKernels(Path(aot_dir) / "libcute_kernels_shared.so", read_manifest(Path(aot_dir)))
for variant in sys.argv[3:]:
    try:
        kernels.load(variant)
        print("LOADED", variant)
    except RuntimeError as exc:
        print("ERROR", exc)
"""


def test_library_opens_without_the_dsl_up_to_the_cuda_init(built, toolkit):
    out, manifest = built
    assert {SPEC.name, MERGE.name} <= set(manifest["variants"])
    run = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_DSL, str(out), str(toolkit.shared_cudart), SPEC.name,
                          MERGE.name], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    if ctypes.util.find_library("cuda") is None:  # no driver here: the cubin load is the first CUDA call
        assert run.stdout.count("cudaErrorInsufficientDriver (35)") == 2, run.stdout
    else:
        assert run.stdout.count("LOADED") == 2 or "cudaErrorNoDevice" in run.stdout, run.stdout


def test_fake_arguments_match_what_the_shims_pack():
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    DECODE.check_shim_abi(SPEC)
    DECODE_MERGE.check_shim_abi(MERGE)


_MOCK_DSL = r"""
/* Stand-ins for the DSL's exported entry points and the cudart calls the shims make. */
#include <stdint.h>
#include <string.h>
#include <cuda_runtime.h>
#define EXPORT __attribute__((visibility("default")))
EXPORT unsigned char mock_desc[12][40];
EXPORT int32_t mock_nargs, mock_splits;
EXPORT float mock_scale;
EXPORT void *mock_stream;
static const int sizes[12] = {24, 32, 32, 24, 16, 16, 24, 24, 40, 40, 16, 16};
void _mlir_PREFIX_cuda_init(void **a) { *((struct { void *l; cudaError_t *ret; } *)a)->ret = cudaSuccess; }
void _mlir_PREFIX_cuda_load_to_device(void **a) { *((struct { void *l; int32_t *d; cudaError_t *ret; } *)a)->ret = cudaSuccess; }
void CIFACE(void **args, int32_t n) {
    mock_nargs = n;
    int tensors = n == 16 ? 12 : 4;
    for (int i = 0; i < tensors; i++) memcpy(mock_desc[i], args[i], n == 16 ? sizes[i] : (i < 2 ? 40 : 24));
    if (n == 16) { mock_scale = *(float *)args[12]; mock_splits = *(int32_t *)args[13]; }
    mock_stream = *(void **)args[n - 2];
    *(int32_t *)args[n - 1] = 0;
}
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { return "mockError"; }
const char *cudaGetErrorString(cudaError_t e) { return "mock"; }
"""


def _mock_shim(built, toolkit, tmp_path, family, spec) -> ctypes.CDLL:
    from cute_kernels.toolchain.aot_link import _cc, _cflags, compile_common, compile_shim

    out, _ = built
    header = (out / spec.name / f"{spec.name}.h").read_text()
    ciface = re.search(r"void (_mlir_\w+__mlir_ciface_\w+)\(void \*\*args", header)[1]
    (tmp_path / "mock.c").write_text(_MOCK_DSL.replace("PREFIX", spec.name).replace("CIFACE", ciface))
    objects = [compile_shim(spec.name, out / spec.name, tmp_path / "shim.o", toolkit, family.shim),
               compile_common(tmp_path / "common.o", toolkit)]
    mock = [_cc(), *_cflags(toolkit), "-c", str(tmp_path / "mock.c"), "-o", str(tmp_path / "mock.o")]
    subprocess.run(mock, check=True)
    so = tmp_path / "mock.so"
    subprocess.run([_cc(), "-shared", "-o", str(so), *map(str, objects), str(tmp_path / "mock.o")], check=True)
    return AotDecodeKernels(so, {"variants": [spec.name]})


def _descriptors(kernels, count):
    raw = [bytes(row) for row in (ctypes.c_ubyte * 40 * 12).in_dll(kernels.lib, "mock_desc")][:count]
    return raw, lambda ctype, sym: ctype.in_dll(kernels.lib, sym).value


def test_decode_shim_packs_the_dsl_descriptors(built, toolkit, tmp_path):
    kernels = _mock_shim(built, toolkit, tmp_path, DECODE, SPEC)
    args = launch_args(splits=3)
    kernels.launch_struct(SPEC.name, decode_c_args(args), 0x5EED)
    desc, value = _descriptors(kernels, 12)
    assert value(ctypes.c_int32, "mock_nargs") == 16 and value(ctypes.c_int32, "mock_splits") == 3
    assert value(ctypes.c_void_p, "mock_stream") == 0x5EED
    assert value(ctypes.c_float, "mock_scale") == pytest.approx(args.softmax_scale_log2)
    rows = lambda i: struct.unpack_from("<Qiiq", desc[i])  # noqa: E731
    four = lambda i: struct.unpack_from("<Qiiqq", desc[i])  # noqa: E731
    three = lambda i: struct.unpack_from("<Qiii4xqq", desc[i])  # noqa: E731
    vec = lambda i: struct.unpack_from("<Qi", desc[i])  # noqa: E731
    p, nb = args.plan, args.k_cache.shape[0]
    assert rows(0) == (args.q.data_ptr(), 4, 8, 8 * 64)
    assert four(1) == (args.k_cache.data_ptr(), nb, 2, 16 * 2 * 64, 2 * 64)
    assert four(2) == (args.v_cache.data_ptr(), nb, 2, 16 * 2 * 64, 2 * 64)
    assert rows(3) == (p.block_tables.data_ptr(), 2, p.block_tables.shape[1], p.block_tables.shape[1])
    assert vec(4) == (p.context_lens.data_ptr(), 2) and vec(5) == (p.cu_seqlens_q.data_ptr(), 3)
    assert rows(6) == (args.out.data_ptr(), 4, 8, 8 * 64) and rows(7) == (args.lse.data_ptr(), 4, 8, 8)
    assert three(8) == (args.out_partial.data_ptr(), 3, 4, 8, 4 * 8 * 64, 8 * 64)
    assert three(9) == (args.lse_partial.data_ptr(), 3, 4, 8, 4 * 8, 8)
    # the e4m3 scales [kv_heads]; a 16-bit cache's kernel gets a placeholder it never reads
    assert vec(10) == (args.k_scale.data_ptr(), 2) and vec(11) == (args.v_scale.data_ptr(), 2)


def test_merge_shim_packs_the_dsl_descriptors(built, toolkit, tmp_path):
    from cute_kernels.hopper.decode.decode_aot import merge_c_args

    kernels = _mock_shim(built, toolkit, tmp_path, DECODE_MERGE, MERGE)
    args = launch_args(splits=2)
    kernels.launch_struct(MERGE.name, merge_c_args(args), 0xF00D)
    desc, value = _descriptors(kernels, 4)
    assert value(ctypes.c_int32, "mock_nargs") == 6 and value(ctypes.c_void_p, "mock_stream") == 0xF00D
    assert struct.unpack_from("<Qiii4xqq", desc[0]) == (args.out_partial.data_ptr(), 2, 4, 8, 4 * 8 * 64, 8 * 64)
    assert struct.unpack_from("<Qiii4xqq", desc[1]) == (args.lse_partial.data_ptr(), 2, 4, 8, 4 * 8, 8)
    assert struct.unpack_from("<Qiiq", desc[2]) == (args.out.data_ptr(), 4, 8, 8 * 64)
    assert struct.unpack_from("<Qiiq", desc[3]) == (args.lse.data_ptr(), 4, 8, 8)


def test_c_args_refuse_layouts_the_kernel_was_not_compiled_for():
    args = launch_args(splits=1)
    args.q = args.q.transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(ValueError, match="decode AOT: q"):
        decode_c_args(args)
