"""runtime sets OpenMP's barrier spin count before torch loads libgomp, and never overrides a user's."""
import os
import subprocess
import sys

import pytest

from runtime import omp_wait
from tests.paths import REPO

ROOT = str(REPO)


def spin_count_seen(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run([sys.executable, "-c", code + "; import os; print(os.environ.get('GOMP_SPINCOUNT'))"],
                         capture_output=True, text=True, check=True, cwd=ROOT, env={**clean, **env})
    return out.stdout.strip().splitlines()[-1]


def test_importing_runtime_sets_the_spin_count():
    assert spin_count_seen("import runtime") == omp_wait.SPIN_COUNT


def test_a_user_setting_wins():
    assert spin_count_seen("import runtime", GOMP_SPINCOUNT="7") == "7"


def test_too_late_once_torch_is_loaded():
    """libgomp has read its environment by then: setting it would only mislead."""
    assert spin_count_seen("import torch, runtime") == "None"


@pytest.mark.parametrize("module", ["runtime.serve", "runtime.generate"])
def test_entry_points_import_runtime_before_torch(module):
    assert spin_count_seen(f"import {module}") == omp_wait.SPIN_COUNT
