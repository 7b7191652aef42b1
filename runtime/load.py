"""From a --model argument to (config, weights, tokenizer): the runtime's one entry to the loaders."""
from __future__ import annotations

import os

import torch

from runtime.tokenizer.tokenizer import Tokenizer
from weights.config import ModelConfig
from weights.default import resolve_model_path
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
