"""The GPU image's import check (CPU; profiling/gpu/gpu_suite_image.py): with the packages the GPU machine
lacks blocked (gguf, xgrammar, fastapi, uvicorn, gradio, the DSL, ...), every GPU test module the suite
runs collects its GPU tests, and the smoke and every benchmark entry point import and list their
checks and cases. A module-level `import gguf` put back on the engine's import path fails the check."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.paths import REPO

HELPER = REPO / "profiling" / "gpu" / "gpu_suite_image.py"
BLOCKED = "(the GPU image lacks it)"
# The engine's import path as it was: weights/quantized.py importing gguf at module level.
PUT_THE_BUG_BACK = """
import pathlib, sys, tempfile, weights
scratch = pathlib.Path(tempfile.mkdtemp()) / "weights"
scratch.mkdir()
source = pathlib.Path(weights.__file__).with_name("quantized.py").read_text()
(scratch / "quantized.py").write_text(source.replace("import torch\\n", "import torch\\nfrom gguf import GGML_QUANT_SIZES\\n", 1))
weights.__path__.insert(0, str(scratch))  # weights.quantized now comes from the scratch copy
"""


def helper(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HELPER), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def plan() -> list[list[str]]:
    out = subprocess.run(["bash", str(REPO / "profiling" / "gpu" / "gpu_suite.sh"), "--list"], cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [line.split() for line in out.splitlines()]


def test_everything_the_gpu_suite_runs_imports_on_the_gpu_image(tmp_path):
    run = helper("--json", str(tmp_path / "image.json"))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "image.json").read_text())
    assert result["problems"] == []
    assert {"gguf", "xgrammar", "fastapi", "uvicorn", "gradio", "cutlass"} <= set(result["blocked"])
    rows = {(kind, what): detail for kind, what, detail in result["rows"]}
    steps = plan()
    tests = [t for step in steps if step[1] == "tests" for t in step[4:]]
    assert {"tests/runtime/accel/test_cuda_graphs.py", "tests/runtime/accel/test_engine_gpu.py", "tests/cute_kernels/hopper/test_fp8_gemm.py",
            "tests/cute_kernels/hopper/test_decode_attention.py", "tests/cute_kernels/hopper/test_prefill_attention.py"} <= set(tests)
    for t in tests:  # every GPU test file collects GPU tests with the packages blocked
        assert int(rows[("tests", t)].split()[0]) > 0, (t, rows[("tests", t)])
    for family, kind, _label, _seconds, *cmd in steps:
        if kind == "smoke":
            assert rows[("smoke", " ".join(cmd))].startswith("3 checks"), family
        if kind == "bench":
            assert int(rows[("bench", " ".join(cmd))].split()[0]) > 0, cmd
    assert [s[0] for s in steps if s[1] == "smoke"] == ["decode", "fused", "fp8", "prefill"]


def test_the_blocker_behaves_like_a_missing_package():
    code = ("import importlib.util as u\n"
            "assert u.find_spec('cutlass') is None and u.find_spec('gguf.quants') is None\n"
            "assert u.find_spec('torch') is not None\n"
            "try:\n    import gguf\nexcept ImportError as e:\n    print('blocked:', e)\n")
    run = helper("--run", "-c", code, timeout=60)
    assert run.returncode == 0 and BLOCKED in run.stdout, run.stdout + run.stderr


def test_a_module_level_gguf_import_on_the_engine_path_fails_the_check():
    pytest.importorskip("gguf", reason="the control half imports the engine with gguf present")
    code = PUT_THE_BUG_BACK + "import runtime.build\n"
    control = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert control.returncode == 0, control.stderr  # with gguf installed the engine imports ...
    run = helper("--run", "-c", code, timeout=120)  # ... on the GPU image it does not
    assert run.returncode != 0 and f"No module named 'gguf' {BLOCKED}" in run.stderr, run.stderr[-2000:]
    check = helper("--prelude", PUT_THE_BUG_BACK)  # and the whole check names it
    assert check.returncode == 1, check.stdout[-3000:]
    failures = [line for line in check.stdout.splitlines() if line.startswith("FAIL")]
    assert any("runtime.build" in f and "gguf" in f for f in failures), failures
    assert any("tests/runtime/accel/test_engine_gpu.py" in f for f in failures), failures
