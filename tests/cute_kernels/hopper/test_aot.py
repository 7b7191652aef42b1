"""Ahead-of-time prefill kernels: export + link (needs the DSL and a CUDA 13 toolkit, else skipped),
what the libraries need at run time, loading them without the DSL, the torch -> C argument
marshalling (against mocks of the C signature and of the DSL's entry points), and on a Hopper GPU
(marker gpu) the AOT kernels against the reference."""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cute_kernels.attention_args import PrefillArgs
from cute_kernels.hopper.prefill.prefill_family import PREFILL
from cute_kernels.hopper.prefill.prefill_host import prepare_prefill_args
from cute_kernels.hopper.prefill.prefill_spec import KV_BLOCK_SIZE, PrefillSpec
from cute_kernels.toolchain.aot_loader import (
    AotPrefillKernels,
    AotUnavailable,
    PrefillArgsC,
    open_prefill_kernels,
    prefill_c_args,
)
from cute_kernels.toolchain.aot_manifest import ABI_VERSION, kernel_source_hash, kernel_sources
from tests.cute_kernels.hopper.test_prefill_attention import make_batch
from tests.paths import REPO

VARIANTS = (PrefillSpec("bfloat16", 128, 8), PrefillSpec("float16", 64, 4))
SOURCES = kernel_sources([PREFILL])
LIB_BUDGET = 4 << 20  # two variants + a static cudart stay well under this


def prefix_batch(d=64, dtype=torch.bfloat16, device="cpu"):
    x = make_batch([3, 7], [20, 0], 8, 2, d=d, dtype=dtype, device=device)
    return x, prepare_prefill_args(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.125,
                                               True, x["k_cache"], x["v_cache"], x["block_tables"], x["prefix_lens"]))


def c_fields(c: PrefillArgsC) -> dict:
    return {name: (tuple(getattr(c, name)) if name.endswith("_strides") else getattr(c, name))
            for name, _ in PrefillArgsC._fields_}


# ----------------------------------------------------------------------------- build (DSL + toolkit)
def build_aot(tmp_path_factory, variants: list, **build_kwargs) -> tuple[Path, dict]:
    """An AOT folder holding `variants` ((family, spec) pairs), built once for a test module."""
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    from cute_kernels.toolchain.aot_build import build

    out = tmp_path_factory.mktemp("aot")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(out.parent))  # the DSL's cache
        manifest = build(out, variants, log=lambda line: None, **build_kwargs)
    return out, manifest


@pytest.fixture(scope="module")
def built(tmp_path_factory, toolkit):
    return build_aot(tmp_path_factory, [(PREFILL, spec) for spec in VARIANTS])


def _nm(*args: str) -> list[str]:
    return subprocess.run(["nm", "-D", *args], capture_output=True, text=True, check=True).stdout.splitlines()


def test_build_writes_every_variant_and_a_manifest(built):
    from cute_kernels.toolchain.aot_manifest import read_manifest

    out, manifest = built
    assert set(manifest["variants"]) == {s.name for s in VARIANTS}
    for spec in VARIANTS:
        assert (out / spec.name / f"{spec.name}.h").is_file() and (out / spec.name / f"{spec.name}.o").is_file()
    assert [lib["cudart"] for lib in manifest["libraries"]] == ["shared", "static"]  # torch's cudart first
    assert read_manifest(out) == manifest and manifest["source_hash"] == kernel_source_hash(manifest["sources"])
    assert set(kernel_sources([PREFILL])) <= set(manifest["sources"])


def test_libraries_are_small_x86_64_and_export_only_the_c_api(built):
    from cute_kernels.toolchain.aot_link import inspect_library

    out, manifest = built
    expected = {"cute_aot_abi_version", "cute_aot_prefill_args_size", "cute_aot_error_name", "cute_aot_error_string",
                "cute_aot_decode_args_size", "cute_aot_decode_merge_args_size", "cute_aot_fused_ops_args_size",
                "cute_aot_fp8_gemm_args_size", "cute_aot_fp8_quant_args_size"}
    expected |= {f"cute_aot_{s.name}_{fn}" for s in VARIANTS for fn in ("load", "launch")}
    for lib in manifest["libraries"]:
        info = inspect_library(out / lib["file"])
        assert "X86-64" in info.machine
        assert 0 < info.bytes < LIB_BUDGET, info.bytes
        assert set(info.exported) == expected


