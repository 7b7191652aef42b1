"""The C kernels' own tests once more, built with AddressSanitizer and UndefinedBehaviorSanitizer
(build.SANITIZE_COMPILE: no fast-math, every report fatal), on the best route this CPU runs and on
portable C, in one child pytest whose Python preloads the sanitizers' runtimes. An out-of-bounds
read, a signed overflow or a misaligned load in any kernel fails this test with the report.

The first test proves the machinery: a planted out-of-bounds read, built and loaded the same way, must
abort the child with ASan's report (a preload that silently did nothing would let everything pass).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cute_kernels.cpu import build
from tests.paths import REPO

COMPILER = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
KERNEL_TEST_DIRS = ("tests/cute_kernels/cpu", "tests/runtime/accel")  # where the cpu_kernel tests live


def test_every_kernel_test_lives_where_the_sanitizer_run_looks():
    """The run below collects only these folders (collecting all of tests/ costs ~30 s): a C kernel test
    (one that takes conftest's cpu_route) anywhere else would silently escape the sanitizers."""
    users = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("*.py")
             if "cpu_route" in p.read_text(encoding="utf-8") and p.name != "conftest.py" and p != Path(__file__)}
    assert users and all(u.startswith(KERNEL_TEST_DIRS) for u in users), sorted(users)


def sanitizer_env(tmp: Path) -> dict[str, str]:
    runtimes = [subprocess.run([COMPILER, f"-print-file-name={lib}"], capture_output=True, text=True,
                               check=True).stdout.strip() for lib in ("libasan.so", "libubsan.so")]
    if not all(os.path.isabs(r) and os.path.exists(r) for r in runtimes):
        pytest.fail(f"{COMPILER} has no ASan/UBSan runtime: {runtimes}")
    return {**os.environ, "LD_PRELOAD": ":".join(runtimes), "CUTE_SERVE_CPU_SANITIZE": "1",
            "ASAN_OPTIONS": f"detect_leaks=0:log_path={tmp}/asan", "UBSAN_OPTIONS": f"print_stacktrace=1:log_path={tmp}/ubsan",
            "CUTE_SERVE_CACHE": os.environ.get("CUTE_SERVE_CACHE", str(Path.home() / ".cache" / "cute-serve")),
            "TMPDIR": str(tmp)}


pytestmark = pytest.mark.skipif(COMPILER is None or sys.platform != "linux", reason="needs gcc on Linux")


def reports(tmp: Path) -> str:
    """What the sanitizers wrote (their log_path files): a crashed child's captured output is lost."""
    return "".join(p.read_text(errors="replace") for p in sorted(tmp.glob("*san.*")))


def test_a_planted_out_of_bounds_read_is_caught(tmp_path):
    src = tmp_path / "oob.c"
    src.write_text("int read_past(const int *a, int n) { return a[n]; }\n")
    lib = build._build(src, COMPILER, build.SANITIZE_COMPILE, build.SANITIZE_LINK)
    code = (f"import ctypes, torch; lib = ctypes.CDLL({str(lib)!r}); a = torch.zeros(4, dtype=torch.int32); "
            "print(lib.read_past(ctypes.c_void_p(a.data_ptr()), 4))")  # one past a tensor, as a kernel would
    run = subprocess.run([sys.executable, "-c", code], env=sanitizer_env(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "heap-buffer-overflow" in reports(tmp_path), run.stderr[-2000:]


@pytest.mark.slow
def test_kernel_tests_pass_under_asan_and_ubsan(tmp_path):
    best = next(r for r in build.ROUTES if build.route_unavailable(r) is None)
    routes = best if best == "portable-c" else f"{best},portable-c"
    env = {**sanitizer_env(tmp_path), "CUTE_SERVE_TEST_ROUTES": routes}
    prebuild = f"from cute_kernels.cpu import build; build.prebuild({routes.split(',')!r})"  # both cores compile
    subprocess.run([sys.executable, "-c", prebuild], cwd=REPO, env={k: v for k, v in env.items() if k != "LD_PRELOAD"},
                   check=True, timeout=900)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cpu_kernel and not slow",
                          *KERNEL_TEST_DIRS], cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    tail = (run.stdout + run.stderr)[-3000:] + reports(tmp_path)[:4000]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "CPU kernel routes run per test file" in run.stdout, tail
    print(run.stdout[run.stdout.index("CPU kernel routes"):])
