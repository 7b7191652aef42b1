"""How a conversation becomes a prompt beyond its messages (vLLM's request fields): whether the
assistant's turn is opened (add_generation_prompt) or the final message is left open for the model
to continue (continue_final_message), extra template variables (chat_template_kwargs, e.g. Qwen3's
enable_thinking), and a template in place of the model's own."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.errors import RequestError

RESERVED = frozenset({"messages", "add_generation_prompt", "continue_final_message"})  # the renderer sets these


@dataclass(frozen=True)
class ChatOptions:
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    template: str | None = None  # None: the tokenizer's

    def __post_init__(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise RequestError("add_generation_prompt and continue_final_message cannot both be true: the first "
                               "opens a new assistant turn, the second continues the final message",
                               "continue_final_message", "invalid_value")
        if not isinstance(self.template_kwargs, dict):
            raise RequestError.invalid("chat_template_kwargs", "it must be an object")
        clash = sorted(RESERVED & set(self.template_kwargs))
        if clash:
            raise RequestError.invalid("chat_template_kwargs", f"it cannot set {', '.join(clash)} (a field of its own)")


def open_final_message(rendered: str, messages: list[dict[str, Any]]) -> str:
    """The rendering cut right after the final message's content (its end-of-turn dropped), so the
    model continues that message; transformers' rule, so prompts match its continue_final_message."""
    final = messages[-1].get("content") if messages else None
    if not isinstance(final, str) or not final.strip():
        raise RequestError("continue_final_message needs a final message with text content", "continue_final_message")
    at = rendered.rfind(final.strip())
    if at < 0:
        raise RequestError("continue_final_message: the chat template does not write the final message's text "
                           "as given, so it cannot be left open", "continue_final_message")
    keep = len(final.lstrip()) if rendered[at:at + len(final.lstrip())] == final.lstrip() else len(final.strip())
    return rendered[:at + keep]
