"""The lint the README's test command runs first (`python -m ruff check .`, configured in pyproject.toml):
the tree is clean, and a name broken in any package's module is reported (a copy of the module with one
undefined name, checked with the project's own settings)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=120)


def test_the_tree_is_clean():
    run = ruff(".")
    assert run.returncode == 0, run.stdout[-3000:]


@pytest.mark.parametrize("module", ["runtime/engine.py", "weights/gguf_file.py", "structured/spec.py",
                                    "cute_kernels/cpu/build.py", "app/panel.py"])
def test_a_broken_name_fails_the_lint(module, tmp_path):
    source = REPO / module
    if not source.exists():
        pytest.fail(f"{module} moved: point this test at another module of the package")
    copy = tmp_path / source.name
    shutil.copy(source, copy)
    copy.write_text(copy.read_text() + "\n\ndef _broken() -> object:\n    return name_that_is_not_defined\n")
    run = ruff("--config", str(REPO / "pyproject.toml"), str(copy))
    assert run.returncode != 0 and "F821" in run.stdout, run.stdout
