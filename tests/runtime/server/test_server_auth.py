"""--api-key on a real server with the chat page mounted: every route but /health wants the key, the
page's Gradio API included (it used to generate text for anyone); a browser signs in once at /login.
The page takes no uploads, and a malformed Gradio call costs one log line, not a traceback."""
import logging

import httpx
import pytest

from app.ui import prepare_chat_ui
from runtime.server.guards.auth import COOKIE
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

KEY = "s3cret-key"
BEARER = {"Authorization": f"Bearer {KEY}"}
CALL = "/gradio_api/call/respond"
# message, chat shown, conversation, system prompt, temperature, top_p, max tokens, seed, speculative, JSON mode
TURN = ["Write a limerick", [], [], "", 0, 1, 8, -1, False, False]
GUARDED = [("GET", "/v1/models"), ("POST", "/v1/completions"), ("GET", "/metrics"), ("GET", "/docs"),
           ("GET", "/openapi.json"), ("GET", "/"), ("GET", "/config"), ("GET", "/gradio_api/info"),
           ("POST", CALL), ("POST", "/gradio_api/queue/join"), ("POST", "/gradio_api/upload"),
           ("GET", "/gradio_api/heartbeat/x"), ("POST", "/gradio_api/cancel"), ("GET", "/theme.css")]


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine(), ui=prepare_chat_ui, api_key=KEY) as srv:
        yield srv


def chat_turn(url: str, **auth) -> httpx.Response:
    """The chat page's turn through Gradio's call route: POST the inputs, then GET the event's stream."""
    started = httpx.post(url + CALL, json={"data": TURN}, **auth)
    if started.status_code != 200:
        return started
    return httpx.get(f"{url}{CALL}/{started.json()['event_id']}", timeout=30, **auth)


def test_the_chat_pages_api_wants_the_key(server):
    refused = chat_turn(server.url)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    served = chat_turn(server.url, headers=BEARER)
    assert served.status_code == 200 and "event: complete" in served.text and "TTFT" in served.text
    server.wait_idle()


@pytest.mark.parametrize("method,path", GUARDED)
def test_every_route_but_health_wants_the_key(server, method, path):
    r = httpx.request(method, server.url + path, json={})
    assert r.status_code == 401, (path, r.status_code, r.text[:200])
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(server.url + "/health").status_code == 200


def test_the_scheme_is_matched_in_any_case_and_the_key_exactly(server):
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert httpx.get(server.url + "/v1/models", headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200
    for value in (f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer", KEY, f"Bearer  {KEY} extra"):
        assert httpx.get(server.url + "/v1/models", headers={"Authorization": value}).status_code == 401, value


def test_a_browser_is_sent_to_sign_in_and_its_cookie_opens_every_route(server):
    page = httpx.get(server.url + "/", headers={"Accept": "text/html"})
    assert page.status_code == 303 and page.headers["location"] == "/login"
    assert 'type="password"' in httpx.get(server.url + "/login").text
    wrong = httpx.post(server.url + "/login", data={"key": "nope"})
    assert wrong.status_code == 401 and COOKIE not in wrong.headers.get("set-cookie", "")
    signed = httpx.post(server.url + "/login", data={"key": KEY})
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and KEY not in cookie
    jar = {COOKIE: signed.cookies[COOKIE]}
    assert httpx.get(server.url + "/", cookies=jar).status_code == 200
    assert httpx.get(server.url + "/v1/models", cookies=jar).status_code == 200
    assert chat_turn(server.url, cookies=jar).status_code == 200
    tampered = jar[COOKIE][:-1] + ("0" if jar[COOKIE][-1] != "0" else "1")
    assert httpx.get(server.url + "/v1/models", cookies={COOKIE: tampered}).status_code == 401
    server.wait_idle()


def test_the_page_takes_no_uploads(server):
    r = httpx.post(server.url + "/gradio_api/upload", headers=BEARER, files={"files": ("a.txt", b"x" * 1000)})
    assert r.status_code == 404 and r.json()["error"]["code"] == "uploads_disabled"


def test_a_malformed_gradio_call_is_one_log_line(server, caplog, capfd):
    caplog.set_level(logging.WARNING, "cute_serve")
    for data in (["hi"], ["hi", "not a list", [], "", "abc", 1, 8, -1, False]):
        r = httpx.post(server.url + CALL, json={"data": data}, headers=BEARER)
        event = httpx.get(f"{server.url}{CALL}/{r.json()['event_id']}", headers=BEARER, timeout=30)
        assert "event: error" in event.text
    assert "Traceback" not in capfd.readouterr().err
    lines = [r.getMessage() for r in caplog.records if "bad input" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines)


def test_metrics_public_opens_metrics_only():
    with live_server(tiny_engine(num_blocks=8), api_key=KEY, metrics_public=True) as srv:
        assert httpx.get(srv.url + "/metrics").status_code == 200
        assert httpx.get(srv.url + "/v1/models").status_code == 401
