"""Build ahead-of-time kernels: export each variant of every family (sm_90a), compile its C shim, link every
variant into shared libraries, write the manifest. Needs the DSL, a C compiler and a CUDA 13 toolkit;
`python -m cute_kernels.aot` (toolchain/aot.py) and the compile check (toolchain/check.py) call it.
"""
from __future__ import annotations

from importlib import metadata
from pathlib import Path

from .aot_manifest import ABI_VERSION, MANIFEST, kernel_source_hash, kernel_sources, write_manifest

LIBRARIES = {"static": "libcute_kernels_static.so", "shared": "libcute_kernels_shared.so"}


def _dsl_version() -> str:
    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        return "?"


def build(out: Path, variants: list, flavors: tuple[str, ...] = ("shared", "static"), log=print) -> dict:
    """Export each (family, spec) of `variants`, compile shims, link; returns the manifest (also written
    to out/manifest.json). The
    loader tries the libraries in `flavors` order: torch's own libcudart.so.13 first, then static."""
    from .aot_export import dsl_static_runtime, export_variant
    from .aot_link import compile_common, compile_shim, find_cuda_toolkit, inspect_library, link_library

    kit = find_cuda_toolkit()
    if kit is None:
        raise RuntimeError("CUDA 13 headers + cudart not found: set CUDA_HOME or pip install nvidia-cuda-runtime")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a folder without a manifest is an unfinished build
    objects, built = [compile_common(out / "aot_common.o", kit)], {}
    for family, spec in [(f, s) for f, s in variants if f.shim]:  # families without a shim run JIT only
        exported = export_variant(family, spec, out / spec.name)
        objects += [exported.obj, compile_shim(spec.name, out / spec.name, out / spec.name / "shim.o", kit, family.shim)]
        built[spec.name] = {"family": family.name, "compile_s": round(exported.compile_seconds, 2),
                            "o_bytes": exported.obj.stat().st_size}
        log(f"  exported {spec.name} ({exported.compile_seconds:.1f} s, {exported.obj.stat().st_size // 1024} KB)")
    libraries = []
    for flavor in flavors:
        so = link_library(objects, out / LIBRARIES[flavor], dsl_static_runtime(), kit, flavor)
        info = inspect_library(so)
        libraries.append({"file": so.name, "cudart": flavor, "bytes": info.bytes, "needed": list(info.needed),
                          "max_glibc": info.max_glibc, "machine": info.machine})
    sources = kernel_sources({family for family, _ in variants})
    manifest = {"abi": ABI_VERSION, "arch": "sm_90a", "sources": list(sources), "source_hash": kernel_source_hash(sources),
                "dsl_version": _dsl_version(), "cuda_toolkit": str(kit.lib), "variants": built,
                "libraries": libraries}
    write_manifest(out, manifest)
    return manifest


def link_one(family, spec, compiled, work: Path) -> tuple[int, int | None]:
    """Export an already compiled variant and link it alone (libcudart.so.13 flavour): (.o bytes,
    .so bytes or None without a CUDA toolkit). For `python -m cute_kernels.check`'s aot column."""
    from .aot_export import dsl_static_runtime, export_variant
    from .aot_link import compile_common, compile_shim, find_cuda_toolkit, link_library

    exported = export_variant(family, spec, work, compiled)
    kit = find_cuda_toolkit()
    if kit is None:
        return exported.obj.stat().st_size, None
    objects = [compile_common(work / "aot_common.o", kit), exported.obj,
               compile_shim(spec.name, work, work / "shim.o", kit, family.shim)]
    so = link_library(objects, work / f"lib{spec.name}.so", dsl_static_runtime(), kit, "shared")
    return exported.obj.stat().st_size, so.stat().st_size


def format_manifest(manifest: dict) -> str:
    lines = [f"{'variant':<36} {'compile_s':>9} {'.o KB':>6}"]
    for name, v in manifest["variants"].items():
        lines.append(f"{name:<36} {v['compile_s']:>9} {v['o_bytes'] // 1024:>6}")
    lines.append(f"{'library':<36} {'KB':>9}  cudart  needs (max glibc)")
    for lib in manifest["libraries"]:
        lines.append(f"{lib['file']:<36} {lib['bytes'] // 1024:>9}  {lib['cudart']:<6}  "
                     f"{', '.join(lib['needed'])} (GLIBC_{lib['max_glibc']})")
    return "\n".join(lines)
