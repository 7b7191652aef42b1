"""One chat turn: template the conversation, stream the reply from the shared engine, show metrics.

The conversation the model sees (gr.State) is kept apart from what the page shows, so the metric
line under each reply never leaks into the next prompt.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import AsyncIterator

from runtime.async_engine import AsyncEngine, EngineRequest, QueueFullError
from runtime.errors import UserError
from runtime.outputs import RequestOutput
from runtime.sampling_params import SamplingParams

_ids = itertools.count()


@dataclass
class ChatSettings:
    system: str
    temperature: float
    top_p: float
    max_tokens: int
    seed: float | None
    speculative: bool


def metrics_line(out: RequestOutput) -> str:
    m = out.metrics
    n = m.get("num_output_tokens") or len(out.outputs[0].token_ids)
    ttft, tpot = m.get("ttft"), m.get("tpot")
    rate = (n - 1) / (m["e2e"] - ttft) if n > 1 and m.get("e2e") and ttft is not None and m["e2e"] > ttft else None
    parts = [f"TTFT {ttft * 1000:.0f} ms" if ttft is not None else "TTFT -",
             f"TPOT {tpot * 1000:.0f} ms" if tpot is not None else "TPOT -",
             f"{n} tokens", f"{rate:.1f} tok/s" if rate else "- tok/s"]
    return " · ".join(parts)


def _prepare(engine: AsyncEngine, convo: list[dict], s: ChatSettings) -> EngineRequest:
    """Tokenize and validate; raises UserError with a message fit for the chat."""
    tok = engine.engine.tokenizer
    messages = ([{"role": "system", "content": s.system}] if s.system.strip() else []) + convo
    prompt_ids = tok.encode_chat(messages, add_generation_prompt=True)
    room = engine.engine.max_model_len - len(prompt_ids)
    if room < 1:
        raise UserError(f"this conversation is {len(prompt_ids)} tokens, over the model's context of "
                        f"{engine.engine.max_model_len}; clear the conversation or send something shorter")
    seed = int(s.seed) if s.seed not in (None, "") and s.seed >= 0 else None
    params = SamplingParams(max_tokens=min(int(s.max_tokens), room), temperature=float(s.temperature),
                            top_p=float(s.top_p), seed=seed, speculative=bool(s.speculative))
    engine.check(prompt_ids, params)
    return EngineRequest(f"chat-{next(_ids)}", prompt_ids, params)


async def reply(engine: AsyncEngine, message: str, display: list[dict], convo: list[dict],
                settings: ChatSettings) -> AsyncIterator[tuple[list[dict], list[dict], str]]:
    """Yields (display, convo, textbox value) as the reply streams. Errors become a chat message."""
    if not message or not message.strip():
        yield display, convo, message
        return
    convo = convo + [{"role": "user", "content": message}]
    display = display + [{"role": "user", "content": message}, {"role": "assistant", "content": ""}]
    try:
        request = _prepare(engine, convo, settings)
        stream = engine.submit([request])
    except (UserError, QueueFullError) as exc:
        display[-1] = {"role": "assistant", "content": f"⚠️ {exc}"}
        yield display, convo[:-1], ""
        return
    out: RequestOutput | None = None
    try:
        async for out in stream:
            display[-1] = {"role": "assistant", "content": out.outputs[0].text}
            yield display, convo, ""
    except Exception as exc:  # an engine failure: say so in the chat, keep the page alive
        display[-1] = {"role": "assistant", "content": f"⚠️ engine error: {exc}"}
        yield display, convo[:-1], ""
        return
    finally:
        stream.close()  # a cancelled (stopped) turn lands here too: the request is aborted
    text = out.outputs[0].text if out else ""
    convo = convo + [{"role": "assistant", "content": text}]
    display[-1] = {"role": "assistant", "content": f"{text}\n\n*{metrics_line(out)}*" if out else text}
    yield display, convo, ""


def content_text(content) -> str:
    """Gradio hands chat messages back as text or as a list of parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content or "")


def keep_stopped_reply(display: list[dict], convo: list[dict]) -> tuple[list[dict], list[dict]]:
    """After Stop: the partial reply joins the conversation, so the next turn alternates roles."""
    if convo and convo[-1]["role"] == "user" and display and display[-1]["role"] == "assistant":
        partial = content_text(display[-1]["content"])
        convo = convo + [{"role": "assistant", "content": partial}]
        display = display[:-1] + [{"role": "assistant", "content": f"{partial}\n\n*(stopped)*"}]
    return display, convo
