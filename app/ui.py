"""The Gradio Blocks page: chat on the left, the engine's live panel on the right."""
from __future__ import annotations

import os

import gradio as gr
from fastapi import FastAPI

from app.block_map import BELOW_COLOR, BELOW_NAME, STATE_COLORS, STATE_NAMES
from app.chat import ChatSessions, ChatSettings, reply
from app.gradio_guards import quiet_input_errors, refuse_uploads
from app.ladder_summary import LADDER_JSON, ladder_markdown, model_identity
from app.latency_chart import CHARTS, X_LIM, Chart, latency_chart
from app.panel import LivePanel
from runtime.server.async_engine import AsyncEngine
from runtime.server.late_page import MountPage
from runtime.server.metrics import ServerMetrics

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def about_markdown(engine: AsyncEngine) -> str:
    d = engine.describe()
    settings = " · ".join(f"**{k}** {d[k]}" for k in ("dtype", "device", "backend", "block size", "scheduler",
                                                     "prefix caching", "speculative", "tensor parallel", "kv role",
                                                     "weights"))
    return f"**Model** {d['model']}  \n{settings}  \n**Memory ledger** {d['memory ledger']}"


def legend_html() -> str:
    cells = "".join(f'<span style="display:inline-block;width:10px;height:10px;background:rgb{tuple(c)};'
                    f'margin:0 4px 0 10px"></span>{n}' for n, c in zip(STATE_NAMES, STATE_COLORS[:4].tolist()))
    cells += (f'<span style="display:inline-block;width:10px;height:10px;background:rgb{BELOW_COLOR};'
              f'border-radius:5px;margin:0 4px 0 10px"></span>{BELOW_NAME}')
    return f"<div style='font-size:12px'>{cells}</div>"


def chart_update(chart: Chart) -> gr.LinePlot:
    """A new y range or unit rebuilds the chart's layout around its labels (app/latency_chart.py)."""
    return gr.LinePlot(chart.frame, y_lim=chart.y_lim, y_title=chart.title)


def latency_plot(chart: Chart, name: str, window_s: float) -> gr.LinePlot:
    # no height: a fixed one clips the legend below the axis
    return gr.LinePlot(chart.frame, x="t", y="latency", color="series", x_lim=X_LIM, y_lim=chart.y_lim,
                       x_title="seconds ago", y_title=chart.title, color_title="", elem_id=f"{name}-plot",
                       label=f"recent {CHARTS[name]} (P50 and P95 of the last {window_s:.0f} s)")


def build_ui(engine: AsyncEngine, metrics: ServerMetrics, ladder_path: str = LADDER_JSON) -> gr.Blocks:
    panel = LivePanel(engine, metrics)
    served = model_identity(engine.engine.model_config)  # immutable once loaded: safe off the engine thread
    has_proposer = engine.describe()["speculative"] != "off"
    with gr.Blocks(title="cute-serve") as demo:
        gr.Markdown("## cute-serve")
        convo = gr.State([])
        with gr.Row():
            with gr.Column(scale=3):
                chat = gr.Chatbot(elem_id="chat", height=460, label="chat")
                msg = gr.Textbox(elem_id="msg", placeholder="Message (Enter to send)", show_label=False)
                with gr.Row():
                    send = gr.Button("Send", variant="primary", elem_id="send")
                    stop = gr.Button("Stop", elem_id="stop")
                    clear = gr.Button("Clear", elem_id="clear")
                with gr.Accordion("Settings", open=False):
                    system = gr.Textbox(label="System prompt", value="", elem_id="system")
                    temperature = gr.Slider(0, 2, value=0.7, step=0.05, label="temperature")
                    top_p = gr.Slider(0.05, 1, value=0.95, step=0.05, label="top_p")
                    max_tokens = gr.Slider(1, 2048, value=256, step=1, label="max tokens")
                    seed = gr.Number(value=-1, precision=0, label="seed (-1: random)")
                    speculative = gr.Checkbox(value=has_proposer, label="speculative decoding", visible=has_proposer)
                    json_mode = gr.Checkbox(value=False, label="JSON mode (the reply is a JSON object)",
                                            elem_id="json-mode")
            with gr.Column(scale=2):
                kv = gr.HTML(elem_id="kv-panel")
                blocks = gr.Image(label="KV block map", elem_id="block-map", interactive=False, height=260)
                gr.HTML(legend_html())
                stats = gr.Markdown(elem_id="live-stats")
                plots = [latency_plot(latency_chart([], name), name, panel.latency.window_s) for name in CHARTS]
        with gr.Accordion("About this engine", open=False):
            gr.Markdown(about_markdown(engine), elem_id="about")
            ladder = gr.Markdown(elem_id="about-ladder")  # read at each page load: a new run shows on reload

        settings = [system, temperature, top_p, max_tokens, seed, speculative, json_mode]

        sessions = ChatSessions(engine)

        async def respond(message, display, history, system_prompt, temp, nucleus, max_new, seed_value, spec,
                          as_json, request: gr.Request):
            settings = ChatSettings(system_prompt, temp, nucleus, max_new, seed_value, spec, as_json)
            async for shown, convo_now, box in reply(sessions, request.session_hash, message, display, history,
                                                     settings):
                yield shown, convo_now, gr.skip() if box is None else box

        async def stop_turn(request: gr.Request) -> None:
            sessions.interrupt(request.session_hash, "stop")

        async def clear_chat(request: gr.Request):
            sessions.interrupt(request.session_hash, "clear")
            return [], [], ""

        # one listener for Enter and Send, so trigger_mode "once" also keeps a tab from
        # starting a second turn through the other trigger while one streams; the engine batches
        # every session's turns, so Gradio must not queue them one at a time
        gr.on([msg.submit, send.click], respond, [msg, chat, convo, *settings], [chat, convo, msg],
              concurrency_limit=None, trigger_mode="once")
        stop.click(stop_turn, None, None, queue=False)
        clear.click(clear_chat, None, [chat, convo, msg], queue=False)

        def refresh():
            kv_html, block_map, stats_md, charts = panel.refresh()
            return kv_html, block_map, stats_md, *map(chart_update, charts)

        timer = gr.Timer(1.0)
        timer.tick(refresh, None, [kv, blocks, stats, *plots], show_progress="hidden")
        demo.load(refresh, None, [kv, blocks, stats, *plots])
        demo.load(lambda: ladder_markdown(served, ladder_path), None, ladder)
    return demo


def prepare_chat_ui(app: FastAPI, engine: AsyncEngine, ladder_path: str = LADDER_JSON) -> MountPage:
    """runtime.server.app.create_app's UI hook, run on a thread once the server answers: builds the page
    and returns what mounts it at "/" on the event loop. The app's middleware (API key, Host check,
    CORS, body caps) guards the page's routes too. ladder_path: the ladder JSON the About panel reads."""
    demo = build_ui(engine, app.state.server.metrics, ladder_path)
    quiet_input_errors(demo)

    def mount(app: FastAPI) -> FastAPI:
        refuse_uploads(app)
        return gr.mount_gradio_app(app, demo, path="/", ssr_mode=False)

    return mount
