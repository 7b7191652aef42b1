"""One entry for every checkpoint format: a path -> Checkpoint, dispatched on what the path is.

Kept apart from checkpoint.py (the record and its shape checks, which each loader imports) so the
loaders and the dispatcher do not import each other."""
from __future__ import annotations

import os

from weights.checkpoint import Checkpoint
from weights.errors import ModelLoadError
from weights.load_gguf import load_gguf
from weights.load_hf import load_hf


def load_checkpoint(path: str, keep_quantized: bool = False) -> Checkpoint:
    """A .gguf file or a Hugging Face folder (config.json + *.safetensors) -> Checkpoint.
    keep_quantized: a GGUF's block-quantized weights stay quantized (see load_gguf)."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(
                f"{path} is a directory without config.json; expected a Hugging Face model folder or a .gguf file"
            )
        return load_hf(path)
    if path.lower().endswith(".gguf"):
        return load_gguf(path, keep_quantized)
    if not os.path.exists(path):
        raise ModelLoadError(f"model path not found: {path} (expected a .gguf file or a Hugging Face model folder)")
    raise ModelLoadError(f"unrecognized model path {path}: expected a .gguf file or a folder with config.json")
