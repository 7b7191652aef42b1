"""schemathesis against our /openapi.json (the /v1 routes), bounded: no 5xx, every response (SSE events
included) as documented, invalid input rejected; afterwards the server is alive and nothing leaked."""
import os
import shutil
import subprocess
import sysconfig

import httpx
import pytest
import schemathesis

from tests.server_utils import REPO, live_server
from tests.tiny_engine import tiny_engine

# Every check, ST202 (positive_data_acceptance: schema-valid requests are accepted) and ST204
# (unsupported_method) included; tests/runtime/server/openai/schemathesis_hooks.py lets through only the 400s for rules no
# static schema can state (the prompt's token count against the context, ...), each by its code.
CHECKS = ["--checks", "all"]
HOOKS = {"SCHEMATHESIS_HOOKS": "tests.runtime.server.openai.schemathesis_hooks", "PYTHONPATH": REPO}


def schemathesis_cli() -> str:
    path = os.path.join(sysconfig.get_path("scripts"), "schemathesis")
    return path if os.path.exists(path) else shutil.which("schemathesis")


@pytest.fixture(scope="module")
def server():
    # a short context keeps every generated request cheap (at most 48 tokens) yet fits most chat prompts
    with live_server(tiny_engine(max_model_len=48), max_queue=64) as srv:
        yield srv


def test_schemathesis_finds_nothing_and_the_server_survives(server, tmp_path):
    cmd = [schemathesis_cli(), "run", server.url + "/openapi.json", "--include-path-regex", "^/v1", *CHECKS,
           "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--seed", "1", "--workers", "1",
           "--no-color"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, **HOOKS})
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout.split("SUMMARY")[-1], res.stdout[-3000:]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    server.wait_idle()


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": ["ab", "cd"], "n": 2, "max_tokens": 4, "stream": True, "logprobs": 2,
                         "stream_options": {"include_usage": True}, "echo": False}),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 4, "echo": True, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "n": 2,
                              "max_tokens": 4, "stream": True, "logprobs": True, "top_logprobs": 3,
                              "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": True}),
])
def test_responses_and_every_sse_event_match_the_documented_schemas(server, path, body):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    case = schema[path]["POST"].Case(body=body)
    response = case.call()
    assert response.status_code == 200
    case.validate_response(response)  # raises with the offending event if one does not match
