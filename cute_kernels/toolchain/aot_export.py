"""Export one compiled kernel variant as C: `<variant>.h` + `<variant>.o` (host launch code with the
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

_preloaded: list[ctypes.CDLL] = []


@dataclass(frozen=True)
class ExportedVariant:
    spec: Any  # the family's spec dataclass
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


def export_variant(family: Any, spec: Any, out_dir: Path, compiled: Any = None) -> ExportedVariant:
    """Write out_dir/<spec.name>.{h,o} (symbols prefixed by spec.name), compiling for sm_90a unless
    `compiled` (a CompiledKernel of this spec) is given. `family`: a toolchain.family.KernelFamily."""
    preload_dsl_runtime()
    family.check_shim_abi(spec)
    compiled = compiled or family.compile(spec, False)
    out_dir.mkdir(parents=True, exist_ok=True)
    compiled.fn.export_to_c(str(out_dir), spec.name, function_prefix=spec.name)
    header, obj = out_dir / f"{spec.name}.h", out_dir / f"{spec.name}.o"
    if not (header.is_file() and obj.is_file()):
        raise RuntimeError(f"{spec.name}: export_to_c wrote no {header.name}/{obj.name}")
    return ExportedVariant(spec, header, obj, compiled.compile_seconds)
