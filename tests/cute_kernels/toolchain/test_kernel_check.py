"""The sm_90a compile check: kernels compile on the CPU, their SASS has what the design needs (HGMMA,
TMA, setmaxnreg, no spills, no CTA-wide barrier in a loop) and each rule fails a kernel lacking it,
they export ahead of time, the compile cache keys on the spec only, and the GPU suite passes its dry run."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from tests.paths import REPO

cutlass = pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")


@pytest.fixture(autouse=True)
def _private_tmpdir(tmp_path, monkeypatch):
    # The DSL writes a cache under $TMPDIR; keep it inside the test's temp dir.
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.fixture(scope="module")
def compiled_bf16_d128_gqa4():
    from cute_kernels.hopper.prefill.prefill_compile import compile_prefill
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec

    spec = PrefillSpec("bfloat16", 128, 4)
    return spec, compile_prefill(spec, keep_artifacts=True)


def test_prefill_sass_has_the_warp_specialized_design(compiled_bf16_d128_gqa4):
    from cute_kernels.hopper.prefill.prefill_family import PREFILL, prefill_sass_problems, required_hgmma_shapes
    from cute_kernels.toolchain.sass import find_nvdisasm, sass_stats

    spec, compiled = compiled_bf16_d128_gqa4
    assert "wgmma.mma_async" in compiled.artifacts["ptx"] and "setmaxnreg" in compiled.artifacts["ptx"]
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    stats = sass_stats(compiled.artifacts["cubin"])
    assert prefill_sass_problems(spec, stats) == []
    assert required_hgmma_shapes(spec) <= set(stats.hgmma_shapes)
    assert stats.hgmma >= 2 * (spec.head_dim // 16)  # at least one S and one PV k-loop
    assert stats.tma_load > 0 and stats.setmaxnreg >= 2  # producer lowers, MMA warpgroups raise
    # Q, K and V by TMA (two 64-column boxes each at d 128); O leaves by TMA store (two boxes)
    assert stats.tma_load == 6 and stats.tma_store == 2
    assert "%nctaid.x" in compiled.artifacts["ptx"]  # persistent: CTAs stride over the tile list by the grid
    assert stats.spills == 0 and stats.stack_bytes == 0 and stats.loop_cta_barriers == 0
    assert stats.registers == PREFILL.max_registers == 168  # 384 threads share the register file at launch
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;", compiled.artifacts["ptx"])
    assert stats.fsel <= 4 * 64, "the mask is one select per S element (64 per thread per masked tile)"
    # both main loops (masked, visible): all 64 + 2 exp2 of a step run while its PV GEMM does
    assert stats.overlapped_exp2 == stats.exp2_after_overlapped == 2 * 66


GOOD_STATS = dict(hgmma=48, qgmma=0, hmma=0, tma_load=6, cp_async=64, local_load=0, local_store=0, registers=168,
                  hgmma_shapes=("64x128x16.F32",), fsel=152, setmaxnreg=2, loop_cta_barriers=0, tma_store=2,
                  overlapped_exp2=132, exp2_after_overlapped=132)


@pytest.mark.parametrize("lacking,message", [
    (dict(tma_load=0), "no UTMALDG"),
    (dict(tma_store=0), "no UTMASTG"),
    (dict(setmaxnreg=0), "no USETMAXREG"),
    (dict(local_load=3), "local memory: 3 LDL"),
    (dict(local_store=1), "local memory: 0 LDL / 1 STL"),
    (dict(stack_bytes=32), "32-byte stack frame"),
    (dict(loop_cta_barriers=2), "2 CTA-wide BAR.SYNC inside a loop"),
    (dict(registers=176), "176 registers > budget 168"),
    (dict(hgmma_shapes=("64x64x16.F32",)), "no HGMMA"),
    (dict(hmma=4), "HMMA (warp-level MMA fallback)"),
    (dict(cp_async=0), "no cp.async"),
    (dict(overlapped_exp2=65), "65 of 132 MUFU.EX2 after a PV wgmma issue run before its wait "
                               "(the softmax does not overlap the PV GEMM)"),
    (dict(overlapped_exp2=0, exp2_after_overlapped=0),
     "no MUFU.EX2 after a PV wgmma left in flight (no softmax / PV GEMM overlap)"),
])
def test_each_prefill_rule_fails_a_kernel_lacking_it(monkeypatch, lacking, message):
    """Through the check itself: the family's rules plus the ones every family gets."""
    from cute_kernels.hopper.prefill import prefill_compile
    from cute_kernels.hopper.prefill.prefill_family import PREFILL
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import aot_build, check, sass
    from cute_kernels.toolchain.compile_cache import CompiledKernel

    monkeypatch.setattr(prefill_compile, "compile_prefill",
                        lambda spec, keep_artifacts=False: CompiledKernel(None, 0.1, {"cubin": b"", "ptx": ""}))
    monkeypatch.setattr(aot_build, "link_one", lambda *args: (1024, 2048))
    spec, good = PrefillSpec("bfloat16", 128, 4), sass.SassStats(**GOOD_STATS)
    monkeypatch.setattr(sass, "sass_stats", lambda cubin: good)
    assert check.check_variant(PREFILL, spec).ok
    monkeypatch.setattr(sass, "sass_stats", lambda cubin: dataclasses.replace(good, **lacking))
    report = check.check_variant(PREFILL, spec)
    assert not report.ok and message in report.problems, report.problems


