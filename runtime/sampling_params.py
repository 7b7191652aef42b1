"""Per-request sampling parameters, validated before a request enters the engine."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from runtime.errors import RequestError

if TYPE_CHECKING:  # the core only calls their methods (compile, processor; structured)
    from structured import GuidedDecodingParams, StructuredOutput

MAX_LOGPROBS = 20
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0  # 0 = greedy, deterministic
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token (0 = only the chosen token's)
    logit_bias: dict[int, float] = field(default_factory=dict)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False  # the stop string that ended a choice stays in its text
    speculative: bool = True  # per-request switch, when the engine has a proposer
    structured: "StructuredOutput | None" = None  # a grammar the output must match
    guided_decoding: "GuidedDecodingParams | None" = None  # vLLM's offline shape of it: becomes `structured`
    kv_transfer_params: dict | None = None  # vLLM's: for the KV connector (runtime/kv/connector.py), opaque here

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logit_bias = {int(k): float(v) for k, v in (self.logit_bias or {}).items()}
        if self.top_k == -1:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        # below this, logits / temperature overflows to inf; the limit is greedy anyway
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def validate(self, vocab_size: int) -> "SamplingParams":
        """The parameters as the engine runs them (a copy: the caller's object is left as it is); raise
        RequestError naming the first bad field."""
        _check_int(self.n, "n", 1)
        _check_int(self.max_tokens, "max_tokens", 1)
        _check_int(self.min_tokens, "min_tokens", 0)
        _check_int(self.top_k, "top_k", 0)
        structured = self.structured
        if self.guided_decoding is not None and structured is None:
            try:
                structured = self.guided_decoding.structured()
            except ValueError as exc:
                raise RequestError.invalid("guided_decoding", str(exc)) from None
        self._check_ranges(vocab_size)
        # a grammar's masks are per position (drafts would need them too); every token in the top k: no cut
        return replace(self, structured=structured, speculative=self.speculative and structured is None,
                       top_k=0 if self.top_k >= vocab_size else self.top_k)

    def _check_ranges(self, vocab_size: int) -> None:
        if self.min_tokens > self.max_tokens:
            raise RequestError.invalid("min_tokens", f"{self.min_tokens} exceeds max_tokens {self.max_tokens}")
        if not 0.0 <= _num(self.temperature, "temperature") <= 100.0:
            raise RequestError.invalid("temperature", f"{self.temperature} (must be in [0, 100])")
        if not 0.0 < _num(self.top_p, "top_p") <= 1.0:
            raise RequestError.invalid("top_p", f"{self.top_p} (must be in (0, 1])")
        if not 0.0 <= _num(self.min_p, "min_p") <= 1.0:
            raise RequestError.invalid("min_p", f"{self.min_p} (must be in [0, 1])")
        if not 0.0 < _num(self.repetition_penalty, "repetition_penalty") <= 10.0:
            raise RequestError.invalid("repetition_penalty", f"{self.repetition_penalty} (must be in (0, 10])")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= _num(getattr(self, name), name) <= 2.0:
                raise RequestError.invalid(name, f"{getattr(self, name)} (must be in [-2, 2])")
        if self.seed is not None:
            _check_int(self.seed, "seed", -(2**63))
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", 0)
            if self.logprobs > MAX_LOGPROBS:
                raise RequestError.invalid("logprobs", f"{self.logprobs} (at most {MAX_LOGPROBS})")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
                raise RequestError.invalid("stop_token_ids", f"{t!r} is not a token id in [0, {vocab_size})")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise RequestError.invalid("stop", "stop strings must be non-empty strings")
        for t, b in self.logit_bias.items():
            if not 0 <= t < vocab_size:
                raise RequestError.invalid("logit_bias", f"token id {t} is not in [0, {vocab_size})")
            if not -100.0 <= b <= 100.0:
                raise RequestError.invalid("logit_bias", f"bias {b} for token {t} (must be in [-100, 100])")


def _check_int(value: object, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError.invalid(name, f"{value!r} is not an integer")
    if value < minimum:
        raise RequestError.invalid(name, f"{value} (must be >= {minimum})")


def _num(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise RequestError.invalid(name, f"{value!r} is not a number")
    return float(value)
