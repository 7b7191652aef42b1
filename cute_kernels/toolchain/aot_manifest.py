"""manifest.json of an AOT build folder: which variants and libraries it holds, and what they were
built from. Pure Python (no DSL, no torch): the loader reads it on boxes without the DSL.

The source hash covers every file that shapes the kernels' code or the C ABI, so a loader refuses
artifacts built from another version of the kernels instead of running stale code.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from .family import KernelFamily

ABI_VERSION = 1  # toolchain/csrc/aot_common.h CUTE_AOT_ABI
MANIFEST = "manifest.json"
PACKAGE = Path(__file__).resolve().parents[1]  # cute_kernels/
COMMON_SOURCES = (  # relative to PACKAGE; each family adds its own (KernelFamily.sources)
    "toolchain/family.py", "toolchain/aot_export.py", "toolchain/csrc/aot_common.h", "toolchain/csrc/aot_common.c",
    "toolchain/csrc/aot_shim.h",
)


def kernel_sources(families: Iterable[KernelFamily]) -> tuple[str, ...]:
    """The files (relative to cute_kernels/) the families' kernels are built from, in a fixed order."""
    return COMMON_SOURCES + tuple(sorted({name for family in families for name in family.sources}))


def kernel_source_hash(sources: Iterable[str]) -> str:
    """The hash of these files' names and bytes; ValueError when one is gone (renamed, removed)."""
    digest = hashlib.sha256()
    for name in sources:
        if not (PACKAGE / name).is_file():
            raise ValueError(f"kernel source {name} is not in this tree")
        digest.update(name.encode() + b"\0" + (PACKAGE / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def default_aot_dir() -> Path:
    """$CUTE_AOT_DIR, else build/aot at the repository root (what `python -m cute_kernels.aot` writes)."""
    return Path(os.environ.get("CUTE_AOT_DIR") or PACKAGE.parent / "build" / "aot")


def write_manifest(aot_dir: Path, manifest: dict) -> Path:
    path = aot_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def read_manifest(aot_dir: Path, check_sources: bool = True) -> dict:
    """The manifest, or ValueError/FileNotFoundError saying why these artifacts cannot be used."""
    path = aot_dir / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no AOT kernels in {aot_dir} (build them: python -m cute_kernels.aot --out {aot_dir})")
    manifest = json.loads(path.read_text())
    if manifest.get("abi") != ABI_VERSION:
        raise ValueError(f"{path}: ABI {manifest.get('abi')}, this loader speaks {ABI_VERSION}; rebuild")
    if check_sources:  # the sources the manifest names, hashed as they are in this tree now
        now = kernel_source_hash(manifest.get("sources", ()))
        if not manifest.get("sources") or manifest.get("source_hash") != now:
            raise ValueError(f"{path}: built from kernel sources {manifest.get('source_hash')}, this tree is "
                             f"{now}: stale artifacts, rebuild with python -m cute_kernels.aot")
    return manifest
