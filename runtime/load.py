"""From a --model argument to (config, weights, tokenizer): the runtime's one entry to the loaders; and
the model's sampling defaults (generation_config.json), used where a request or a call sets none, as
vLLM's --generation-config auto: checked once at load, so a bad file fails there, not per request."""
from __future__ import annotations

import os
from typing import Any

import torch

from runtime.errors import RequestError, UserError
from runtime.sampling_params import SamplingParams
from runtime.tokenizer.tokenizer import Tokenizer
from weights.config import ModelConfig
from weights.default import resolve_model_path
from weights.generation_defaults import generation_defaults
from weights.load import load_checkpoint
from weights.quantized import QuantizedTensor


def load_model(model: str | None) -> tuple[ModelConfig, dict[str, torch.Tensor | QuantizedTensor], Tokenizer, str]:
    """Raises ModelLoadError with a one-line message for any bad path or file. A GGUF's block-quantized
    weights come back as QuantizedTensor over the memory map; build_model dequantizes them only where
    --quantization or the device asks for float."""
    path = resolve_model_path(model)
    ckpt = load_checkpoint(path, keep_quantized=True)
    if os.path.isdir(path):
        tokenizer = Tokenizer.from_hf_folder(path)
    else:
        tokenizer = Tokenizer.from_gguf_metadata(ckpt.metadata)
    return ckpt.config, ckpt.tensors, tokenizer, path


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