def test_static_library_needs_nothing_but_libc(built):
    out, _ = built
    from cute_kernels.toolchain.aot_link import inspect_library

    so = out / "libcute_kernels_static.so"
    assert set(inspect_library(so).needed) <= {"libc.so.6", "ld-linux-x86-64.so.2"}
    unresolved = [line for line in _nm("--undefined-only", str(so))
                  if "@GLIBC_" not in line and not line.split()[0] == "w"]
    assert unresolved == [], "the static library must resolve everything but glibc itself"


def test_shared_library_resolves_against_libcudart_only(built, toolkit):
    from cute_kernels.toolchain.aot_link import ALLOWED_NEEDED, CUDART_SONAME, inspect_library

    out, _ = built
    info = inspect_library(out / "libcute_kernels_shared.so")
    assert CUDART_SONAME in info.needed and set(info.needed) <= ALLOWED_NEEDED
    assert not any(k in n for n in info.needed for k in ("cute", "cutlass", "tvm", "mlir"))
    cudart = {line.split()[-1].split("@")[0] for line in _nm("--defined-only", str(toolkit.shared_cudart))}
    lines = _nm("--undefined-only", str(out / "libcute_kernels_shared.so"))
    unresolved = [ln for ln in lines if "@GLIBC_" not in ln and ln.split()[0] != "w"
                  and ln.split()[-1].split("@")[0] not in cudart]
    assert unresolved == []


_LOAD_WITHOUT_DSL = r"""
import ctypes, sys
from pathlib import Path
sys.modules["cutlass"] = None  # any DSL import now fails
from cute_kernels.toolchain.aot_loader import AotPrefillKernels
from cute_kernels.toolchain.aot_manifest import read_manifest
aot_dir, so, variant, preload = sys.argv[1:5]
if preload:
    ctypes.CDLL(preload, mode=ctypes.RTLD_GLOBAL)  # as torch cu13x does for libcudart.so.13
kernels = AotPrefillKernels(Path(aot_dir) / so, read_manifest(Path(aot_dir)))
try:
    kernels.load(variant)
    print("LOADED")
except RuntimeError as exc:
    print("ERROR", exc)
maps = Path("/proc/self/maps").read_text()
print("DSL_MAPPED", any(k in maps for k in ("cute_dsl", "cutlass", "_mlir")))
"""


@pytest.mark.parametrize("flavor", ["static", "shared"])
def test_library_loads_in_a_process_without_the_dsl(built, toolkit, flavor):
    out, _ = built
    preload = str(toolkit.shared_cudart) if flavor == "shared" else ""
    run = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_DSL, str(out), f"libcute_kernels_{flavor}.so",
                          VARIANTS[0].name, preload], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "DSL_MAPPED False" in run.stdout
    if ctypes.util.find_library("cuda") is None:  # no driver here: the cubin load is the first CUDA call
        assert "cudaErrorInsufficientDriver (35)" in run.stdout, run.stdout
    else:
        assert "LOADED" in run.stdout or "cudaErrorNoDevice" in run.stdout, run.stdout


def test_launch_before_load_is_refused(built):
    out, manifest = built
    kernels = AotPrefillKernels(out / "libcute_kernels_static.so", manifest)
    launch = kernels.entry(VARIANTS[0].name, "launch", [ctypes.POINTER(PrefillArgsC), ctypes.c_void_p])
    assert launch(ctypes.byref(PrefillArgsC()), None) == -1
    assert "before it was loaded" in kernels.error(-1)
    with pytest.raises(AotUnavailable, match="not among the AOT kernels"):
        kernels.entry("prefill_bfloat16_d128_g2_causal", "launch", [])


_MOCK_DSL = r"""
/* Stand-ins for the DSL's exported entry points and the three cudart calls the shim makes. */
#include <stdint.h>
#include <string.h>
#include <cuda_runtime.h>
#define EXPORT __attribute__((visibility("default")))
EXPORT unsigned char mock_desc[14][32];
EXPORT int32_t mock_nargs, mock_max_seqlen, mock_num_ctas, mock_init_calls, mock_load_calls;
EXPORT float mock_scale;
EXPORT void *mock_stream;
static const int sizes[14] = {24, 24, 24, 32, 32, 24, 16, 16, 16, 24, 24, 16, 16, 16};
void _mlir_PREFIX_cuda_init(void **a) { mock_init_calls++; *((struct { void *l; cudaError_t *ret; } *)a)->ret = cudaSuccess; }
void _mlir_PREFIX_cuda_load_to_device(void **a) {
    mock_load_calls++; *((struct { void *l; int32_t *d; cudaError_t *ret; } *)a)->ret = cudaSuccess; }
void CIFACE(void **args, int32_t n) {
    mock_nargs = n;
    for (int i = 0; i < 14; i++) memcpy(mock_desc[i], args[i], sizes[i]);
    mock_scale = *(float *)args[14]; mock_max_seqlen = *(int32_t *)args[15]; mock_num_ctas = *(int32_t *)args[16];
    mock_stream = *(void **)args[17];
    *(int32_t *)args[18] = 0;
}
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { return "mockError"; }
const char *cudaGetErrorString(cudaError_t e) { return "mock"; }
"""


