"""The compile check fails a kernel whose SASS holds a warp-collective election ptxas could not prove
converged (WARPSYNC.COLLECTIVE: the prefill kernel's lane-0 TMA loads compiled to 12 of them, and hung);
today's kernels hold none."""
import pytest

from cute_kernels.toolchain.check import common_problems
from cute_kernels.toolchain.sass import find_nvdisasm, sass_stats, stats_from_sass

# The Q load of the prefill kernel as it was (`if ptid == 0:` around the TMA copy), from nvdisasm.
LANE_ZERO_LOAD = """
        /*0dd0*/                   SYNCS.ARRIVE.TRANS64 RZ, [UR9], R4 ;
        /*0de0*/                   BRA.DIV UR8, `(.L_x_8) ;
        /*0df0*/                   ELECT P0, URZ, PT ;
        /*0e70*/                   UTMALDG.4D [UR8], [UR16], desc[URZ] ;
.L_x_8:
        /*12860*/                   BSSY B1, `(.L_x_165) ;
        /*12880*/                   WARPSYNC.COLLECTIVE R4, `(.L_x_166) ;
        /*12890*/                   ELECT P0, UR62, PT ;
        /*128b0*/                   ENDCOLLECTIVE ;
"""


class _Family:
    max_registers = 255


def test_a_collective_fallback_fails_the_check():
    problems = common_problems(_Family(), stats_from_sass(LANE_ZERO_LOAD))
    assert any("WARPSYNC.COLLECTIVE" in p for p in problems), problems


@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
def test_the_prefill_kernel_has_no_collective_fallback(tmp_path, monkeypatch):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the DSL's cache
    from cute_kernels.hopper.prefill.prefill_compile import compile_prefill
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec

    stats = sass_stats(compile_prefill(PrefillSpec("bfloat16", 64, 3), keep_artifacts=True).artifacts["cubin"])
    assert stats.tma_load > 0 and stats.collective_fallbacks == 0
