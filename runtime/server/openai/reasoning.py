"""--reasoning-parser: a model's thinking, `<think>...</think>`, told apart from its answer, for
message.reasoning_content / content and, streamed, delta.reasoning_content / delta.content.

deepseek_r1: the chat template opens `<think>` in the prompt, so the output is thinking (a leading
`<think>` dropped) up to `</think>`. qwen3: thinking only when the output starts with `<think>`.
Either way an output cut before `</think>` is all thinking, streamed or not. Outputs a grammar
shaped (response_format, guided_*, tool_choice required or named) are never split: the grammar
wrote all of it as the answer."""
from __future__ import annotations

from dataclasses import dataclass

from runtime.server.openai.stream_text import safe_end


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    thinks_first: bool  # the output is thinking until </think>, even without a <think> of its own
    start: str = "<think>"
    end: str = "</think>"


PARSERS = {"deepseek_r1": ReasoningParser("deepseek_r1", True), "qwen3": ReasoningParser("qwen3", False)}


class ReasoningSplitter:
    """One choice's text, fed in pieces: each feed gives the (reasoning, content) now certain."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser, self.text, self.pos, self.phase = parser, "", 0, "start"  # phase: start, thinking, answer

    def feed(self, piece: str, final: bool = False) -> tuple[str, str]:
        """final: the output ends with this piece, so nothing is held back for what may follow."""
        self.text += piece
        reasoning = content = ""
        while True:
            rest = self.text[self.pos:]
            if self.phase == "start":
                if not self._start(rest, final):
                    return reasoning, content
            elif self.phase == "thinking":
                i = rest.find(self.parser.end)
                if i < 0:
                    keep = len(rest) if final else safe_end(rest, self.parser.end)
                    self.pos += keep
                    return reasoning + rest[:keep], content
                reasoning += rest[:i]
                self.pos += i + len(self.parser.end)
                self.phase = "answer"
            else:
                self.pos = len(self.text)
                return reasoning, content + rest

    def _start(self, rest: str, final: bool) -> bool:
        """Decide whether the output thinks first; False while its start may still become <think>."""
        head, start = rest.lstrip(), self.parser.start
        if head.startswith(start):
            self.pos += len(rest) - len(head) + len(start)
            self.phase = "thinking"
        elif not final and start.startswith(head):
            return False
        else:
            self.phase = "thinking" if self.parser.thinks_first else "answer"
        return True


def split_reasoning(parser: ReasoningParser, text: str) -> tuple[str | None, str | None]:
    """(reasoning_content, content) of a whole output; None for a part it does not have."""
    reasoning, content = ReasoningSplitter(parser).feed(text, final=True)
    return reasoning or None, content or None
