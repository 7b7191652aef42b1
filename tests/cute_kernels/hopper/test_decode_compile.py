"""The decode kernels compile for sm_90a on the CPU and their SASS keeps the design: TMA bulk copies
of the cache blocks completed on mbarriers, the two HGMMA shapes, no CTA-wide barrier past the
first copy, no local memory, registers within the 2-CTAs-per-SM plan; and the rules fail a kernel
that lacks any of it. Every variant: `python -m cute_kernels.check --only decode`."""
from __future__ import annotations

from dataclasses import replace

import pytest

cutlass = pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")

from cute_kernels.hopper.decode.decode_checks import decode_sass_problems  # noqa: E402
from cute_kernels.hopper.decode.decode_spec import DECODE_MAX_REGISTERS, DecodeMergeSpec, DecodeSpec  # noqa: E402
from cute_kernels.toolchain.sass import SassStats, find_nvdisasm, sass_stats  # noqa: E402


@pytest.fixture(autouse=True)
def _private_tmpdir(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the DSL's cache goes under $TMPDIR


def _stats(spec):
    from cute_kernels.hopper.decode.decode_compile import compile_decode

    compiled = compile_decode(spec, keep_artifacts=True)
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    return compiled, sass_stats(compiled.artifacts["cubin"])


@pytest.fixture(scope="module")
def decode_bf16_d128():
    return _stats(DecodeSpec("bfloat16", 128))


def test_decode_sass_keeps_the_design(decode_bf16_d128):
    compiled, stats = decode_bf16_d128
    assert "cp.async.bulk.tensor.4d" in compiled.artifacts["ptx"]
    assert decode_sass_problems(DecodeSpec("bfloat16", 128), stats) == []
    assert stats.spills == 0
    assert stats.registers is not None and 0 < stats.registers <= DECODE_MAX_REGISTERS


def test_merge_kernel_compiles_without_local_memory():
    _, stats = _stats(DecodeMergeSpec("float16", 64))
    assert stats.spills == 0 and stats.registers is not None and stats.registers <= DECODE_MAX_REGISTERS


GOOD = SassStats(hgmma=12, qgmma=0, hmma=0, tma_load=16, cp_async=8, local_load=0, local_store=0, registers=147,
                 hgmma_shapes=("64x128x16.F32", "64x64x16.F32"), mbarrier_waits=4, cta_barrier_offsets=(0x6f0,),
                 first_tma_offset=0xd90)


@pytest.mark.parametrize("broken,message", [
    (dict(tma_load=0, first_tma_offset=None), "no UTMALDG"),
    (dict(mbarrier_waits=0), "no mbarrier waits"),
    (dict(hgmma_shapes=("64x64x16.F32",)), "no HGMMA ['64x128x16.F32']"),
    (dict(hmma=8), "HMMA (warp-level MMA fallback)"),
    (dict(cta_barrier_offsets=(0x6f0, 0x4000)), "CTA-wide BAR.SYNC after the first TMA"),
])
def test_rules_fail_a_kernel_off_the_design(broken, message):
    spec = DecodeSpec("bfloat16", 128)
    assert decode_sass_problems(spec, GOOD) == []
    problems = decode_sass_problems(spec, replace(GOOD, **broken))
    assert any(message in p for p in problems), problems


def test_check_fails_a_decode_variant_off_the_design_or_over_budget(monkeypatch):
    """Through `python -m cute_kernels.check`'s own path: the registered family's rules and budget."""
    from cute_kernels.hopper.decode.decode_family import DECODE
    from cute_kernels.hopper.families import FAMILIES
    from cute_kernels.toolchain import check, sass
    from cute_kernels.toolchain.compile_cache import CompiledKernel

    assert DECODE in FAMILIES
    family = replace(DECODE, compile=lambda spec, keep: CompiledKernel(None, 0.0, {"cubin": b""}), shim=None)
    monkeypatch.setattr(sass, "sass_stats", lambda cubin: replace(GOOD, tma_load=0, registers=232))
    report = check.check_variant(family, DecodeSpec("bfloat16", 128))
    assert not report.ok
    assert "no UTMALDG" in report.problems and f"232 registers > budget {DECODE_MAX_REGISTERS}" in report.problems
