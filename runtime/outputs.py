"""What the engine hands back: per-request, per-choice outputs with the new text of this step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CompletionOutput:
    index: int
    text: str  # all text so far (stop string excluded)
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort"; "error": its grammar gave up
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    delta_text: str = ""  # text new since the previous output of this choice
    delta_token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None  # per token: (logprob, [(token, logprob), ...])
    delta_logprobs: list | None = None  # those of delta_token_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    num_cached_tokens: int = 0
    num_external_tokens: int = 0  # of the cached ones, those a KV connector loaded
    error: str | None = None
