"""The decode-attention kernels as KernelFamilies: the split-KV decode kernel and its merge, each with
its own C shim (their launch arguments differ). Cheap to import: the DSL only when compiling."""
from __future__ import annotations

from typing import Any

from cute_kernels.toolchain.family import KernelFamily, sources_in

from .decode_checks import decode_barriers, decode_sass_problems
from .decode_spec import DECODE_MAX_REGISTERS, DecodeMergeSpec, DecodeSpec, decode_specs

# What csrc/decode_aot_shim.c and decode_merge_aot_shim.c pack: (dynamic shape modes, dynamic stride modes).
_ROWS = ((1, 1, 0), (1, 0, 0))  # q, out: [tokens, heads, d]
_CACHE = ((1, 0, 1, 0), (1, 1, 0, 0))  # [num_blocks, 16, kv_heads, d]
_TABLE = ((1, 1), (1, 0))  # block_tables [batch, max_blocks], lse [tokens, heads]
_VECTOR = ((1,), (0,))  # context_lens, cu_seqlens_q
_PARTIAL_O = ((1, 1, 1, 0), (1, 1, 0, 0))  # [splits, tokens, heads, d]
_PARTIAL_LSE = ((1, 1, 1), (1, 1, 0))  # [splits, tokens, heads]
DECODE_SHIM_ABI = (_ROWS, _CACHE, _CACHE, _TABLE, _VECTOR, _VECTOR, _ROWS, _TABLE, _PARTIAL_O, _PARTIAL_LSE,
                   _VECTOR, _VECTOR, None, None, None)  # then k_scale, v_scale [kv_heads], two scalars, stream
MERGE_SHIM_ABI = (_PARTIAL_O, _PARTIAL_LSE, _ROWS, _TABLE, None)

_SOURCES = (sources_in("hopper/decode", "decode_attention.py", "decode_dequant.py", "decode_merge.py", "decode_spec.py", "decode_schedule.py",
                       "decode_compile.py", "decode_checks.py", "decode_family.py")
            + sources_in("hopper/common", "wgmma_layouts.py", "warpgroup_ops.py", "attention_spec.py") + ("paged_tables.py",) + ("toolchain/csrc/decode_aot.h",))


def _compile(spec, keep_artifacts: bool) -> Any:
    from . import decode_compile  # the DSL, only when compiling

    return decode_compile.compile_decode(spec, keep_artifacts=keep_artifacts)


def _fake_args(spec) -> tuple:
    from .decode_compile import fake_arguments

    return fake_arguments(spec)


DECODE = KernelFamily(
    name="decode", specs=lambda unused: [s for s in decode_specs(unused) if isinstance(s, DecodeSpec)],
    compile=_compile, sass_problems=decode_sass_problems, max_registers=DECODE_MAX_REGISTERS,
    fake_args=_fake_args, shim_abi=DECODE_SHIM_ABI, shim="decode_aot_shim.c", barriers=decode_barriers,
    sources=_SOURCES + ("toolchain/csrc/decode_aot_shim.c",),
)
DECODE_MERGE = KernelFamily(
    name="decode_merge", specs=lambda unused: [s for s in decode_specs(unused) if isinstance(s, DecodeMergeSpec)],
    compile=_compile, sass_problems=decode_sass_problems, max_registers=DECODE_MAX_REGISTERS,
    fake_args=_fake_args, shim_abi=MERGE_SHIM_ABI, shim="decode_merge_aot_shim.c",
    sources=_SOURCES + ("toolchain/csrc/decode_merge_aot_shim.c",),
)