def test_shim_packs_the_dsl_descriptors(built, toolkit, tmp_path):
    """The real shim, compiled against the real exported header, linked to mocks of the DSL's entry
    points: a launch from torch tensors must reach the DSL function with exactly these descriptors."""
    from cute_kernels.toolchain.aot_link import _cc, _cflags, compile_common, compile_shim

    out, _ = built
    name = VARIANTS[1].name  # fp16, d=64, 8 query heads over 2 KV heads like prefix_batch()
    ciface = re.search(r"void (_mlir_\w+__mlir_ciface_\w+)\(void \*\*args", (out / name / f"{name}.h").read_text())[1]
    (tmp_path / "mock.c").write_text(_MOCK_DSL.replace("PREFIX", name).replace("CIFACE", ciface))
    objects = [compile_shim(name, out / name, tmp_path / "shim.o", toolkit), compile_common(tmp_path / "common.o", toolkit)]
    subprocess.run([_cc(), *_cflags(toolkit), "-c", str(tmp_path / "mock.c"), "-o", str(tmp_path / "mock.o")], check=True)
    so = tmp_path / "mock.so"
    subprocess.run([_cc(), "-shared", "-o", str(so), *map(str, objects), str(tmp_path / "mock.o")], check=True)

    kernels = AotPrefillKernels(so, {"variants": [name]})
    x, args = prefix_batch(d=64, dtype=torch.float16)
    kernels.launch(args, stream=0x5EED)
    kernels.launch(args, stream=0x5EED)
    lib = kernels.lib
    value = lambda ctype, sym: ctype.in_dll(lib, sym).value  # noqa: E731
    assert value(ctypes.c_int32, "mock_init_calls") == 1 and value(ctypes.c_int32, "mock_load_calls") == 1
    assert value(ctypes.c_int32, "mock_nargs") == 19
    assert value(ctypes.c_void_p, "mock_stream") == 0x5EED
    assert value(ctypes.c_int32, "mock_max_seqlen") == 7
    assert value(ctypes.c_int32, "mock_num_ctas") == 4  # 4 tiles (2 sequences x 2 KV heads), one CTA each
    assert value(ctypes.c_float, "mock_scale") == pytest.approx(args.softmax_scale_log2)
    desc = [bytes(row) for row in (ctypes.c_ubyte * 32 * 14).in_dll(lib, "mock_desc")]
    rows = lambda i: struct.unpack_from("<Qiiq", desc[i])  # noqa: E731
    cache = lambda i: struct.unpack_from("<Qiiqq", desc[i])  # noqa: E731
    vec = lambda i: struct.unpack_from("<Qi", desc[i])  # noqa: E731
    total, nb = 10, args.k_cache.shape[0]
    assert rows(0) == (args.q.data_ptr(), total, 8, 8 * 64)
    assert rows(1) == (args.k.data_ptr(), total, 2, 2 * 64) and rows(2) == (args.v.data_ptr(), total, 2, 2 * 64)
    assert cache(3) == (args.k_cache.data_ptr(), nb, 2, KV_BLOCK_SIZE * 2 * 64, 2 * 64)
    assert cache(4) == (args.v_cache.data_ptr(), nb, 2, KV_BLOCK_SIZE * 2 * 64, 2 * 64)
    bt = args.block_tables
    assert rows(5) == (bt.data_ptr(), 2, bt.shape[1], bt.shape[1])
    assert vec(6) == (args.prefix_lens.data_ptr(), 2)
    assert vec(7) == (args.cu_seqlens_q.data_ptr(), 3) and vec(8) == (args.cu_seqlens_k.data_ptr(), 3)
    assert rows(9) == (args.out.data_ptr(), total, 8, 8 * 64) and rows(10) == (args.lse.data_ptr(), total, 8, 8)
    assert vec(11) == (args.tile_order.data_ptr(), 4)
    # the e4m3 prefix's scales [kv_heads]; a 16-bit variant gets a placeholder it never reads
    assert vec(12) == (args.k_scale.data_ptr(), 2) and vec(13) == (args.v_scale.data_ptr(), 2)


