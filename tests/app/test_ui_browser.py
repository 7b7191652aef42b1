"""The chat page in real headless Chromium against a real `python -m runtime.serve` on the default model."""
import os
import re
import shutil
import time

import httpx
import pytest

from tests.server_utils import REPO, serve_subprocess, wait_for_chat_page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = os.path.join(REPO, "test-artifacts")

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (.ci/run installs it)")


def kv_used(page) -> int:
    return int(page.locator("#kv-used").inner_text())


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M).group(1))


def last_bot(page):
    return page.locator('#chat [data-testid="bot"]').last


def send(page, text: str, timeout_s: float = 180.0) -> None:
    """Type and press Enter, as a user would, then wait for the message to show in the chat. A box
    that still holds the text after a while means Gradio dropped the submit (the previous turn was
    still closing): press Enter again. A cleared box means the message was taken and is only slow
    to render on a loaded machine: keep waiting (trigger_mode "once" never sends it twice)."""
    from playwright.sync_api import TimeoutError as PageTimeout

    before = page.locator('#chat [data-testid="user"]').count()
    box = page.locator("#msg textarea")
    box.fill(text)
    box.press("Enter")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            page.wait_for_function(f"() => document.querySelectorAll('#chat [data-testid=user]').length > {before}",
                                   timeout=5_000)
            return
        except PageTimeout:
            if time.monotonic() > deadline:
                raise AssertionError(f"the message never showed in the chat within {timeout_s:.0f} s") from None
            if box.input_value() == text:
                box.press("Enter")


LAST_BOT_CHARS = ("(() => { const b = document.querySelectorAll('#chat [data-testid=bot]'); "
                  "return b[b.length - 1].innerText.length })()")
# a latency chart (Vega SVG inside Gradio's LinePlot, by its element id): line marks with two or
# more points, and the legend's labels, laid out inside the plot's box where the user sees them
CHART_LINES = """(id) => [...document.querySelectorAll(`#${id} g.mark-line path`)]
    .filter(p => (p.getAttribute('d') || '').includes('L')).length"""
CHART_LEGEND = """(id) => { const box = document.querySelector(`#${id}`).getBoundingClientRect();
    return [...document.querySelectorAll(`#${id} g.role-legend-label text`)]
        .filter(t => { const r = t.getBoundingClientRect();
                       return r.height > 0 && r.top >= box.top && r.bottom <= box.bottom; })
        .map(t => t.textContent) }"""


def test_chat_streams_shows_metrics_and_stop_frees_blocks():
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # a loaded 2-core machine renders slowly; every wait is on what the user sees
    with serve_subprocess("--kv-cache-memory", "256MiB") as (url, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        wait_for_chat_page(url)
        page.goto(url + "/")
        page.locator("#msg textarea").wait_for(timeout=120_000)
        page.get_by_text("About this engine").click()
        expect(page.locator("#about")).to_contain_text("torch reference")
        expect(page.locator("#about")).to_contain_text("KiB/token")
        expect(page.locator("#about")).to_contain_text("kv role both")
        # a ladder of this model if this checkout has measured one, else why none shows and how to make one
        expect(page.locator("#about-ladder")).to_contain_text(re.compile(r"Optimization ladder( of |: )"))

        # an empty message does nothing
        page.locator("#msg textarea").press("Enter")
        page.wait_for_timeout(500)
        assert page.locator('#chat [data-testid="user"]').count() == 0

        # a long reply streams; the KV panel shows blocks in use; Stop aborts it and frees them
        send(page, "Write a very long story about a dragon who learns to bake bread. Make it at least 20 paragraphs.")
        expect(last_bot(page)).not_to_be_empty(timeout=120_000)
        first = len(last_bot(page).inner_text())
        page.wait_for_function("() => parseInt(document.querySelector('#kv-used').innerText) > 0")
        page.wait_for_function(f"() => {LAST_BOT_CHARS} > {first}")  # successive partial texts: it streams
        page.locator("#stop").click()
        page.wait_for_function("() => parseInt(document.querySelector('#kv-used').innerText) === 0")
        assert metric(url, "cute_serve:kv_cache_tier_used_blocks") == 0
        expect(last_bot(page)).to_contain_text("(stopped)")

        # a short question: the reply shows TTFT/TPOT beneath it
        send(page, "What is the capital of France?")
        expect(last_bot(page)).to_contain_text("TTFT", timeout=180_000)
        expect(last_bot(page)).to_contain_text("tok/s")

        # a paste longer than the context gets a clear message, and the page keeps working
        send(page, "lorem ipsum dolor " * 4000)
        expect(last_bot(page)).to_contain_text("context", timeout=120_000)
        send(page, "Say hello.")
        expect(last_bot(page)).to_contain_text("TTFT", timeout=180_000)

        # after those replies the latency charts draw TTFT and TPOT over time and name their series
        for plot in ("ttft-plot", "tpot-plot"):
            page.wait_for_function(f"({CHART_LINES})('{plot}') >= 2", timeout=60_000)
            page.wait_for_function(f"({CHART_LEGEND})('{plot}').length === 2")
            assert page.evaluate(CHART_LEGEND, plot) == ["P50", "P95"]
        os.makedirs(ARTIFACTS, exist_ok=True)
        page.screenshot(path=os.path.join(ARTIFACTS, "chat.png"), full_page=True)
        assert httpx.get(url + "/health").status_code == 200
        browser.close()
