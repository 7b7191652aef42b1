"""Wrong API keys are rate-limited per client address (a token bucket): an attack guessed ~430 keys a
second. After the burst every key check from that address gets 429 with Retry-After, the right key
too, until tokens come back; /login shares the bucket; clients with the key are never slowed."""
import time

import httpx
import pytest

from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

KEY = "s3cret-key"
RIGHT, WRONG = {"Authorization": f"Bearer {KEY}"}, {"Authorization": "Bearer guess"}


@pytest.fixture
def server():
    with live_server(tiny_engine(num_blocks=64), api_key=KEY, auth_rate=2.0, auth_burst=5) as srv:
        yield srv


def test_wrong_bearer_keys_get_429_with_retry_after_after_the_burst(server):
    models = server.url + "/v1/models"
    for _ in range(60):  # with the key: never limited
        assert httpx.get(models, headers=RIGHT).status_code == 200
    started = time.monotonic()
    with httpx.Client() as client:
        codes = [client.get(models, headers=WRONG).status_code for _ in range(40)]
    allowed = 5 + 2.0 * (time.monotonic() - started) + 1  # the burst, then 2 a second
    assert codes[:5] == [401] * 5 and codes.count(401) <= allowed and codes.count(429) >= 40 - allowed
    throttled = httpx.get(models, headers=RIGHT)
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
    assert throttled.json()["error"]["code"] == "too_many_key_failures"
    time.sleep(int(throttled.headers["retry-after"]) + 0.2)
    assert httpx.get(models, headers=RIGHT).status_code == 200


@pytest.fixture
def slow_refill():
    """A token back every 20 s: however slowly a busy machine sends the guesses, none refills the bucket."""
    with live_server(tiny_engine(num_blocks=64), api_key=KEY, auth_rate=0.05, auth_burst=5) as srv:
        yield srv


def test_login_guesses_share_the_bucket(slow_refill):
    server = slow_refill
    codes = [httpx.post(server.url + "/login", data={"key": f"guess{i}"}).status_code for i in range(12)]
    assert codes[:5] == [401] * 5 and 429 in codes
    r = httpx.post(server.url + "/login", data={"key": KEY})
    assert r.status_code == 429 and r.headers["retry-after"]
    assert httpx.get(server.url + "/v1/models", headers=WRONG).status_code == 429
