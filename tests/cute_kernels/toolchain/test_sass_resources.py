"""The setmaxnreg register-pool identity and the named-barrier inventory (toolchain/resource_checks.py):
each rule passes the SASS of a kernel that keeps it and fails the same SASS with its bug put back,
first on synthetic SASS (fast), then end to end on two real prefill compiles through the check."""
from __future__ import annotations

import dataclasses

import pytest

from cute_kernels.toolchain.resource_checks import inventory_rows, kernel_problems
from cute_kernels.toolchain.sass_resources import BarrierRole, RegisterSplit, read_kernels

# The forms nvdisasm prints for prefill_bfloat16_d128 (1 producer + 2 MMA warpgroups, 384 threads).
GOOD = """
\t.section\t.text.kern,"ax",@progbits
        /*0330*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0370*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;
        /*4a10*/                   BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 ;
        /*8490*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;
        /*8510*/              @!P0 BAR.ARV 0x2, 0x100 ;
        /*bf20*/                   BAR.SYNC.DEFER_BLOCKING R187, 0x100 ;
        /*c4f0*/                   BAR.ARV R186, 0x100 ;
        /*117b0*/                   DEPBAR.LE SB0, 0x0 ;
        /*117c0*/                   MEMBAR.ALL.CTA ;
        /*117d0*/                   BAR.SYNC.DEFER_BLOCKING 0x5, 0x100 ;
\t.section\t.nv.shared.kern,"aw",@nobits
"""
SPLIT = RegisterSplit(producer_warpgroups=1, consumer_warpgroups=2, producer_registers=40, consumer_registers=232)
ROLES = (BarrierRole("producer", (1,), 128), BarrierRole("scheduler", (2, 3), 256, computed=True),
         BarrierRole("epilogue", (5,), 256))


def problems(text=GOOD, split=SPLIT, roles=ROLES, regs=168, threads=384) -> list[str]:
    (kernel,) = read_kernels(text, {"kern": (regs, threads)})
    return kernel_problems(kernel, split, roles)


def test_a_kernel_that_keeps_both_rules_passes():
    assert problems() == []
    (kernel,) = read_kernels(GOOD, {"kern": (168, 384)})
    assert (kernel.dealloc, kernel.alloc, len(kernel.barriers)) == ((40,), (232,), 6)
    rows = {(r["id"], r["role"], r["threads"]) for r in inventory_rows(kernel, ROLES)}
    assert rows == {(0, "cta", "all"), (1, "producer", 128), (2, "scheduler", 256), ("reg", "scheduler", 256),
                    (5, "epilogue", 256)}


@pytest.mark.parametrize("bug,kwargs,message", [
    # the consumers ask 240: 40 x 128 + 240 x 256 = 66560 > 168 x 384 = 64512, setmaxnreg.inc never returns
    (("UP0, 0xe8", "UP0, 0xf0"), dict(split=dataclasses.replace(SPLIT, consumer_registers=240)),
     "setmaxnreg pool overflow: 40x128x1 + 240x128x2 = 66560 > 168x384 = 64512"),
    (None, dict(regs=160), "setmaxnreg pool overflow: 40x128x1 + 232x128x2 = 64512 > 160x384 = 61440"),
    (None, dict(split=dataclasses.replace(SPLIT, consumer_warpgroups=3), threads=512),
     "setmaxnreg pool overflow: 40x128x1 + 232x128x3 = 94208 > 168x512 = 86016"),
    (("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", "NOP"), {}, "USETMAXREG without ALLOC"),
    (("USETMAXREG.DEALLOC.CTAPOOL 0x28", "NOP"), {}, "USETMAXREG without DEALLOC"),
    (("BAR.SYNC.DEFER_BLOCKING 0x0 ;", "USETMAXREG.DEALLOC.CTAPOOL 0x20 ;"), {},
     "2 distinct USETMAXREG.DEALLOC values [32, 40]"),
    (("UP0, 0xe8", "UP0, 0xe0"), {}, "USETMAXREG.ALLOC 224 but the kernel's plan says 232"),
    (None, dict(split=None), "USETMAXREG in a kernel whose family declares no RegisterSplit"),
    (None, dict(threads=512), "the setmaxnreg roles cover 384 threads, the kernel launches 512"),
    (None, dict(regs=None), "entry register count (REGCOUNT) not read"),
    (("UP0, 0xe8", "UP0, 0x98"), dict(split=dataclasses.replace(SPLIT, consumer_registers=152)),
     "USETMAXREG.ALLOC 152 below the entry count 168"),
    (("USETMAXREG.DEALLOC.CTAPOOL 0x28", "USETMAXREG.DEALLOC.CTAPOOL R4"), {}, "unparsed"),
])
def test_each_register_pool_rule_fails_its_bug(bug, kwargs, message):
    text = GOOD.replace(*bug) if bug else GOOD
    assert bug is None or text != GOOD
    found = problems(text, **kwargs)
    assert any(message in p for p in found), found


