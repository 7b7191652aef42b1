"""What profiling/gpu/gpu_suite.sh carries to a lent GPU, prepared and checked here.

    python3 profiling/gpu/gpu_suite_prep.py prepare [--out build/aot]   build the AOT kernels (needs the DSL)
                                                                     and record the tree they came from
    python3 profiling/gpu/gpu_suite_prep.py check-aot [DIR]             fresh for this tree, complete, opens?
    python3 profiling/gpu/gpu_suite_prep.py travel-size [CARRIED...]    what a GPU run sends, against 64 MiB

`prepare` runs `python -m cute_kernels.aot --all` in this process, then writes DIR/suite_tree.json: the
SHA-256 of every repository file the build imported plus every C source it compiled. `check-aot`
re-hashes those files (here, or on the GPU where the DSL is absent and nothing can be rebuilt): a
changed, missing or unrecorded file makes the build stale, a clear FAIL, never a silent rebuild. The
loader's own check (the manifest's kernel source hash) applies too.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREE_RECORD = "suite_tree.json"
TRAVEL_LIMIT = 64 << 20  # the device tool: tracked + untracked-not-ignored files + carried paths
CSRC = ROOT / "cute_kernels" / "toolchain" / "csrc"
HOW_TO_BUILD = ("bash profiling/gpu/gpu_suite.sh --prepare (here, where the DSL and a CUDA 13 toolkit are; "
                "minutes on 2 cores)")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:20]


def _kernel_tree() -> dict[str, str]:
    """Every source file under cute_kernels/ (the build can only have read these), path -> hash."""
    files = [p for p in (ROOT / "cute_kernels").rglob("*") if p.is_file() and p.suffix in (".py", ".c", ".h")
             and "__pycache__" not in p.parts]
    return {str(p.relative_to(ROOT)): _sha(p) for p in sorted(files)}


def _imported_files() -> list[str]:
    """cute_kernels/ files this process imported (the build's Python) plus the C sources it compiled."""
    package = ROOT / "cute_kernels"
    found = {str(Path(m.__file__).resolve().relative_to(ROOT)) for m in list(sys.modules.values())
             if getattr(m, "__file__", None) and Path(m.__file__).resolve().is_relative_to(package)
             and Path(m.__file__).suffix == ".py"}
    found |= {str(p.relative_to(ROOT)) for p in CSRC.iterdir() if p.suffix in (".c", ".h")}
    return sorted(found)


def prepare(out: Path) -> int:
    sys.path.insert(0, str(ROOT))
    before, start = _kernel_tree(), time.monotonic()
    from cute_kernels.hopper.families import selected_variants
    from cute_kernels.toolchain.aot import main as aot_main

    rc = aot_main(["--all", "--out", str(out)], selected_variants)
    if rc:
        return rc
    now = _kernel_tree()  # only what the build read matters: an edit elsewhere cannot change the kernels
    changed = sorted(p for p in _imported_files() if before.get(p) != now.get(p))
    if changed:  # an edit landed while the kernels compiled: the record could not say what they are
        (out / TREE_RECORD).unlink(missing_ok=True)
        print(f"FAIL: {len(changed)} files the build read changed during it ({', '.join(changed[:4])}); "
              "run --prepare again", file=sys.stderr)
        return 1
    from cute_kernels.toolchain.aot_manifest import read_manifest

    files = {p: _sha(ROOT / p) for p in _imported_files()}
    record = {"files": files, "source_hash": read_manifest(out)["source_hash"],
              "build_s": round(time.monotonic() - start, 1), "built": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / TREE_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    print(f"prepared {out}: {len(files)} source files recorded, {_dir_bytes(out) / 2**20:.1f} MiB, "
          f"{record['build_s']} s")
    return 0


def _dir_bytes(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def aot_problems(aot_dir: Path) -> tuple[list[str], str]:
    """(problems, what it holds) of an AOT folder for this tree; no DSL and no GPU needed."""
    sys.path.insert(0, str(ROOT))
    from cute_kernels.hopper.families import selected_variants
    from cute_kernels.toolchain.aot_manifest import read_manifest

    try:
        manifest = read_manifest(aot_dir)  # ABI and the kernel source hash
    except FileNotFoundError:
        return [f"missing: no {aot_dir}/manifest.json; build it: {HOW_TO_BUILD}"], ""
    except (OSError, ValueError) as exc:
        return [f"{exc}; rebuild: {HOW_TO_BUILD}"], ""
    problems = []
    record_path = aot_dir / TREE_RECORD
    if not record_path.is_file():
        problems.append(f"{aot_dir} has no {TREE_RECORD}: not built by --prepare, so not known to come from "
                        f"this tree; rebuild: {HOW_TO_BUILD}")
    else:
        files = json.loads(record_path.read_text())["files"]
        # a new file matters only once a recorded one imports it, and that one's hash then changes
        changed = [p for p, h in files.items() if not (ROOT / p).is_file() or _sha(ROOT / p) != h]
        if changed:
            problems.append(f"stale: built from another tree ({len(changed)} files differ: {', '.join(changed[:3])}"
                            f"); rebuild: {HOW_TO_BUILD}")
    wanted = {s.name for f, s in selected_variants(include_unused=True) if f.shim}
    if missing := sorted(wanted - set(manifest["variants"])):
        problems.append(f"lacks {len(missing)} variants the GPU tests launch ({', '.join(missing[:3])}); "
                        f"rebuild with --all: {HOW_TO_BUILD}")
    holds = f"{len(manifest['variants'])} variants, {_dir_bytes(aot_dir) / 2**20:.1f} MiB"
    return problems, holds


def open_libraries(aot_dir: Path) -> str:
    """Open every family's library from aot_dir (dlopen + ABI checks: no CUDA call); one line."""
    from cute_kernels.hopper.decode.decode_aot import AotDecodeKernels
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_aot import AotFp8Kernels
    from cute_kernels.hopper.fused.fused_aot import AotFusedOps
    from cute_kernels.toolchain.aot_library import open_library
    from cute_kernels.toolchain.aot_loader import AotPrefillKernels

    libs = {cls.family: open_library(cls, aot_dir) for cls in (AotDecodeKernels, AotFusedOps, AotFp8Kernels,
                                                                AotPrefillKernels)}
    return f"{next(iter(libs.values())).path.name} opens here for {', '.join(libs)}"


def check_aot(aot_dir: Path) -> int:
    problems, holds = aot_problems(aot_dir)
    if not problems:
        try:
            opened = open_libraries(aot_dir)
        except Exception as exc:  # noqa: BLE001 - AotUnavailable, OSError: one line
            problems.append(f"does not open here: {type(exc).__name__}: {exc}"[:400])
    if problems:
        print(f"FAIL {aot_dir}: " + " | ".join(problems))
        return 1
    print(f"ok {aot_dir}: fresh, built from this tree ({holds}); {opened}")
    return 0


def _git_files(*args: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def travel_size(carried: list[str]) -> int:
    """What a GPU run sends: git's tracked and untracked-not-ignored files, shared/, the carried paths."""
    try:
        tree = set(_git_files("--cached")) | set(_git_files("--others", "--exclude-standard"))
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"FAIL cannot list the working tree with git: {exc}")
        return 1
    sizes = {p: (ROOT / p).lstat().st_size for p in tree if (ROOT / p).is_file() or (ROOT / p).is_symlink()}
    extra = {}
    for folder in ["shared", *carried]:
        path = ROOT / folder
        if folder != "shared" and not path.exists():
            print(f"FAIL carried path {folder} is missing")
            return 1
        for p in ([path] if path.is_file() else path.rglob("*") if path.exists() else []):
            if (p.is_file() or p.is_symlink()) and str(p.relative_to(ROOT)) not in sizes:
                extra[str(p.relative_to(ROOT))] = p.lstat().st_size
    total, tree_bytes = sum(sizes.values()) + sum(extra.values()), sum(sizes.values())
    big = sorted({**sizes, **extra}.items(), key=lambda kv: -kv[1])[:3]
    line = (f"{total / 2**20:.1f} MiB of {TRAVEL_LIMIT >> 20} MiB: working tree {tree_bytes / 2**20:.1f} MiB in "
            f"{len(sizes)} files, carried {' '.join(carried) or 'nothing'} {sum(extra.values()) / 2**20:.1f} MiB; "
            f"largest {', '.join(f'{p} {b >> 10} KiB' for p, b in big)}")
    print(("ok " if total <= TRAVEL_LIMIT else "FAIL over the limit: ") + line)
    return 0 if total <= TRAVEL_LIMIT else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare").add_argument("--out", type=Path, default=ROOT / "build" / "aot")
    sub.add_parser("check-aot").add_argument("dir", type=Path, nargs="?", default=None)
    sub.add_parser("travel-size").add_argument("carried", nargs="*")
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        return prepare(args.out.resolve())
    if args.cmd == "check-aot":
        return check_aot(args.dir or Path(os.environ.get("CUTE_AOT_DIR") or ROOT / "build" / "aot"))
    return travel_size(args.carried)


if __name__ == "__main__":
    sys.exit(main())
