"""Export one compiled prefill variant as C: `<variant>.h` + `<variant>.o` (host launch code with the
sm_90a cubin embedded), via the DSL's `export_to_c`. Needs the DSL; the artifacts do not.

Why `preload_dsl_runtime`: export_to_c JIT-links the host module inside this process to write a PIC
object file, and that link looks up the DSL runtime's `_cuda*` wrapper symbols (`_cudaLaunchKernelEx`,
`_cuKernelGetAttribute`, ...) in the process's global symbol namespace only. Nothing puts them there
on a machine that never launches a kernel (CUTE_DSL_LIBS feeds the execution engine, not the export),
so without the preload the export fails with "Symbols not found: _cudaLaunchKernelEx ..." and
"Failed to dump object file with PIC relocation". The symbols stay undefined in the .o; the final
link takes them from libcuda_dialect_runtime_static.a.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cute_kernels.hopper.prefill_spec import PrefillSpec

# What csrc/prefill_aot_shim.c packs for each tensor argument: (dynamic shape modes, dynamic stride
# modes). A kernel change that alters these must change the shim too; export refuses otherwise.
SHIM_TENSOR_MODES = {
    "rows": ((1, 1, 0), (1, 0, 0)),  # q, k, v, out: [tokens, heads, d]
    "cache": ((1, 0, 1, 0), (1, 1, 0, 0)),  # [num_blocks, 16, kv_heads, d]
    "table": ((1, 1), (1, 0)),  # block_tables [batch, max_blocks], lse [total_q, heads]
    "vector": ((1,), (0,)),  # prefix_lens, cu_seqlens_q, cu_seqlens_k
}
_ARG_KINDS = ("rows", "rows", "rows", "cache", "cache", "table", "vector", "vector", "vector", "rows", "table")

_preloaded: list[ctypes.CDLL] = []


@dataclass(frozen=True)
class ExportedVariant:
    spec: PrefillSpec
    header: Path
    obj: Path
    compile_seconds: float


def dsl_runtime_libraries() -> list[str]:
    from cutlass.runtime import find_runtime_libraries

    libs = find_runtime_libraries(enable_tvm_ffi=False)
    if not libs:
        raise RuntimeError("nvidia-cutlass-dsl: libcute_dsl_runtime.so not found (set CUTE_DSL_LIBS)")
    return libs


def preload_dsl_runtime() -> None:
    """Make the DSL runtime's symbols global in this process (see the module docstring). Idempotent."""
    if not _preloaded:
        _preloaded.extend(ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL) for lib in dsl_runtime_libraries())


def dsl_static_runtime() -> Path:
    """libcuda_dialect_runtime_static.a: the `_cuda*` wrappers the exported objects call."""
    path = Path(dsl_runtime_libraries()[0]).with_name("libcuda_dialect_runtime_static.a")
    if not path.is_file():
        raise RuntimeError(f"nvidia-cutlass-dsl: {path} missing")
    return path


def check_shim_abi(fake_args: tuple) -> None:
    """Refuse to export a kernel whose tensor descriptors differ from what the C shim packs."""
    for i, (arg, kind) in enumerate(zip(fake_args, _ARG_KINDS)):
        got = (tuple(arg.dynamic_shapes_mask), tuple(arg.dynamic_strides_mask))
        if got != SHIM_TENSOR_MODES[kind] or getattr(arg, "_use_32bit_stride", False):
            raise RuntimeError(f"prefill AOT: tensor argument {i} has dynamic (shape, stride) modes {got}; "
                               f"csrc/prefill_aot_shim.c packs {SHIM_TENSOR_MODES[kind]} with int64 strides")


def export_prefill(spec: PrefillSpec, out_dir: Path, compiled: Any = None) -> ExportedVariant:
    """Write out_dir/<spec.name>.{h,o} (symbols prefixed by spec.name), compiling for sm_90a unless
    `compiled` (a CompiledKernel of this spec) is given."""
    from cute_kernels.hopper.prefill_compile import compile_prefill, fake_prefill_arguments

    preload_dsl_runtime()
    check_shim_abi(fake_prefill_arguments(spec))
    compiled = compiled or compile_prefill(spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    compiled.fn.export_to_c(str(out_dir), spec.name, function_prefix=spec.name)
    header, obj = out_dir / f"{spec.name}.h", out_dir / f"{spec.name}.o"
    if not (header.is_file() and obj.is_file()):
        raise RuntimeError(f"{spec.name}: export_to_c wrote no {header.name}/{obj.name}")
    return ExportedVariant(spec, header, obj, compiled.compile_seconds)