@pytest.mark.parametrize("line,expected", [
    ("BAR.SYNC.DEFER_BLOCKING 0x0 ;", ("SYNC", 0, None)),
    ("BAR.SYNC 0x3, 0x100 ;", ("SYNC", 3, 256)),
    ("@!P0 BAR.ARV 0x2, 0x100 ;", ("ARV", 2, 256)),
    ("BAR.ARV R192, 0x100 ;", ("ARV", "R192", 256)),
    ("BAR.RED.POPC.DEFER_BLOCKING 0x0, P0 ;", ("RED", 0, None)),
    ("BAR.RED.AND.DEFER_BLOCKING 0x4, 0x40, !P1 ;", ("RED", 4, 64)),
    ("BAR.SYNC.DEFER_BLOCKING UR5, R3 ;", ("SYNC", "UR5", "R3")),
])
def test_the_reader_knows_the_barrier_forms(line, expected):
    (kernel,) = read_kernels(f"        /*0040*/                   {line}\n")
    assert [(u.op, u.barrier, u.threads) for u in kernel.barriers] == [expected] and kernel.unparsed == ()


def test_a_declared_split_without_usetmaxreg_fails():
    text = "\n".join(line for line in GOOD.splitlines() if "USETMAXREG" not in line)
    assert problems(text) == ["the family declares a setmaxnreg split but the SASS has no USETMAXREG"]
    assert problems(text, split=None) == []


@pytest.mark.parametrize("bug,roles,message", [
    # the epilogue moved onto the producer's id: one id, two counts (and the epilogue role unused)
    (("0x5, 0x100", "0x1, 0x100"), ROLES, "barrier id 1 used with 2 thread counts [128, 256]"),
    (("0x5, 0x100", "0x1, 0x100"), ROLES, "declared barrier role epilogue (ids [5], 256 threads) is not in the SASS"),
    (("0x5, 0x100", "0x5, 0x80"), ROLES, "BAR.SYNC 5 at 0x117d0 with 128 threads: role epilogue declares 256"),
    (("0x5, 0x100", "0x6, 0x100"), ROLES, "BAR.SYNC 6 at 0x117d0 with 256 threads: no declared barrier role matches"),
    (("BAR.SYNC.DEFER_BLOCKING 0x0 ;", "BAR.SYNC.DEFER_BLOCKING 0x0, 0x80 ;"), ROLES,
     "BAR.SYNC 0 at 0x330 with 128 threads: id 0 is the CTA-wide barrier only"),
    (("R186, 0x100", "R186, 0x80"), ROLES, "BAR.ARV R186 at 0xc4f0 with 128 threads: no declared barrier role matches"),
    (("R186, 0x100", "R186, R3"), ROLES, "thread count in a register (R3)"),
    (None, ROLES[:2] + (BarrierRole("epilogue", (3, 5), 256),), "barrier id 3 declared for two roles: scheduler and epilogue"),
    (None, ROLES + (BarrierRole("cta", (0,), 384),), "role cta: id 0 outside 1..15"),
    (None, ROLES + (BarrierRole("spare", (7,), 64),), "declared barrier role spare"),
    (None, ROLES + (BarrierRole("odd", (9,), 100),), "100 threads is not whole warps"),
    (("0x5, 0x100", "[R2], 0x100"), ROLES, "unparsed"),
])
def test_each_barrier_rule_fails_its_bug(bug, roles, message):
    text = GOOD.replace(*bug) if bug else GOOD
    assert bug is None or text != GOOD
    found = problems(text, roles=roles)
    assert any(message in p for p in found), found


