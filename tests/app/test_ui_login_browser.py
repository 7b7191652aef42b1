"""With --api-key, the chat page in real headless Chromium: sent to /login, signed in with the key,
then a chat turn streams through the page's Gradio API on the session cookie alone."""
import os

import pytest

from app.ui import prepare_chat_ui
from tests.app.test_ui_browser import ARGS, CHROMIUM, last_bot, send
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (.ci/run installs it)")


def test_sign_in_then_chat():
    from playwright.sync_api import expect, sync_playwright

    with live_server(tiny_engine(), ui=prepare_chat_ui, api_key="k3y") as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.goto(srv.url + "/")
        assert page.url == srv.url + "/login"
        page.fill("#key", "wrong")
        page.click("#sign-in")
        expect(page.locator("#error")).to_have_text("wrong key")
        page.fill("#key", "k3y")
        page.click("#sign-in")
        page.locator("#msg textarea").wait_for(timeout=30_000)
        send(page, "hello")
        expect(last_bot(page)).to_contain_text("TTFT", timeout=30_000)
        browser.close()
