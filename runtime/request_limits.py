"""What a request may ask of this engine: checked before it is enqueued, from fixed limits only,
so any thread (the server's handlers, the chat UI) may call it while the engine steps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.errors import RequestError
from runtime.sampling_params import SamplingParams
from runtime.tokenizer.chat_options import ChatOptions
from runtime.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:  # the core only calls its processor()
    from structured.spec import CompiledStructure


@dataclass(frozen=True)
class Admitted:
    """A request the engine can serve: its prompt ids, its validated parameters, its compiled grammar."""

    prompt_ids: list[int]
    params: SamplingParams
    grammar: CompiledStructure | None = None


@dataclass(frozen=True)
class RequestLimits:
    tokenizer: Tokenizer
    vocab_size: int
    max_model_len: int  # context length: prompt + output
    max_kv_tokens: int  # tokens the whole KV cache holds
    reserves_up_front: bool  # static batching reserves KV for prompt + max_tokens at admission

    @property
    def max_request_tokens(self) -> int:
        """Most prompt + output tokens a request can be served in full: the context and the whole KV
        cache (the default max_tokens and the chat page's room come from it)."""
        return min(self.max_model_len, self.max_kv_tokens)

    def admit(self, prompt: str | list[int], params: SamplingParams, whole: bool = False) -> Admitted:
        """The request as the engine runs it (its parameters validated once, here); RequestError
        (naming the field) for one the engine cannot serve.

        whole: also refuse one whose prompt + max_tokens outgrows the whole KV cache. The engine
        alone admits it (continuous batching) and cuts it with "length" once it outgrows the pool;
        a server says so up front instead, with both numbers."""
        params = params.validate(self.vocab_size)
        prompt_ids = self.encode_prompt(prompt)
        grammar = None
        if params.structured is not None:  # compiled here (cached), so a bad schema fails before enqueueing
            try:
                grammar = params.structured.compile(self.tokenizer, self.vocab_size)
            except ValueError as exc:
                raise RequestError.invalid(params.structured.param, str(exc)) from None
        self._check_lengths(prompt_ids, params, whole)
        return Admitted(prompt_ids, params, grammar)

    def _check_lengths(self, prompt_ids: list[int], params: SamplingParams, whole: bool) -> None:
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        bad = next((t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"prompt token id {bad!r} is not in [0, {self.vocab_size})")
        n, m = len(prompt_ids), params.max_tokens
        if n + m > self.max_model_len:
            raise RequestError(f"prompt ({n} tokens) + max_tokens ({m}) = {n + m} exceeds the model's context "
                               f"length of {self.max_model_len} tokens", code="context_length_exceeded")
        if n + 1 > self.max_kv_tokens:
            raise RequestError(f"prompt ({n} tokens) + 1 can never fit the KV cache of {self.max_kv_tokens} tokens")
        if n + m > self.max_kv_tokens and (whole or self.reserves_up_front):
            why = ", which static batching reserves up front" if self.reserves_up_front else ""
            raise RequestError(f"prompt ({n} tokens) + max_tokens ({m}) = {n + m} can never fit the KV cache of "
                               f"{self.max_kv_tokens} tokens{why}", code="context_length_exceeded")

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt text; text longer than the context could hold even at the longest
        token per position is refused before the tokenizer spends seconds (and GBs) on it."""
        per_token = self.tokenizer.max_chars_per_token
        if per_token is not None and len(text) > self.max_model_len * per_token:
            raise RequestError(f"the prompt has {len(text)} characters: more than the model's context of "
                               f"{self.max_model_len} tokens can hold (at most {per_token} characters a token)",
                               code="context_length_exceeded")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(self, messages: list[dict[str, Any]], options: ChatOptions | None = None,
                    add_special_tokens: bool = False, **variables: Any) -> list[int]:
        """The chat template rendered (by default with the assistant's turn opened; variables: e.g.
        tools), then encode_text; the template writes BOS itself, so no special tokens by default."""
        text = self.tokenizer.apply_chat_template(messages, options=options, **variables)
        return self.encode_text(text, add_special_tokens=add_special_tokens)

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.encode_text(prompt)
        if not isinstance(prompt, list):
            raise RequestError("a prompt is a string or a list of token ids")
        return list(prompt)
