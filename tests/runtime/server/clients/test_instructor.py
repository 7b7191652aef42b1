"""instructor as its users start: from_openai(...) with a response_model in tools and json_schema
modes, and create_partial streaming, run by instructor's own interpreter (its jiter pin conflicts
with the newest openai SDK): .venvs/instructor, or $INSTRUCTOR_PYTHON."""
import json
import os
import subprocess
import sys

import pytest

from tests.runtime.server.clients.conftest import CITIES
from tests.server_utils import REPO

PYTHON = os.environ.get("INSTRUCTOR_PYTHON", os.path.join(REPO, ".venvs", "instructor", "bin", "python"))
SETUP = f"{sys.executable} -m venv .venvs/instructor && .venvs/instructor/bin/pip install instructor==1.17.0"


def run_instructor(base_url: str, model: str, *task: str, timeout: float = 120) -> dict:
    """What instructor_client.py prints, run by instructor's interpreter."""
    if not os.path.exists(PYTHON):
        pytest.fail(f"instructor's interpreter {PYTHON} is missing: run `{SETUP}` (the README's test command does)")
    script = os.path.join(os.path.dirname(__file__), "instructor_client.py")
    done = subprocess.run([PYTHON, script, base_url, model, *task], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def answers(base_url, model) -> dict:
    return run_instructor(base_url, model)


@pytest.mark.parametrize("mode", ["tool_call", "json_schema_mode"])
def test_a_response_model_comes_back_validated(answers, mode):
    city = answers[mode]
    assert city["type"] == "City" and city["name"] in CITIES and 0 <= city["population"] <= 99


def test_create_partial_streams_growing_models(answers):
    partial = answers["partial"]
    assert partial["count"] > 2 and partial["last"]["name"] in CITIES
