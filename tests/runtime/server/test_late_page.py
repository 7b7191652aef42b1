"""The chat page mounts after the server answers (runtime/server/late_page.py): /health and completions
are served while it loads, its paths say it is loading, and once mounted it chats as before; a page
that fails to load leaves the API serving."""
import threading

import httpx

from app.ui import prepare_chat_ui
from runtime.server.late_page import MountPage
from tests.runtime.server.test_server_auth import CALL, TURN
from tests.server_utils import TINY_MODEL, live_server, settled_chat_page, wait_for_chat_page
from tests.tiny_engine import tiny_engine

HTML = {"Accept": "text/html"}


def completion(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 3,
                                                     "ignore_eos": True}, timeout=30)


def test_the_api_serves_before_the_page_mounts_and_the_page_chats_after():
    release = threading.Event()

    def held_ui(app, engine) -> MountPage:  # the page's thread waits until the test has looked
        release.wait(60)
        return prepare_chat_ui(app, engine)

    with live_server(tiny_engine(), ui=held_ui, wait_for_page=False) as srv:
        try:
            assert httpx.get(srv.url + "/health").json() == {"status": "ok", "chat_page": "loading"}
            assert completion(srv.url).json()["usage"]["completion_tokens"] == 3
            page = httpx.get(srv.url + "/", headers=HTML)
            assert page.status_code == 503 and page.headers["retry-after"] == "1"
            assert 'http-equiv="refresh"' in page.text  # a browser reloads until the page is there
            api = httpx.get(srv.url + "/gradio_api/info")
            assert api.status_code == 503 and api.json()["error"]["code"] == "chat_page_loading"
            assert httpx.get(srv.url + "/v1/completions").status_code == 405  # API paths stay the API's
        finally:
            release.set()
        wait_for_chat_page(srv.url)
        page = httpx.get(srv.url + "/", headers=HTML)
        assert page.status_code == 200 and "gradio" in page.text.lower()
        started = httpx.post(srv.url + CALL, json={"data": TURN})  # Gradio's queue runs: the lifespan was entered
        turn = httpx.get(f"{srv.url}{CALL}/{started.json()['event_id']}", timeout=30)
        assert "event: complete" in turn.text and "TTFT" in turn.text
        upload = httpx.post(srv.url + "/gradio_api/upload", files={"files": ("a.txt", b"x")})
        assert upload.status_code == 404 and upload.json()["error"]["code"] == "uploads_disabled"
        assert httpx.get(srv.url + "/v1/nothing").json()["error"]["type"] == "not_found_error"
        srv.wait_idle()


def test_a_page_that_fails_to_load_leaves_the_api_serving():
    def broken_ui(app, engine) -> MountPage:
        raise ImportError("no module named 'gradio'")

    with live_server(tiny_engine(), ui=broken_ui, wait_for_page=False) as srv:
        assert settled_chat_page(srv.url) == "failed"
        page = httpx.get(srv.url + "/", headers=HTML)
        assert page.status_code == 500 and "no module named 'gradio'" in page.json()["error"]["message"]
        assert completion(srv.url).status_code == 200


def test_a_server_stopped_while_the_page_loads_stops_at_once():
    release = threading.Event()

    def stuck_ui(app, engine) -> MountPage:
        release.wait(60)
        raise RuntimeError("released")

    try:
        with live_server(tiny_engine(), ui=stuck_ui, wait_for_page=False) as srv:
            assert httpx.get(srv.url + "/health").json()["chat_page"] == "loading"
        # serve_app raises if the server's thread outlives its exit: the lifespan did not wait for the page's
    finally:
        release.set()
