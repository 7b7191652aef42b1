"""A kernel family: every compiled variant of one kernel, as the compile check and the AOT build see it.

Each kernel registers one KernelFamily in cute_kernels/hopper/families.py. The check compiles every
variant for sm_90a and fails it on the rules common to all kernels (compile failure, local-memory
traffic, a stack frame, registers over the family's budget, an AOT export that does not link) plus
the family's own `sass_problems` (the instructions its design relies on), and the setmaxnreg pool and
named-barrier inventory its `register_split` and `barriers` declare (toolchain/resource_checks.py;
they may import the kernel: they run only when checking). The AOT build exports
each variant and compiles the family's C shim once per variant.

Families must stay cheap to import (no DSL import at module level): the AOT manifest reads their
`sources` on GPU boxes without the DSL.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# (dynamic shape modes, dynamic stride modes) of one tensor argument, as the DSL's fake tensor reports
# them (`dynamic_shapes_mask`, `dynamic_strides_mask`); what a C shim packs for that argument.
TensorModes = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class KernelFamily:
    name: str  # "prefill", "decode", ...; every variant's name starts with it
    specs: Callable[[bool], list]  # include_unused -> frozen spec dataclasses with a unique .name
    compile: Callable[[Any, bool], Any]  # (spec, keep_artifacts) -> compile_cache.CompiledKernel
    sass_problems: Callable[[Any, Any], list[str]]  # (spec, SassStats) -> the design's own failures
    max_registers: int = 255  # the budget the occupancy plan assumes; more fails the check
    fake_args: Callable[[Any], tuple] | None = None  # the compile's fake tensors, for shim_abi
    shim_abi: tuple[TensorModes | None, ...] = ()  # per argument of fake_args (None: not a tensor)
    shim: str | None = None  # toolchain/csrc file compiled per variant; None: not exported AOT
    sources: tuple[str, ...] = ()  # files (relative to cute_kernels/) hashed into the AOT manifest
    # (spec) -> sass_resources.RegisterSplit, the setmaxnreg plan (warpgroups per role); None: no setmaxnreg
    register_split: Callable[[Any], Any] | None = None
    # (spec) -> tuple of sass_resources.BarrierRole, every named barrier but the CTA-wide 0; None: none
    barriers: Callable[[Any], tuple] | None = None

    def selected(self, include_unused: bool, only: list[str] | None) -> list:
        """The family's variants, kept to names containing any of `only`."""
        specs = self.specs(include_unused)
        return [s for s in specs if not only or any(pattern in s.name for pattern in only)]

    def check_shim_abi(self, spec: Any) -> None:
        """Refuse to export a variant whose tensor descriptors differ from what the C shim packs."""
        if self.fake_args is None:
            return
        for i, (arg, want) in enumerate(zip(self.fake_args(spec), self.shim_abi)):
            if want is None:
                continue
            got = (tuple(arg.dynamic_shapes_mask), tuple(arg.dynamic_strides_mask))
            if got != want or getattr(arg, "_use_32bit_stride", False):
                raise RuntimeError(f"{spec.name} AOT: tensor argument {i} has dynamic (shape, stride) modes {got}; "
                                   f"csrc/{self.shim} packs {want} with int64 strides")


def sources_in(folder: str, *names: str) -> tuple[str, ...]:
    """KernelFamily.sources entries for files of one folder (relative to cute_kernels/)."""
    return tuple(f"{folder}/{name}" for name in names)
