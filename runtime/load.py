"""From a --model argument to (config, float tensors, tokenizer): the runtime's one entry to the loaders."""
from __future__ import annotations

import os

import torch

from runtime.tokenizer.tokenizer import Tokenizer
from weights.config import ModelConfig
from weights.default import resolve_model_path
from weights.load import load_checkpoint


def load_model(model: str | None) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer, str]:
    """Raises ModelLoadError with a one-line message for any bad path or file."""
    path = resolve_model_path(model)
    ckpt = load_checkpoint(path)
    if os.path.isdir(path):
        tokenizer = Tokenizer.from_hf_folder(path)
    else:
        tokenizer = Tokenizer.from_gguf_metadata(ckpt.metadata)
    return ckpt.config, ckpt.tensors, tokenizer, path