def test_d64_tile_is_held_to_its_own_launch_share(monkeypatch):
    """192x128 at d 64 runs 512 threads: 128 registers each at launch, below the family's 168."""
    from cute_kernels.hopper.prefill.prefill_family import prefill_sass_problems
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain.sass import SassStats

    spec = PrefillSpec("bfloat16", 64, 3)
    assert (spec.tile.tile_m, spec.tile.num_threads, spec.tile.launch_registers) == (192, 512, 128)
    assert PrefillSpec("bfloat16", 64, 3, causal=False).tile.tile_m == 128  # spilled at 192 rows
    stats = SassStats(**{**GOOD_STATS, "registers": 136, "hgmma_shapes": ("64x128x16.F32", "64x64x16.F32")})
    assert prefill_sass_problems(spec, stats) == ["136 registers at launch > 128 (512 threads share the register file)"]


LOOP_SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_3:
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT ;
        /*0030*/                   {barrier} ;
        /*0040*/               @P0 BRA `(.L_x_3) ;
        /*0050*/               @P1 BRA `(.L_x_4) ;
.L_x_4:
        /*0060*/                   {after} ;
        /*0070*/                   EXIT ;
"""


@pytest.mark.parametrize("barrier,after,expected", [
    ("BAR.SYNC.DEFER_BLOCKING 0x0", "NOP", 1),  # CTA-wide barrier between the loop head and its back branch
    ("BAR.SYNC 0x0", "NOP", 1),
    ("BAR.SYNC.DEFER_BLOCKING 0x1, 0x80", "NOP", 0),  # a named barrier is fine
    ("NOP", "BAR.SYNC.DEFER_BLOCKING 0x0", 0),  # after the loop (a forward branch is no loop)
])
def test_loop_barrier_detector(barrier, after, expected):
    from cute_kernels.toolchain.sass import stats_from_sass

    stats = stats_from_sass(LOOP_SASS.format(barrier=barrier, after=after))
    assert stats.loop_cta_barriers == expected and stats.hgmma == 1


OVERLAP_SASS = """
        /*0000*/                   WARPGROUP.ARRIVE ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT, gsb0 ;
        /*0020*/                   WARPGROUP.ARRIVE ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR20].tnspB, R88, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0050*/                   MUFU.EX2 R24, R24 ;
        /*0060*/                   {middle} ;
        /*0070*/                   MUFU.EX2 R26, R26 ;
        /*0080*/                   WARPGROUP.ARRIVE ;
        /*0090*/                   HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR20].tnspB, R88, gsb0 ;
        /*00a0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00b0*/                   MUFU.EX2 R30, R30 ;