def test_a_cta_wide_barrier_may_name_every_thread():
    assert problems(GOOD.replace("BLOCKING 0x0 ;", "BLOCKING 0x0, 0x180 ;")) == []  # 0x180: the CTA's 384 threads
    assert problems(GOOD.replace("0x1, 0x80", "0x1")) != []  # no count = the whole CTA: not the producer's 128


def test_the_check_fails_a_variant_through_its_own_path(monkeypatch):
    """check_variant runs the rules on the stats sass_stats reads; stats without kernels fail a real cubin."""
    from cute_kernels.hopper.prefill.prefill_family import PREFILL
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import check, sass
    from cute_kernels.toolchain.compile_cache import CompiledKernel

    family = dataclasses.replace(PREFILL, compile=lambda spec, keep: CompiledKernel(None, 0.1, {"cubin": b"\x7fELF"}),
                                 shim=None, sass_problems=lambda spec, stats: [],
                                 register_split=lambda spec: SPLIT, barriers=lambda spec: ROLES)
    spec = PrefillSpec("bfloat16", 128, 4)
    for text, ok in ((GOOD, True), (GOOD.replace("UP0, 0xe8", "UP0, 0xf0"), False), ("", False)):
        stats = sass.stats_from_sass(text, 168, launch={"kern": (168, 384)})
        stats = stats if text else dataclasses.replace(stats, kernels=())
        monkeypatch.setattr(sass, "sass_stats", lambda cubin, stats=stats: stats)
        report = check.check_variant(family, spec)
        assert report.ok == ok, report.problems
    assert "no kernel read from the cubin" in report.problems


# ---------------------------------------------------------------- end to end: real compiles

@pytest.fixture(scope="module")
def dsl(tmp_path_factory):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    from cute_kernels.toolchain.sass import find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp_path_factory.mktemp("dsl")))  # the DSL's cache stays in the test's dir
        yield


def test_raised_mma_registers_overflow_the_pool_in_a_real_compile(dsl):
    """prefill d64 causal: 32 x 128 + 160 x 384 = 65536 = 128 x 512 exactly; 168 for the MMA warpgroups
    compiles (ptxas accepts it) but would hang the first launch: the check must fail it."""
    from cute_kernels.hopper.prefill.prefill_family import PREFILL
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import check

    @dataclasses.dataclass(frozen=True)
    class RaisedSpec(PrefillSpec):
        @property
        def tile(self):
            return dataclasses.replace(super().tile, mma_registers=168)

    report = check.check_variant(dataclasses.replace(PREFILL, shim=None), RaisedSpec("bfloat16", 64, 1))
    assert report.compile_s is not None and not report.ok
    assert "setmaxnreg pool overflow: 32x128x1 + 168x128x3 = 68608 > 128x512 = 65536" in report.problems
    assert report.register_pool[0]["consumer_registers"] == 168  # read from the SASS, not the spec


def test_an_epilogue_barrier_on_the_producers_id_fails_in_a_real_compile(dsl, monkeypatch):
    """The kernel compiled with EPILOGUE_BARRIER_ID = PRODUCER_BARRIER_ID (the declared inventory keeps 5):
    id 1 then meets 128 producer threads and 384 MMA threads."""
    from cute_kernels.hopper.prefill import prefill_epilogue
    from cute_kernels.hopper.prefill.prefill_compile import compile_prefill
    from cute_kernels.hopper.prefill.prefill_family import PREFILL
    from cute_kernels.hopper.prefill.prefill_loads import PRODUCER_BARRIER_ID
    from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
    from cute_kernels.toolchain import check, sass

    spec = PrefillSpec("bfloat16", 64, 1)
    with monkeypatch.context() as mp:
        mp.setattr(prefill_epilogue, "EPILOGUE_BARRIER_ID", PRODUCER_BARRIER_ID)
        cubin = compile_prefill(spec, keep_artifacts=True).artifacts["cubin"]
    problems, _, rows = check.resource_report(PREFILL, spec, sass.sass_stats(cubin), cubin)
    assert f"barrier id {PRODUCER_BARRIER_ID} used with 2 thread counts [128, 384]" in problems, problems
    assert any("role epilogue (ids [5], 384 threads) is not in the SASS" in p for p in problems), problems
    assert {(r["id"], r["threads"]) for r in rows} >= {(1, 128), (1, 384)}
