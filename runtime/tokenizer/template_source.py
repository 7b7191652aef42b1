"""--chat-template: a Jinja file, or the template text itself (vLLM's rule), checked before the model loads."""
from __future__ import annotations

import os

from runtime.errors import UserError
from runtime.tokenizer.chat_template import compile_chat_template

TEMPLATE_MARKS = ("{{", "{%")  # text with these is a template, not a path


def load_chat_template(source: str) -> str:
    """The template's text; a missing or unreadable file, or one that does not parse, is a UserError."""
    if os.path.isfile(source):
        try:
            with open(source, encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read the chat template {source}: {exc}") from None
    elif any(mark in source for mark in TEMPLATE_MARKS):
        template = source
    else:
        raise UserError(f"--chat-template {source!r}: no such file (nor a template: it has no '{{{{' or '{{%')")
    compile_chat_template(template)
    return template
