"""The model's sampling defaults (generation_config.json), used where a request or a call sets none,
as vLLM's --generation-config auto: checked once at load, so a bad file fails there, not per request."""
from __future__ import annotations

from typing import Any

from runtime.errors import RequestError, UserError
from runtime.sampling_params import SamplingParams
from weights.generation_defaults import generation_defaults


def model_sampling_defaults(model_path: str, mode: str, vocab_size: int) -> dict[str, Any]:
    """{SamplingParams field: value}; {} for mode 'vllm', a GGUF file or a folder without the file."""
    defaults = generation_defaults(model_path) if mode == "auto" else {}
    try:
        SamplingParams(**defaults).validate(vocab_size)
    except RequestError as exc:
        raise UserError(f"generation_config.json of {model_path}: {exc} "
                        f"(--generation-config vllm ignores it)") from None
    return defaults


def describe(defaults: dict[str, Any]) -> str:
    """'temperature=0.6, top_p=0.95' for the start-up log."""
    return ", ".join(f"{k}={v}" for k, v in defaults.items())

