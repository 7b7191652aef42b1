"""The sm_90a compile check: kernels compile on the CPU, their SASS keeps the HGMMA fast path, they
export ahead of time, the compile cache keys on the spec only, and the GPU suite passes its dry run."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
cutlass = pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")


@pytest.fixture(autouse=True)
def _private_tmpdir(tmp_path, monkeypatch):
    # The DSL writes a cache under $TMPDIR; keep it inside the test's temp dir.
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.fixture(scope="module")
def compiled_bf16_d128_gqa4():
    from cute_kernels.hopper.prefill_compile import compile_prefill
    from cute_kernels.hopper.prefill_spec import PrefillSpec

    spec = PrefillSpec("bfloat16", 128, 4)
    return spec, compile_prefill(spec, keep_artifacts=True)


def test_prefill_compiles_to_hgmma_with_cp_async(compiled_bf16_d128_gqa4):
    from cute_kernels.hopper.prefill_family import required_hgmma_shapes
    from cute_kernels.toolchain.sass import find_nvdisasm, sass_stats

    spec, compiled = compiled_bf16_d128_gqa4
    assert "wgmma.mma_async" in compiled.artifacts["ptx"]
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    stats = sass_stats(compiled.artifacts["cubin"])
    assert required_hgmma_shapes(spec) <= set(stats.hgmma_shapes)
    assert stats.hgmma >= 2 * (spec.head_dim // 16)  # at least one S and one PV k-loop
    assert stats.hmma == 0, "warp-level MMA: the kernel fell off the wgmma path"
    assert stats.cp_async > 0
    assert stats.spills == 0
    assert stats.registers is not None and 0 < stats.registers <= 255


def test_compile_cache_compiles_each_spec_once():
    from cute_kernels.toolchain.compile_cache import CompileCache, CompiledKernel
    from cute_kernels.hopper.prefill_spec import PrefillSpec

    calls = []
    cache = CompileCache(lambda spec: calls.append(spec) or CompiledKernel(object(), 0.0))
    a, a_again, b = PrefillSpec("bfloat16", 128, 4), PrefillSpec("bfloat16", 128, 4), PrefillSpec("bfloat16", 128, 8)
    assert cache.get(a) is cache.get(a_again)
    cache.get(b)
    assert calls == [a, b] and cache.compiles == 2 and len(cache) == 2


@pytest.mark.slow
def test_real_compile_cache_reuses_the_kernel():
    from cute_kernels.toolchain.compile_cache import CompileCache
    from cute_kernels.hopper.prefill_compile import compile_prefill
    from cute_kernels.hopper.prefill_spec import PrefillSpec

    cache = CompileCache(compile_prefill)
    first = cache.get(PrefillSpec("float16", 64, 1))
    assert cache.get(PrefillSpec("float16", 64, 1)) is first and cache.compiles == 1


def test_check_reports_and_fails_on_a_broken_variant(monkeypatch, capsys):
    from cute_kernels.hopper import prefill_compile
    from cute_kernels.toolchain import check

    def broken(spec, keep_artifacts=False):
        raise RuntimeError("boom")

    monkeypatch.setattr(prefill_compile, "compile_prefill", broken)
    assert check.main(["--only", "bfloat16_d64_g1_causal"]) == 1
    assert "FAIL: compile failed: RuntimeError: boom" in capsys.readouterr().out


def test_check_flags_missing_hgmma(monkeypatch):
    from cute_kernels.hopper import prefill_compile
    from cute_kernels.toolchain import check, sass
    from cute_kernels.toolchain.compile_cache import CompiledKernel
    from cute_kernels.hopper.prefill_family import PREFILL
    from cute_kernels.hopper.prefill_spec import PrefillSpec

    monkeypatch.setattr(prefill_compile, "compile_prefill",
                        lambda spec, keep_artifacts=False: CompiledKernel(None, 0.1, {"cubin": b"", "ptx": ""}))
    monkeypatch.setattr(sass, "sass_stats", lambda cubin: sass.SassStats(0, 0, 16, 0, 8, 0, 0, 128, ("16x8x16",)))
    report = check.check_variant(PREFILL, PrefillSpec("bfloat16", 64, 1))
    assert not report.ok and "no HGMMA" in report.problems and "HMMA" in report.problems


def test_check_cli_one_variant():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "cute_kernels.toolchain.check", "--only", "bfloat16_d64_g1_causal"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "prefill_bfloat16_d64_g1_causal" in out.stdout and " ok" in out.stdout
    assert re.search(r" (so|o):\d+K  ok", out.stdout), "the aot column: the variant exports (and links)"


def test_check_fails_a_variant_that_does_not_export(monkeypatch):
    from cute_kernels.toolchain import aot_build, check
    from cute_kernels.hopper.prefill_spec import PrefillSpec

    def broken(family, spec, compiled, work):
        raise RuntimeError("Failed to dump object file with PIC relocation")

    monkeypatch.setattr(aot_build, "link_one", broken)
    from cute_kernels.hopper.prefill_family import PREFILL

    report = check.check_variant(PREFILL, PrefillSpec("bfloat16", 64, 1))
    assert report.aot == "FAIL" and "aot export failed: RuntimeError: Failed to dump" in report.problems


def test_gpu_suite_dry_run():
    out = subprocess.run(["bash", str(REPO / "profiling" / "gpu_suite.sh"), "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "prefill" in out.stdout
    assert "opens here (1 variants)" in out.stdout, "the dry run builds one AOT variant and opens its library"


def test_check_fails_local_memory_a_stack_frame_and_registers_over_budget(monkeypatch):
    import dataclasses

    from cute_kernels.hopper import prefill_compile
    from cute_kernels.hopper.prefill_family import PREFILL
    from cute_kernels.hopper.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import aot_build, check, sass
    from cute_kernels.toolchain.compile_cache import CompiledKernel

    monkeypatch.setattr(prefill_compile, "compile_prefill",
                        lambda spec, keep_artifacts=False: CompiledKernel(None, 0.1, {"cubin": b"", "ptx": ""}))
    monkeypatch.setattr(aot_build, "link_one", lambda *args: (1024, 2048))
    fast_path = ("64x128x16.F32", "64x64x16.F32")
    clean = sass.SassStats(24, 0, 0, 0, 8, 0, 0, 200, fast_path)
    monkeypatch.setattr(sass, "sass_stats", lambda cubin: clean)
    spec, family = PrefillSpec("bfloat16", 64, 1), dataclasses.replace(PREFILL, max_registers=240)
    assert check.check_variant(family, spec).ok  # the same stats minus the faults below pass
    dirty = dataclasses.replace(clean, local_load=2, local_store=3, registers=250, stack_bytes=16)
    monkeypatch.setattr(sass, "sass_stats", lambda cubin: dirty)
    problems = check.check_variant(family, spec).problems
    assert "local memory: 2 LDL / 3 STL" in problems and "16-byte stack frame" in problems
    assert "250 registers > budget 240" in problems


def test_stack_frame_is_read_from_the_cubin(compiled_bf16_d128_gqa4):
    import struct

    from cute_kernels.toolchain.sass import _elf_sections, cubin_stack_bytes

    cubin = compiled_bf16_d128_gqa4[1].artifacts["cubin"]
    assert cubin_stack_bytes(cubin) == 0
    # Patch the first EIATTR_FRAME_SIZE record's value: the reader must see it.
    off, size = _elf_sections(cubin)[".nv.info"]
    record = cubin.index(bytes([4, 0x11, 8, 0]), off, off + size)
    patched = bytearray(cubin)
    struct.pack_into("<I", patched, record + 8, 48)
    assert cubin_stack_bytes(bytes(patched)) == 48


def test_kernel_families_import_without_the_dsl():
    code = ("import sys; sys.modules['cutlass'] = None\n"
            "from cute_kernels.hopper.families import FAMILIES, selected_variants\n"
            "from cute_kernels.toolchain.aot_manifest import kernel_source_hash\n"
            "assert selected_variants() and kernel_source_hash()\n"
            "print(sorted(f.name for f in FAMILIES))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "prefill" in out.stdout
