"""The chat page in real headless Chromium against a real `python -m runtime.serve` on the default model."""
import os
import re
import shutil

import httpx
import pytest

from tests.server_utils import REPO, serve_subprocess

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = os.path.join(REPO, "test-artifacts")

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (.ci/run installs it)")


def kv_used(page) -> int:
    return int(page.locator("#kv-used").inner_text())


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(re.search(rf"^cute_serve:{name} (\S+)$", text, re.M).group(1))


def last_bot(page):
    return page.locator('#chat [data-testid="bot"]').last


def send(page, text: str) -> None:
    """Type and press Enter, as a user would: again if the page was still closing the previous turn
    (Gradio drops a submit while the last event is pending; the typed text stays in the box)."""
    from playwright.sync_api import TimeoutError as PageTimeout

    before = page.locator('#chat [data-testid="user"]').count()
    box = page.locator("#msg textarea")
    box.fill(text)
    for _ in range(5):
        box.press("Enter")
        try:
            page.wait_for_function(f"() => document.querySelectorAll('#chat [data-testid=user]').length > {before}",
                                   timeout=3_000)
            return
        except PageTimeout:
            assert box.input_value() == text  # nothing the user typed is lost
    raise AssertionError("the message was never taken")


def test_chat_streams_shows_metrics_and_stop_frees_blocks():
    from playwright.sync_api import expect, sync_playwright

    with serve_subprocess("--kv-cache-memory", "256MiB") as (url, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url + "/")
        page.locator("#msg textarea").wait_for(timeout=60_000)
        page.get_by_text("About this engine").click()
        expect(page.locator("#about")).to_contain_text("torch reference")
        expect(page.locator("#about")).to_contain_text("KiB/token")

        # an empty message does nothing
        page.locator("#msg textarea").press("Enter")
        page.wait_for_timeout(500)
        assert page.locator('#chat [data-testid="user"]').count() == 0

        # a long reply streams; the KV panel shows blocks in use; Stop aborts it and frees them
        send(page, "Write a very long story about a dragon who learns to bake bread. Make it at least 20 paragraphs.")
        expect(last_bot(page)).not_to_be_empty(timeout=60_000)
        first = last_bot(page).inner_text()
        page.wait_for_function("() => parseInt(document.querySelector('#kv-used').innerText) > 0", timeout=20_000)
        page.wait_for_timeout(1500)
        assert len(last_bot(page).inner_text()) > len(first)  # successive partial texts: it streams
        page.locator("#stop").click()
        page.wait_for_function("() => parseInt(document.querySelector('#kv-used').innerText) === 0", timeout=20_000)
        assert metric(url, "kv_cache_used_blocks") == 0
        expect(last_bot(page)).to_contain_text("(stopped)")

        # a short question: the reply shows TTFT/TPOT beneath it
        send(page, "What is the capital of France?")
        expect(last_bot(page)).to_contain_text("TTFT", timeout=120_000)
        expect(last_bot(page)).to_contain_text("tok/s")
        os.makedirs(ARTIFACTS, exist_ok=True)
        page.screenshot(path=os.path.join(ARTIFACTS, "chat.png"), full_page=True)

        # a paste longer than the context gets a clear message, and the page keeps working
        send(page, "lorem ipsum dolor " * 4000)
        expect(last_bot(page)).to_contain_text("context", timeout=60_000)
        send(page, "Say hello.")
        expect(last_bot(page)).to_contain_text("TTFT", timeout=120_000)
        assert httpx.get(url + "/health").status_code == 200
        browser.close()
