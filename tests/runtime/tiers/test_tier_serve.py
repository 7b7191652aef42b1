"""`python -m runtime.serve --kv-disk-path` as users restart it: SIGTERM writes the cached prefix blocks
out, and the next server on the same directory answers the same prompt from them with the same tokens."""
import httpx
import pytest

from runtime.tiers.disk_tier import SLOTS_NAME
from runtime.tiers.slot_file import SlotFile
from tests.runtime.server.test_server_metrics import V
from tests.runtime.tiers.tier_workload import PROMPTS
from tests.server_utils import serve_subprocess, write_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))


def complete(url: str) -> list[int]:
    body = {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"]


def external_hits(url: str) -> float:
    line = next(li for li in httpx.get(url + "/metrics").text.splitlines()
                if li.startswith(V + "external_prefix_cache_hits_total{"))
    return float(line.rsplit(" ", 1)[1])


def test_a_restarted_server_answers_from_the_disk_tier(tiny_model, tmp_path):
    args = ("--model", tiny_model, "--kv-cache-memory", "8MiB", "--kv-disk-path", str(tmp_path))
    with serve_subprocess(*args, timeout=120) as (url, _):
        cold = complete(url)
        assert external_hits(url) == 0
    slots = SlotFile(str(next(tmp_path.glob(f"*/{SLOTS_NAME}"))))
    assert len(slots.scan()) >= len(PROMPTS[0]) // 16  # SIGTERM wrote the prefix out
    slots.close()
    with serve_subprocess(*args, timeout=120) as (url, log):
        assert complete(url) == cold
        assert external_hits(url) >= 16 * (len(PROMPTS[0]) // 16)
        assert "disk" in log()  # the ledger names the tier
