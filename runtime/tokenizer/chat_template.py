"""Render chat templates with jinja2 the way transformers' apply_chat_template does.

Templates come from model files, i.e. untrusted code: they run in jinja's immutable sandbox.
The environment mirrors transformers (trim_blocks, lstrip_blocks, loopcontrols, tojson without
HTML escaping, raise_exception, strftime_now) so prompts are byte-identical to the reference.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runtime.errors import RequestError, UserError

# Used when a model ships no template: plain ChatML, which most small instruct models speak.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` only marks assistant spans for training masks;
    rendering just emits the body, but the tag must parse."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller) -> str:
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    # jinja's own tojson HTML-escapes '<', '>', '&', "'", which would change the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeNamespace(jinja2.utils.Namespace):
    """namespace() that refuses dunder/underscore attributes (no reaching CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")


def _env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    return env


_ENV = _env()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    """Compile once per distinct template; a syntax error becomes a UserError."""
    try:
        return _ENV.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"chat template is invalid: {_one_line(exc.message)} (template line {exc.lineno})") from None


def render_chat_template(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """Render `messages`; extra `variables` (bos_token, eos_token, tools, ...) are visible to the template.

    A template that raises (raise_exception, a bad role order, missing keys) is a RequestError
    (a UserError) with a one-line message.
    """
    if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) for m in messages):
        raise RequestError("chat messages must be a list of objects with 'role' and 'content'")
    if not messages:  # transformers refuses this too; there is nothing to prompt with
        raise RequestError("chat conversation is empty: send at least one message")
    compiled = compile_chat_template(template if template else CHATML_TEMPLATE)
    # transformers always defines these (as None), and templates test `tools is not none`.
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    try:
        return compiled.render(messages=[dict(m) for m in messages],
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as exc:  # includes raise_exception, UndefinedError, SecurityError
        raise RequestError(f"chat template rejected the conversation: {_one_line(exc.message or exc)}") from None
    except Exception as exc:  # TypeError etc. from template logic on unexpected message shapes
        raise RequestError(f"chat template failed: {type(exc).__name__}: {_one_line(exc)}") from None
