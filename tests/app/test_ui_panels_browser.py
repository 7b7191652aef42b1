"""The chat page's panels in real headless Chromium, against an in-process server over a tiny engine
whose prefill steps are slowed past a second (so every TTFT is over 1 s, whatever the machine): the
reply's footer and the TTFT chart read in seconds with every y-axis label inside its chart, the TPOT
chart in milliseconds; the stats row names the proposer and its acceptance as the engine counts it;
the About panel shows the ladder of the served model with its machine and date, and refuses a smoke
run once the page is reloaded."""
import json
import os
import re
import time
from functools import partial

import pytest
import torch

from app.panel import acceptance_text
from app.ui import prepare_chat_ui
from profiling.common.ladder_files import run_record
from tests.app.test_ui_browser import ARGS, ARTIFACTS, CHROMIUM, last_bot, send
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (.ci/run installs it)")

SLOW_PREFILL_S = 1.2

# a chart's y axis as the user sees it: its title, and each label with whether it lies inside the
# chart's SVG (a clipped label starts left of it) and clear of the title
Y_AXIS = """(id) => { const svg = document.querySelector(`#${id} svg`);
    const axis = svg && [...svg.querySelectorAll('g.role-axis')]
        .find(g => (g.getAttribute('aria-label') || '').startsWith('Y-axis'));
    if (!axis) return null;
    const box = svg.getBoundingClientRect(), title = axis.querySelector('g.role-axis-title text');
    const edge = title ? title.getBoundingClientRect().right : box.left;
    return {title: title ? title.textContent : null,
            labels: [...axis.querySelectorAll('g.role-axis-label text')].map(t => { const r = t.getBoundingClientRect();
                return {text: t.textContent, inside: r.width > 0 && r.left >= Math.max(box.left, edge) && r.right <= box.right}; })} }"""
DRAWN = "(id) => [...document.querySelectorAll(`#${id} g.mark-line path`)].some(p => (p.getAttribute('d') || '').includes('L'))"


def slowed(engine):
    """Each step that takes in a waiting request sleeps first: its first token comes past SLOW_PREFILL_S."""
    step = engine.step

    def slow_step():
        if engine.scheduler.waiting:
            time.sleep(SLOW_PREFILL_S)
        return step()

    engine.step = slow_step
    return engine


def ladder_report(engine, smoke: bool) -> dict:
    """What optimization_ladder.py writes, for the engine's model (rungs made up)."""
    rungs = [{"rung": "1 static batching", "output_tok_s": 20.0, "speedup": 1.0, "kv_waste": 0.62},
             {"rung": "2 + continuous, paged KV", "output_tok_s": 25.0, "speedup": 1.25, "kv_waste": 0.01}]
    return {"model": "tiny-checkpoint", **run_record(engine.model_config, torch.device("cpu"), smoke),
            "workload": {"requests": 16}, "max_num_seqs": 8, "rungs": rungs}


def y_axis(page, plot: str, title: str) -> list[dict]:
    """The labels of the chart's y axis once it is drawn with that title."""
    page.wait_for_function(f"(() => {{ const a = ({Y_AXIS})('{plot}'); return a && a.title === '{title}' "
                           "&& a.labels.length > 1 })", timeout=60_000)
    page.wait_for_function(f"({DRAWN})('{plot}')", timeout=60_000)
    return page.evaluate(Y_AXIS, plot)["labels"]


def test_panels_read_in_seconds_name_the_proposer_and_show_the_served_models_ladder(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # a loaded 2-core machine renders slowly; every wait is on what the user sees
    engine = slowed(tiny_engine(speculative="ngram"))
    ladder = tmp_path / "ladder.json"
    ladder.write_text(json.dumps(ladder_report(engine, smoke=False)))
    ui = partial(prepare_chat_ui, ladder_path=str(ladder))
    with live_server(engine, ui=ui) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        page.goto(srv.url + "/")
        page.locator("#msg textarea").wait_for(timeout=120_000)

        send(page, "abc abc abc abc abc abc")
        expect(last_bot(page)).to_contain_text("tok/s", timeout=120_000)
        footer = re.search(r"TTFT (\d+\.\d\d) s", last_bot(page).inner_text())
        assert footer and float(footer.group(1)) >= SLOW_PREFILL_S, last_bot(page).inner_text()

        ttft = y_axis(page, "ttft-plot", "TTFT (s)")
        assert all(label["inside"] for label in ttft), ttft
        tpot = y_axis(page, "tpot-plot", "TPOT (ms)")
        assert all(label["inside"] for label in tpot), tpot
        expect(page.locator("#live-stats")).to_contain_text(re.compile(r"TTFT p50/p95 \d+\.\d\d s"))

        srv.wait_idle()
        s = srv.async_engine.snapshot()
        assert s.spec_proposed > 0  # the first request's sampling is seeded by the engine: drafts every run
        stats = page.locator("#live-stats")
        expect(stats).to_contain_text("ngram, 4 tokens a step")
        expect(stats).to_contain_text(acceptance_text(s))

        page.get_by_text("About this engine").click()
        about = page.locator("#about-ladder")
        expect(about).to_contain_text("Optimization ladder of tiny-checkpoint")
        expect(about).to_contain_text(f"measured on {ladder_report(engine, False)['machine']}")
        expect(about).to_contain_text(re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"))
        expect(about).to_contain_text("1.25x")
        os.makedirs(ARTIFACTS, exist_ok=True)
        page.screenshot(path=os.path.join(ARTIFACTS, "chat-panels.png"), full_page=True)

        ladder.write_text(json.dumps(ladder_report(engine, smoke=True)))  # a smoke run's record: refused
        page.reload()
        page.get_by_text("About this engine").click()
        expect(about).to_contain_text("--smoke run of a tiny test model, not shown")
        expect(about).not_to_contain_text("1.25x")
        browser.close()