"""


@pytest.mark.parametrize("middle,expected", [
    ("NOP", (2, 2)),  # the PV wait comes after the exp2 (the tail's PV, waited for at once, is not counted)
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", (1, 2)),  # the wait hoisted between them
])
def test_pv_overlap_detector(middle, expected):
    from cute_kernels.toolchain.sass import stats_from_sass

    stats = stats_from_sass(OVERLAP_SASS.format(middle=middle))
    assert (stats.overlapped_exp2, stats.exp2_after_overlapped) == expected


def test_compile_cache_compiles_each_spec_once():
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain.compile_cache import CompileCache, CompiledKernel

    calls = []
    cache = CompileCache(lambda spec: calls.append(spec) or CompiledKernel(object(), 0.0))
    a, a_again, b = PrefillSpec("bfloat16", 128, 4), PrefillSpec("bfloat16", 128, 4), PrefillSpec("bfloat16", 128, 8)
    assert cache.get(a) is cache.get(a_again)
    cache.get(b)
    assert calls == [a, b] and cache.compiles == 2 and len(cache) == 2


@pytest.mark.slow
def test_real_compile_cache_reuses_the_kernel():
    from cute_kernels.hopper.prefill.prefill_compile import compile_prefill
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain.compile_cache import CompileCache

    cache = CompileCache(compile_prefill)
    first = cache.get(PrefillSpec("float16", 64, 1))
    assert cache.get(PrefillSpec("float16", 64, 1)) is first and cache.compiles == 1


def test_check_reports_and_fails_on_a_broken_variant(monkeypatch, capsys):
    from cute_kernels.hopper.families import selected_variants
    from cute_kernels.hopper.prefill import prefill_compile
    from cute_kernels.toolchain import check

    def broken(spec, keep_artifacts=False):
        raise RuntimeError("boom")

    monkeypatch.setattr(prefill_compile, "compile_prefill", broken)
    assert check.main(["--only", "bfloat16_d64_g1_causal"], selected_variants) == 1
    assert "FAIL: compile failed: RuntimeError: boom" in capsys.readouterr().out


def test_check_flags_missing_hgmma(monkeypatch):
    from cute_kernels.hopper.prefill import prefill_compile
    from cute_kernels.hopper.prefill.prefill_family import PREFILL
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import check, sass
    from cute_kernels.toolchain.compile_cache import CompiledKernel

    monkeypatch.setattr(prefill_compile, "compile_prefill",
                        lambda spec, keep_artifacts=False: CompiledKernel(None, 0.1, {"cubin": b"", "ptx": ""}))
    monkeypatch.setattr(sass, "sass_stats", lambda cubin: sass.SassStats(0, 0, 16, 0, 8, 0, 0, 128, ("16x8x16",)))
    report = check.check_variant(PREFILL, PrefillSpec("bfloat16", 64, 1))
    assert not report.ok and "no HGMMA" in report.problems and "HMMA" in report.problems
    assert "no UTMALDG" in report.problems and "no USETMAXREG" in report.problems


def test_check_cli_one_variant():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "cute_kernels.check", "--only", "bfloat16_d64_g1_causal"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "prefill_bfloat16_d64_g1_causal" in out.stdout and " ok" in out.stdout
    assert re.search(r" (so|o):\d+K  ok", out.stdout), "the aot column: the variant exports (and links)"


def test_check_fails_a_variant_that_does_not_export(monkeypatch):
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import aot_build, check

    def broken(family, spec, compiled, work):
        raise RuntimeError("Failed to dump object file with PIC relocation")

    monkeypatch.setattr(aot_build, "link_one", broken)
    from cute_kernels.hopper.prefill.prefill_family import PREFILL

    report = check.check_variant(PREFILL, PrefillSpec("bfloat16", 64, 1))
    assert report.aot == "FAIL" and "aot export failed: RuntimeError: Failed to dump" in report.problems


def _gpu_suite(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "profiling" / "gpu" / "gpu_suite.sh"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_gpu_suite_dry_run():
    """The CPU rehearsal of the one GPU command: the GPU image's imports, every smoke check, bench case and
    GPU test collected, the carried AOT build (fresh, or how to build it), the size of what travels."""
    out = _gpu_suite("--dry-run")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "bash syntax ok" in out.stdout and "gpu image: 0 problems" in out.stdout
    for family in ("decode", "fused", "fp8", "prefill"):
        assert re.search(rf"smoke +profiling/gpu/gpu_smoke.py --family {family} +3 checks", out.stdout), family
    assert re.search(r"bench +profiling/gpu/bench_kernels.py prefill +\d+ cases", out.stdout)
    assert re.search(r"tests +tests/runtime/accel/test_engine_gpu.py +[1-9]\d* gpu tests collect", out.stdout)
    assert re.search(r"size +travels +ok [\d.]+ MiB of 64 MiB", out.stdout)
    carry = next(line for line in out.stdout.splitlines() if line.startswith("carry"))
    assert "fresh, built from this tree" in carry or ("NOT READY" in carry and "--prepare" in carry), carry
    assert 'GPU command: run(command="bash profiling/gpu/gpu_suite.sh", carry=["build/aot"]' in out.stdout
    helped = _gpu_suite("--help")
    assert helped.returncode == 0 and 'run(command="bash profiling/gpu/gpu_suite.sh"' in helped.stdout


def test_gpu_suite_dry_run_calls_a_stale_build_not_ready(tmp_path):
    """An AOT folder built from another tree (one recorded source hash differs) is NOT READY, with the fix."""
    from cute_kernels.hopper.families import FAMILIES, selected_variants
    from cute_kernels.toolchain.aot_manifest import ABI_VERSION, kernel_source_hash, kernel_sources

    names = {spec.name: {} for family, spec in selected_variants(include_unused=True) if family.shim}
    sources = kernel_sources(FAMILIES)
    (tmp_path / "manifest.json").write_text(json.dumps({"abi": ABI_VERSION, "sources": list(sources),
                                                        "source_hash": kernel_source_hash(sources),
                                                        "variants": names, "libraries": []}))
    loads = "cute_kernels/hopper/prefill/prefill_loads.py"
    (tmp_path / "suite_tree.json").write_text(json.dumps({"files": {loads: "0" * 20}}))
    out = subprocess.run([sys.executable, str(REPO / "profiling" / "gpu" / "gpu_suite_prep.py"), "check-aot", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "stale: built from another tree" in out.stdout, out.stdout + out.stderr
    assert loads in out.stdout and "--prepare" in out.stdout


def test_gpu_suite_fails_on_a_device_that_is_not_sm90(tmp_path):
    """A non-Hopper GPU would skip every GPU test: the suite must fail instead of reporting success."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "class cuda:\n"
        "    is_available = staticmethod(lambda: True)\n"
        "    get_device_capability = staticmethod(lambda *a: (8, 0))\n"
        "    get_device_name = staticmethod(lambda *a: 'NVIDIA A100-SXM4-80GB')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OUT": str(tmp_path / "out")}
    out = subprocess.run(["bash", str(REPO / "profiling" / "gpu" / "gpu_suite.sh")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "sm_80" in out.stderr and "need sm_90" in out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("name,peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                       ("NVIDIA H100 NVL", 835.0), ("NVIDIA H200", 989.0), ("NVIDIA A100", None)])
def test_bench_peak_table_reads_the_device_name(name, peak):
    from profiling.gpu.gpu_peaks import peak_tflops

    assert peak_tflops(name) == peak


def test_bench_prefill_counts_only_visible_scores():
    from profiling.gpu.bench_prefill import PREFILL_CASES, PrefillCase

    full, causal = PrefillCase(1024, 128, False), PrefillCase(1024, 128, True)
    assert causal.flops() == pytest.approx(full.flops() * (1024 + 1) / 2 / 1024)
    paged = PrefillCase(1024, 128, True, prefix=1024)  # every query sees the whole prefix
    assert paged.flops() == pytest.approx(causal.flops() + full.flops())
    names = [c.name for c in PREFILL_CASES]
    assert len(set(names)) == len(names) and any("paged" in n for n in names)
    assert {c.head_dim for c in PREFILL_CASES} == {64, 128} and {c.causal for c in PREFILL_CASES} == {True, False}
    assert min(c.seqlen for c in PREFILL_CASES) == 512 and max(c.seqlen for c in PREFILL_CASES) == 16384


def test_check_fails_local_memory_a_stack_frame_and_registers_over_budget(monkeypatch):
    import dataclasses

    from cute_kernels.hopper.prefill import prefill_compile
    from cute_kernels.hopper.prefill.prefill_family import PREFILL
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import aot_build, check, sass
    from cute_kernels.toolchain.compile_cache import CompiledKernel

    monkeypatch.setattr(prefill_compile, "compile_prefill",
                        lambda spec, keep_artifacts=False: CompiledKernel(None, 0.1, {"cubin": b"", "ptx": ""}))
    monkeypatch.setattr(aot_build, "link_one", lambda *args: (1024, 2048))
    fast_path = ("64x128x16.F32", "64x64x16.F32")
    clean = sass.SassStats(24, 0, 0, 4, 8, 0, 0, 120, fast_path, setmaxnreg=2, tma_store=1,  # d 64: 128 at launch
                           overlapped_exp2=132, exp2_after_overlapped=132)
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


def test_register_pool_and_barrier_inventory_of_a_real_variant(compiled_bf16_d128_gqa4):
    """REGCOUNT and REQNTID per kernel from .nv.info (past its 4-byte no-value records), USETMAXREG and
    BAR from the SASS: the d128 split uses the whole pool, every barrier is one declared role."""
    from cute_kernels.hopper.prefill.prefill_family import PREFILL
    from cute_kernels.toolchain import check
    from cute_kernels.toolchain.sass import cubin_launch_info, find_nvdisasm, sass_stats

    spec, compiled = compiled_bf16_d128_gqa4
    cubin = compiled.artifacts["cubin"]
    assert list(cubin_launch_info(cubin).values()) == [(168, 384)]
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    problems, pools, rows = check.resource_report(PREFILL, spec, sass_stats(cubin), cubin)
    assert problems == []
    assert pools[0]["needed"] == pools[0]["available"] == 40 * 128 + 232 * 256 == 168 * 384  # no slack
    assert {(r["id"], r["role"], r["threads"]) for r in rows} == {
        (0, "cta", "all"), (1, "producer", 128), (2, "scheduler", 256), ("reg", "scheduler", 256),
        (5, "epilogue", 256)}


def test_kernel_families_import_without_the_dsl():
    code = ("import sys; sys.modules['cutlass'] = None\n"
            "from cute_kernels.hopper.families import FAMILIES, selected_variants\n"
            "from cute_kernels.toolchain.aot_manifest import kernel_source_hash, kernel_sources\n"
            "assert selected_variants() and kernel_source_hash(kernel_sources(FAMILIES))\n"
            "print(sorted(f.name for f in FAMILIES))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "prefill" in out.stdout