# ----------------------------------------------------------------------------- loader (no DSL needed)
def test_stale_or_missing_artifacts_are_refused(tmp_path):
    with pytest.raises(AotUnavailable, match="no AOT kernels"):
        open_prefill_kernels(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"abi": ABI_VERSION, "sources": list(SOURCES), "source_hash": "0" * 16, "variants": {}, "libraries": []}))
    with pytest.raises(AotUnavailable, match="stale"):
        open_prefill_kernels(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"abi": ABI_VERSION, "sources": list(SOURCES), "source_hash": kernel_source_hash(SOURCES), "variants": {},
         "libraries": [{"file": "missing.so", "cudart": "static"}]}))
    with pytest.raises(AotUnavailable, match="missing.so"):
        open_prefill_kernels(tmp_path)


def test_c_args_carry_pointers_sizes_and_strides():
    x, args = prefix_batch()
    c = prefill_c_args(args)
    for name in ("q", "k", "v", "k_cache", "v_cache", "block_tables", "prefix_lens", "cu_seqlens_q", "cu_seqlens_k",
                 "out", "lse"):
        assert getattr(c, name) == getattr(args, name).data_ptr(), name
    max_blocks = args.block_tables.shape[1]
    assert (c.total_q, c.heads, c.total_k, c.kv_heads) == (10, 8, 10, 2)
    assert (c.num_blocks, c.batch, c.max_blocks, c.max_seqlen_q) == (args.k_cache.shape[0], 2, max_blocks, 7)
    assert (c.q_stride, c.k_stride, c.v_stride, c.out_stride) == (8 * 64, 2 * 64, 2 * 64, 8 * 64)
    assert tuple(c.k_cache_strides) == tuple(c.v_cache_strides) == (KV_BLOCK_SIZE * 2 * 64, 2 * 64)
    assert (c.block_tables_stride, c.lse_stride) == (max_blocks, 8)
    assert c.softmax_scale_log2 == pytest.approx(args.softmax_scale_log2)
    assert (c.tile_order, c.num_tiles, c.num_ctas) == (args.tile_order.data_ptr(), 4, 4)  # 2 sequences x 2 KV heads


def test_c_args_refuse_layouts_the_kernel_was_not_compiled_for():
    _, args = prefix_batch()
    good_q = args.q
    args.q = torch.empty(8, 10, 64, dtype=torch.bfloat16).transpose(0, 1)  # heads-major
    with pytest.raises(ValueError, match="q .* do not fit the compiled layout"):
        prefill_c_args(args)
    args.q = torch.empty(10 * 8 * 64 + 1, dtype=torch.bfloat16)[1:].view(10, 8, 64)  # 2-byte aligned
    with pytest.raises(ValueError, match="address"):
        prefill_c_args(args)
    args.q, args.max_seqlen_q = good_q, 2**31
    with pytest.raises(ValueError, match="max_seqlen_q=2147483648 does not fit int32"):
        prefill_c_args(args)


def test_prepare_copies_a_v_split_off_fused_qkv():
    qkv = torch.randn(10, (8 + 2 + 2) * 64).to(torch.bfloat16)
    q, k, v = (t.view(10, -1, 64) for t in qkv.split([8 * 64, 2 * 64, 2 * 64], dim=-1))
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    args = prepare_prefill_args(PrefillArgs(q, k, v, cu, cu, 0.125))
    assert args.v.is_contiguous() and torch.equal(args.v, v)
    prefill_c_args(args)  # fits the compiled layout now


def _mock_library(launch_fn) -> SimpleNamespace:
    """The library's C API, with launch/load as real ctypes function pointers of the C signatures."""
    launch_t = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(PrefillArgsC), ctypes.c_void_p)
    load_t = ctypes.CFUNCTYPE(ctypes.c_int32)
    loads = []
    name = PrefillSpec("bfloat16", 64, 4).name
    return SimpleNamespace(
        cute_aot_abi_version=lambda: ABI_VERSION, cute_aot_prefill_args_size=lambda: ctypes.sizeof(PrefillArgsC),
        cute_aot_error_name=lambda code: b"cudaErrorMock", cute_aot_error_string=lambda code: b"mocked",
        **{f"cute_aot_{name}_launch": launch_t(launch_fn), f"cute_aot_{name}_load": load_t(lambda: loads.append(1) or 0)},
        loads=loads, variant=name)


