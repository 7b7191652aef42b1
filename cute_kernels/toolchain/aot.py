"""Ahead-of-time kernels: `python -m cute_kernels.aot --out build/aot` exports every kernel variant
the runtime uses (sm_90a, every family with a C shim) and links them into shared libraries that run
WITHOUT the DSL.

Needs the DSL, a C compiler and CUDA 13 headers + cudart (CUDA_HOME, /usr/local/cuda or the
nvidia-cuda-runtime wheel); no GPU. Writes into --out:
  <variant>/<variant>.h, <variant>.o  export_to_c output (host launch code + embedded cubin)
  <variant>/shim.o                    its family's toolchain/csrc shim for that variant
  libcute_kernels_shared.so           every variant, needs libcudart.so.13 (torch cu13x loads it)
  libcute_kernels_static.so           every variant, cudart linked in (needs libc + the driver)
  manifest.json                       written last: variants, libraries, kernel source hash
On the GPU box, carry the folder (it is a few MB) and the runtime picks it up
(toolchain/aot_library.py and each family's launcher; $CUTE_AOT_DIR overrides build/aot). `--status` reports a folder
and tries it here, without the DSL. The building itself is aot_build.py.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from .aot_build import build, format_manifest
from .aot_manifest import default_aot_dir, read_manifest


def status(aot_dir: Path) -> int:
    """Print what aot_dir holds and which library opens here; 0 when one does."""
    from .aot_loader import AotUnavailable, open_prefill_kernels

    try:
        print(format_manifest(read_manifest(aot_dir, check_sources=False)))
        kernels = open_prefill_kernels(aot_dir)
    except (OSError, ValueError, AotUnavailable) as exc:
        print(f"aot: unusable: {exc}")
        return 1
    print(f"aot: {kernels.path.name} opens here ({len(kernels.variants)} variants)")
    return 0


def main(argv: list[str] | None, select: Callable[[bool, list[str] | None], list]) -> int:
    """select(include_unused, only) -> [(family, spec)]: the kernels' registry (cute_kernels/hopper/families.py)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: build/aot)")
    parser.add_argument("--only", nargs="*", help="substrings of variant names to keep")
    parser.add_argument("--all", action="store_true", help="also the variants the runtime does not use (the GPU tests do)")
    parser.add_argument("--cudart", choices=["static", "shared", "both"], default="both")
    parser.add_argument("--status", action="store_true", help="report the folder instead of building (no DSL needed)")
    args = parser.parse_args(argv)
    out = args.out or default_aot_dir()
    if args.status:
        return status(out)

    os.environ.setdefault("TMPDIR", tempfile.mkdtemp(prefix="cute_aot_"))  # the DSL's cache
    variants = select(args.all, args.only)
    if not variants:
        print("aot: no variants selected", file=sys.stderr)
        return 1
    flavors = ("shared", "static") if args.cudart == "both" else (args.cudart,)
    manifest = build(out, variants, flavors, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(format_manifest(manifest))
    return 0

