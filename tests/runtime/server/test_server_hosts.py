"""Which Host names and web origins the server answers, on a real server with the chat page mounted:
other Host names get 400 (DNS rebinding), and no foreign origin gets a CORS grant, from the API or
from the Gradio page (which on its own grants any http://localhost:* origin, credentials included)."""
import httpx
import pytest

from app.ui import prepare_chat_ui
from runtime.server.options import LOCAL_HOSTS
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

PATHS = ["/v1/models", "/health", "/", "/gradio_api/info", "/docs"]


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine(), ui=prepare_chat_ui, allowed_hosts=(*LOCAL_HOSTS, "box.lan"),
                     allowed_origins=("http://tools.test",)) as srv:
        yield srv


def port(server) -> str:
    return server.url.rsplit(":", 1)[1]


@pytest.mark.parametrize("path", PATHS)
def test_a_foreign_host_name_is_refused_everywhere(server, path):
    for host in ("attacker.example", f"attacker.example:{port(server)}", "127.0.0.1.nip.io"):
        r = httpx.get(server.url + path, headers={"Host": host})
        assert r.status_code == 400 and "Invalid host header" in r.text, (host, r.status_code)
    for host in ("localhost", "127.0.0.1", "[::1]", "box.lan", "BOX.lan"):  # this machine's, and --allowed-hosts
        r = httpx.get(server.url + path, headers={"Host": f"{host}:{port(server)}"})
        assert r.status_code == 200, (host, r.status_code)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("origin", ["http://localhost:9999", "http://attacker.example", "null"])
def test_a_foreign_origin_gets_no_cors_grant(server, path, origin):
    headers = {"Host": f"localhost:{port(server)}", "Origin": origin}
    r = httpx.get(server.url + path, headers=headers)
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers and "access-control-allow-credentials" not in r.headers
    pre = httpx.options(server.url + path, headers={**headers, "Access-Control-Request-Method": "POST",
                                                    "Access-Control-Request-Headers": "authorization"})
    assert "access-control-allow-origin" not in pre.headers, pre.headers


def test_an_allowed_origin_may_call_the_api_without_cookies(server):
    origin = {"Origin": "http://tools.test"}
    pre = httpx.options(server.url + "/v1/chat/completions",
                        headers={**origin, "Access-Control-Request-Method": "POST",
                                 "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://tools.test"
    assert "x-stainless-os" in pre.headers["access-control-allow-headers"].lower()
    r = httpx.get(server.url + "/v1/models", headers=origin)
    assert r.headers["access-control-allow-origin"] == "http://tools.test"
    assert "access-control-allow-credentials" not in r.headers
