"""What the chat page's Gradio app must not do: store uploaded files (the page has no file input, yet
/gradio_api/upload took 100 MB in 0.36 s), or print a full traceback for every malformed call (a
client's mistake is worth one log line)."""
from __future__ import annotations

import logging
from typing import Any

import gradio as gr
from fastapi import FastAPI
from gradio.route_utils import API_PREFIX

from runtime.server.errors import APIError

log = logging.getLogger("cute_serve")

UPLOAD_PATH = f"{API_PREFIX}/upload"


def refuse_uploads(app: FastAPI) -> None:
    """A route of the parent app, so it answers POST /gradio_api/upload before the page's mount."""

    async def no_uploads() -> None:
        raise APIError(404, "the chat page takes no file uploads", code="uploads_disabled")

    app.add_api_route(UPLOAD_PATH, no_uploads, methods=["POST"], include_in_schema=False)


def quiet_input_errors(demo: gr.Blocks) -> None:
    """Inputs Gradio cannot take (a wrong count, a wrong type) fail in its preprocessing, before our
    handler runs; Gradio prints the traceback of any exception but a gr.Error that asks it not to.
    Errors of the handlers themselves (bugs) keep their tracebacks."""
    preprocess = getattr(demo, "preprocess_data", None)
    if preprocess is None:  # another Gradio: its tracebacks stay (tests/runtime/server/test_server_auth.py notices)
        return

    async def checked(block_fn: Any, inputs: list[Any], state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await preprocess(block_fn, inputs, state, *args, **kwargs)
        except Exception as exc:
            reason = " ".join(str(exc).split())[:300]
            log.warning("chat page: bad input to %s: %s", getattr(block_fn, "name", "?"), reason)
            raise gr.Error(f"bad input: {reason}", print_exception=False) from None

    demo.preprocess_data = checked
