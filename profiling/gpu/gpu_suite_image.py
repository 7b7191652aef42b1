"""The GPU image, emulated here: block the Python packages the GPU machine lacks, then import, collect and
list everything `profiling/gpu/gpu_suite.sh` runs there, in this one process.

    python3 profiling/gpu/gpu_suite_image.py [--json PATH]     (the suite's --dry-run and tests/profiling/test_gpu_image_imports.py)
    python3 profiling/gpu/gpu_suite_image.py --run -c CODE     run CODE with the packages blocked
    python3 profiling/gpu/gpu_suite_image.py --prelude CODE    run CODE, then the check (tests put a bug back so)

The GPU image (/work/.library/device/KINDS.md) holds torch, numpy, pytest, transformers, safetensors,
tokenizers, jinja2, httpx, ... but none of GPU_IMAGE_LACKS. A meta-path finder makes `import x` of those
raise ImportError (ModuleNotFoundError) and importlib.util.find_spec(x) answer None, as on that image.
Checked, from the suite's plan (`bash profiling/gpu/gpu_suite.sh --list`):
  - every first-party module each smoke and benchmark script imports, at module level or inside its
    functions (the real GPU paths, not only the dry-run ones), following imports within profiling/;
  - each smoke lists its checks (`--dry-run --family F`) and each benchmark its cases (`--dry-run`),
    through the scripts' own command lines;
  - every test file collects its GPU tests the way the suite runs pytest (-m gpu --noconftest);
  - the AOT entry point and the suite's own helpers import.
Exit 0 when all hold; each problem is one line naming the module and the blocked package it reached.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.abc
import importlib.util
import io
import json
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What the project imports (pyproject, tests, benchmarks) that the GPU image does not hold.
GPU_IMAGE_LACKS = (
    "gguf", "xgrammar", "fastapi", "uvicorn", "gradio", "starlette", "pydantic",  # the server + GGUF stack
    "cutlass", "iket", "nvidia_cutlass_dsl",  # nvidia-cutlass-dsl: kernels arrive ahead-of-time compiled
    "openai", "jsonschema", "schemathesis", "playwright",  # test extras
    "flashinfer", "flash_attn", "llama_cpp", "vllm",  # optional peers (imported under try/except)
)
FIRST_PARTY = ("app", "cute_kernels", "profiling", "runtime", "structured", "tests", "weights")
SUITE_HELPERS = ("profiling.gpu.gpu_suite_prep", "profiling.gpu.gpu_suite_report", "profiling.gpu.gpu_suite_step",
                 "cute_kernels.aot", "cute_kernels.toolchain.aot")


class BlockGpuImageGaps(importlib.abc.MetaPathFinder):
    """Importing a package the GPU image lacks raises ImportError, as it would there."""

    def __init__(self, names=GPU_IMAGE_LACKS):
        self.names = frozenset(names)
        self.hits: list[str] = []

    def blocks(self, fullname: str) -> bool:
        return fullname.partition(".")[0] in self.names

    def find_spec(self, fullname, path=None, target=None):
        if self.blocks(fullname):
            self.hits.append(fullname)
            raise ModuleNotFoundError(f"No module named {fullname!r} (the GPU image lacks it)", name=fullname)
        return None


def install_blocker(names=GPU_IMAGE_LACKS) -> BlockGpuImageGaps:
    blocker = BlockGpuImageGaps(names)
    for mod in [m for m in sys.modules if blocker.blocks(m)]:  # the DSL's .pth imports one at start-up
        del sys.modules[mod]
    sys.path[:] = [p for p in sys.path if "dsl_packages" not in p]
    sys.meta_path.insert(0, blocker)
    real_find_spec = importlib.util.find_spec

    def find_spec(name, package=None):  # "is it installed?" answers no, as on the image
        absolute = importlib.util.resolve_name(name, package) if name.startswith(".") else name
        return None if blocker.blocks(absolute) else real_find_spec(name, package)

    importlib.util.find_spec = find_spec
    return blocker


def plan() -> list[tuple[str, str, int, list[str]]]:
    """(family, kind, timeout s, command) of each step of the suite, from `gpu_suite.sh --list`."""
    out = subprocess.run(["bash", str(ROOT / "profiling" / "gpu" / "gpu_suite.sh"), "--list"], capture_output=True,
                         text=True, check=True).stdout
    steps = []
    for line in out.splitlines():
        family, kind, _label, seconds, *args = line.split()
        steps.append((family, kind, int(seconds), args))
    return steps


def _module_of(path: Path) -> str:
    return ".".join(path.resolve().relative_to(ROOT).with_suffix("").parts)


def _file_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(script: Path, follow: bool = True) -> list[str]:
    """First-party modules `script` imports anywhere (functions included); with `follow`, imports inside
    profiling/ files are followed, others are imported as they are (their lazy imports may be DSL-only)."""
    seen, todo, found = set(), [script], []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] not in FIRST_PARTY or (file := _file_of(name)) is None:
                    continue  # third-party, or `from pkg import function`
                if name not in found:
                    found.append(name)
                if follow and name.startswith("profiling."):
                    todo.append(file)
    return found


def _first_party_chain(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(ROOT) in f.filename
              and "gpu_suite_image" not in f.filename]
    return " <- ".join(f"{Path(f.filename).relative_to(ROOT)}:{f.lineno}" for f in reversed(frames[-4:]))


DSL = ("cutlass", "iket", "nvidia_cutlass_dsl")
_missing: dict[str, str] = {}  # module -> the blocked package its import reached


def try_import(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - reported, one line each
        _missing[module] = (getattr(exc, "name", None) or "").partition(".")[0]
        chain = _first_party_chain(exc)
        return f"{type(exc).__name__}: {exc}" + (f" (at {chain})" if chain else "")
    return None


def run_script(args: list[str]) -> tuple[int, str]:
    """Run `python3 SCRIPT ARGS` in this process (its command line, its __main__): (exit code, stdout)."""
    script, buf, code = str(ROOT / args[0]), io.StringIO(), 0
    argv, sys.argv = sys.argv, [script, *args[1:]]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            buf.write(exc.code)
    except BaseException as exc:  # noqa: BLE001
        code, _ = 1, buf.write(f"{type(exc).__name__}: {exc} (at {_first_party_chain(exc)})")
    finally:
        sys.argv = argv
    return code, buf.getvalue()


class _Collected:
    def __init__(self):
        self.per_file: dict[str, int] = {}
        self.errors: list[str] = []

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(f"{report.nodeid}: {str(report.longrepr).strip().splitlines()[-1]}")

    def pytest_collection_finish(self, session):
        for item in session.items:
            where = item.nodeid.split("::")[0]
            self.per_file[where] = self.per_file.get(where, 0) + 1


def collect(test_files: list[str]) -> _Collected:
    import pytest

    from profiling.gpu.gpu_suite_step import PLUGIN_AUTOLOAD_OFF, PYTEST_ARGS

    os.environ.update(PLUGIN_AUTOLOAD_OFF)  # this script is its own process: the tests' pytest is unaffected
    plugin = _Collected()
    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main([*PYTEST_ARGS, "--collect-only", "-q", "--rootdir", str(ROOT), *test_files], plugins=[plugin])
    return plugin


def check(prelude: str | None = None) -> dict:
    """Every check above; {"rows": [(what, detail)], "problems": [line]}."""
    steps = plan()
    blocker = install_blocker()
    if prelude:
        exec(compile(prelude, "<prelude>", "exec"), {"__name__": "__prelude__"})
    rows, problems = [], []
    entry_scripts = dict.fromkeys(args[0] for _, kind, _, args in steps if kind in ("smoke", "bench"))
    for script in entry_scripts:
        modules = [_module_of(ROOT / script)] + imported_modules(ROOT / script)
        bad = [(m, why) for m in modules if (why := try_import(m))]
        problems += [f"{script}: import {m}: {why}" for m, why in bad]
        rows.append(("imports", script, f"{len(modules) - len(bad)}/{len(modules)} first-party modules import"))
    test_files = [t for _, kind, _, args in steps if kind == "tests" for t in args]
    for t in test_files:  # what the tests import inside their bodies too; DSL-only ones are the DSL's tests
        modules = imported_modules(ROOT / t, follow=False)
        bad = [(m, why) for m in modules if (why := try_import(m))]
        problems += [f"{t}: import {m}: {why}" for m, why in bad if _missing.get(m) not in DSL]
        dsl_only = sum(_missing.get(m) in DSL for m, _ in bad)
        rows.append(("imports", t, f"{len(modules) - len(bad)}/{len(modules)} first-party modules import"
                     + (f" ({dsl_only} need the DSL: its compile tests, skipped there)" if dsl_only else "")))
    for module in SUITE_HELPERS:
        if why := try_import(module):
            problems.append(f"suite helper {module}: {why}")
    for _family, kind, _, args in steps:
        if kind not in ("smoke", "bench"):
            continue
        code, out = run_script([*args, "--dry-run"])
        lines = [line for line in out.splitlines() if line.strip()]
        if code != 0 or not lines:
            problems.append(f"{' '.join(args)} --dry-run: exit {code}: {(lines or ['no output'])[-1][:300]}")
        if kind == "smoke":  # "family: check; check; ..."
            count = sum(len(line.partition(": ")[2].split("; ")) for line in lines)
            detail = f"{count} checks: {lines[0].partition(': ')[2]}" if lines else "no checks"
        else:
            detail = f"{len(lines)} cases"
        rows.append((kind, " ".join(args), detail if code == 0 else f"FAIL (exit {code})"))
    collected = collect(test_files)
    problems += [f"pytest collection: {e}" for e in collected.errors]
    for t in test_files:
        n = collected.per_file.get(t, 0)
        rows.append(("tests", t, f"{n} gpu tests collect"))
        if n == 0:
            problems.append(f"{t}: no gpu tests collected")
    if why := try_import("tests.conftest"):  # the suite runs pytest --noconftest; say why
        rows.append(("note", "tests/conftest.py", f"not importable on the image ({why[:120]}); the suite "
                     "passes --noconftest"))
    probe = try_import("gguf")
    if probe is None or not blocker.hits:
        problems.append("the blocker let gguf import: this check checks nothing")
    return {"rows": rows, "problems": problems, "blocked": sorted(GPU_IMAGE_LACKS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write rows and problems here")
    parser.add_argument("--run", action="store_true", help="run -c CODE with the packages blocked")
    parser.add_argument("-c", dest="code", help="with --run: the code")
    parser.add_argument("--prelude", help="code to run (packages blocked) before the check")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.run:
        install_blocker()
        exec(compile(args.code, "<gpu-image>", "exec"), {"__name__": "__main__"})
        return 0
    result = check(args.prelude)
    for kind, what, detail in result["rows"]:
        print(f"{kind:<8} {what:<48} {detail}")
    for problem in result["problems"]:
        print(f"FAIL {problem}")
    print(f"gpu image: {len(result['problems'])} problems with {', '.join(result['blocked'])} blocked")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