def test_launch_through_a_mock_of_the_c_signature():
    seen = []

    def launch(args_ptr, stream):
        seen.append((c_fields(args_ptr.contents), stream))
        return 0

    lib = _mock_library(launch)
    kernels = AotPrefillKernels(Path("mock.so"), {"variants": [lib.variant]}, lib=lib)
    _, args = prefix_batch()
    kernels.launch(args, stream=0xBEEF)
    kernels.launch(args, stream=0xBEEF)
    assert lib.loads == [1], "each variant loads once"
    assert [s for _, s in seen] == [0xBEEF, 0xBEEF]
    assert seen[0][0] == c_fields(prefill_c_args(args))


def test_launch_errors_name_the_cuda_error():
    lib = _mock_library(lambda args_ptr, stream: 700)
    kernels = AotPrefillKernels(Path("mock.so"), {"variants": [lib.variant]}, lib=lib)
    _, args = prefix_batch()
    with pytest.raises(RuntimeError, match=r"launching prefill_bfloat16_d64_g4_causal failed: cudaErrorMock \(700\)"):
        kernels.launch(args, stream=0)


def test_kernel_path_selection(monkeypatch):
    from cute_kernels.toolchain import kernel_path as kp

    monkeypatch.setenv("CUTE_KERNELS_PATH", "aot")
    assert kp.kernel_path() == "aot"
    monkeypatch.setenv("CUTE_KERNELS_PATH", "auto")
    assert kp.kernel_path() == ("jit" if kp.dsl_installed() else "aot")
    monkeypatch.setenv("CUTE_KERNELS_PATH", "bogus")
    with pytest.raises(ValueError, match="CUTE_KERNELS_PATH"):
        kp.kernel_path()


# ----------------------------------------------------------------------------------------------- GPU
def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


gpu = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,head_dim,heads,kv_heads", [(torch.bfloat16, 128, 32, 8), (torch.float16, 64, 9, 3)])
def test_aot_prefill_on_a_side_stream_matches_reference_gpu(monkeypatch, dtype, head_dim, heads, kv_heads):
    from cute_kernels.reference import prefill_attention_ref
    from cute_kernels.toolchain.aot_loader import launch_prefill_aot

    x = make_batch([1, 100, 700], [0, 40, 300], heads, kv_heads, head_dim, dtype=dtype, device="cuda")
    scale = head_dim ** -0.5
    args = prepare_prefill_args(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], scale, True,
                                            x["k_cache"], x["v_cache"], x["block_tables"], x["prefix_lens"]))
    args.out.fill_(float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch_prefill_aot(args)  # must run on `side`, torch's current stream here
    side.synchronize()
    f32 = {k: (t.float() if t.is_floating_point() else t) for k, t in x.items()}
    ref = prefill_attention_ref(PrefillArgs(scale=scale, causal=True, **f32))
    assert not args.out.isnan().any() and torch.isfinite(args.lse).all()
    rel = (args.out.float() - ref).norm() / ref.norm()
    assert rel <= 1e-2, f"relative error {rel:.2e}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path", ["aot", "jit"])
def test_aot_and_jit_kernels_each_match_the_reference_gpu(path):
    """Each path against the torch reference on its own (not one cubin against itself): the AOT
    library's export and C shim, and the JIT's DLPack descriptors, can each break alone."""
    from cute_kernels.hopper.prefill.prefill_launch import _launch_prefill_jit
    from cute_kernels.toolchain.aot_loader import launch_prefill_aot
    from tests.cute_kernels.hopper.test_prefill_attention import assert_matches_reference

    if path == "jit":
        pytest.importorskip("cutlass", reason="the JIT path needs nvidia-cutlass-dsl")
    x = make_batch([5, 300, 129], [0, 33, 700], 32, 8, 128, dtype=torch.bfloat16, device="cuda")
    args = prepare_prefill_args(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.088,
                                            True, x["k_cache"], x["v_cache"], x["block_tables"], x["prefix_lens"]))
    args.out.fill_(float("nan"))
    args.lse.fill_(float("nan"))
    (launch_prefill_aot if path == "aot" else _launch_prefill_jit)(args)
    torch.cuda.synchronize()
    assert_matches_reference(x, args.out, args.lse, 0.088, True, True)
