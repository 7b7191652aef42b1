"""The FP8 GEMM compiles for sm_90a on the CPU for every variant the runtime picks, and its SASS has
what the design needs (QGMMA, UTMALDG, UTMASTG, USETMAXREG, no local memory); the rules themselves
fail on stats that lack any of it."""
from __future__ import annotations

import dataclasses

import pytest

from cute_kernels.hopper.fp8_gemm.fp8_gemm_check import fp8_gemm_sass_problems, required_qgmma_shape
from cute_kernels.hopper.fp8_gemm.fp8_gemm_spec import (
    Fp8GemmSpec,
    Fp8QuantRowsSpec,
    runtime_variants,
    selected_specs,
    spec_for,
)
from cute_kernels.toolchain.sass import SassStats

GOOD = SassStats(hgmma=0, qgmma=4, hmma=0, tma_load=14, cp_async=0, local_load=0, local_store=0, registers=168,
                 hgmma_shapes=("64x128x32.F32",), tma_store=4, setmaxnreg=2, mbarrier_waits=41,
                 cta_barrier_offsets=(896,), first_tma_offset=2272)
SPEC = Fp8GemmSpec("rowwise", 128, 128)


def test_rules_pass_a_kernel_with_everything():
    assert fp8_gemm_sass_problems(SPEC, GOOD) == []


@pytest.mark.parametrize("broken, expected", [
    ({"qgmma": 0, "hgmma_shapes": ()}, "no QGMMA"),
    ({"hgmma_shapes": ("64x64x32.F32",)}, "no QGMMA.64x128x32.F32"),
    ({"hgmma": 8, "hgmma_shapes": ("64x128x32.F32", "64x128x16.F32")}, "widened"),
    ({"tma_load": 0}, "no UTMALDG"),
    ({"tma_store": 0}, "no UTMASTG"),
    ({"setmaxnreg": 0}, "no USETMAXREG"),
    ({"mbarrier_waits": 0}, "no mbarrier waits"),
    ({"cta_barrier_offsets": (896, 4096)}, "BAR.SYNC after the first TMA"),
])
def test_rules_fail_a_kernel_lacking_any_of_it(broken, expected):
    problems = fp8_gemm_sass_problems(SPEC, dataclasses.replace(GOOD, **broken))
    assert any(expected in p for p in problems), problems


def test_variant_choice_by_rows():
    assert spec_for("rowwise", 1) == Fp8GemmSpec("rowwise", 64, 64)
    assert spec_for("block128", 64) == Fp8GemmSpec("block128", 64, 64)
    assert spec_for("block128", 65) == Fp8GemmSpec("block128", 128, 128)
    assert len({s.name for s in runtime_variants()}) == 6  # 4 plain + 2 split-K (64x64, each scale mode)
    assert not any(s.split_k for s in selected_specs(True))  # split-K variants are their own family
    assert Fp8GemmSpec("rowwise", 64, 64, split_k=True).name == "fp8_gemm_splitk_rowwise_64x64"
    assert all(s.name.startswith("fp8_gemm") for s in selected_specs(True))
    assert Fp8QuantRowsSpec().name.startswith("fp8_quant")
    with pytest.raises(ValueError):
        Fp8GemmSpec("per_tensor", 128, 128)


# One variant per tile config, each scale mode once; `python -m cute_kernels.check` compiles them all.
@pytest.mark.parametrize("spec", [Fp8GemmSpec("rowwise", 64, 64), Fp8GemmSpec("block128", 128, 128),
                                  Fp8GemmSpec("block128", 64, 64, split_k=True)], ids=lambda s: s.name)
def test_runtime_variants_compile_to_qgmma(spec, tmp_path, monkeypatch):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the DSL's cache stays in the test's temp dir
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_compile import compile_fp8_gemm
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_layouts import num_ab_stages
    from cute_kernels.toolchain.sass import find_nvdisasm, sass_stats

    compiled = compile_fp8_gemm(spec, keep_artifacts=True)
    ptx = compiled.artifacts["ptx"]
    assert "e4m3.e4m3" in ptx and "setmaxnreg" in ptx and "cp.async.bulk.tensor" in ptx
    assert num_ab_stages(spec) >= 4
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    stats = sass_stats(compiled.artifacts["cubin"])
    assert fp8_gemm_sass_problems(spec, stats) == []
    assert required_qgmma_shape(spec) in stats.hgmma_shapes
    assert stats.spills == 0, "local-memory traffic"
    assert stats.registers is not None and stats.registers <= 255


def test_quant_rows_kernel_compiles_to_vector_loads(tmp_path, monkeypatch):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_compile import compile_fp8_gemm
    from cute_kernels.toolchain.sass import disassemble, find_nvdisasm, sass_stats

    compiled = compile_fp8_gemm(Fp8QuantRowsSpec(), keep_artifacts=True)
    assert "cvt.rn.satfinite.e4m3x2.f32" in compiled.artifacts["ptx"]  # saturating, never NaN
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    stats = sass_stats(compiled.artifacts["cubin"])
    assert fp8_gemm_sass_problems(Fp8QuantRowsSpec(), stats) == [] and stats.spills == 0
    assert "LDG.E.128" in disassemble(compiled.artifacts["cubin"])  # 16-byte loads of bf16 rows
    assert fp8_gemm_sass_problems(Fp8QuantRowsSpec(), dataclasses.replace(stats, hmma=2))
