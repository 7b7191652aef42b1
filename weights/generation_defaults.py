"""The sampling defaults a Hugging Face folder's generation_config.json recommends (temperature,
top_p, ...): the keys vLLM takes, under SamplingParams' names. A GGUF file carries none."""
from __future__ import annotations

import os
from typing import Any

from weights.errors import ModelLoadError
from weights.jsonfile import read_json_object

# generation_config.json key -> SamplingParams field, with the kind of number it must be
KEYS: dict[str, tuple[str, type]] = {"temperature": ("temperature", float), "top_p": ("top_p", float),
                                     "top_k": ("top_k", int), "min_p": ("min_p", float),
                                     "repetition_penalty": ("repetition_penalty", float),
                                     "max_new_tokens": ("max_tokens", int)}


def generation_defaults(model_path: str) -> dict[str, Any]:
    """{SamplingParams field: value} from the folder's generation_config.json ({} for a file or without
    one); a value of the wrong kind is a ModelLoadError naming it."""
    path = os.path.join(model_path, "generation_config.json")
    if not os.path.isdir(model_path):
        return {}
    config = read_json_object(path, missing_ok=True)
    out: dict[str, Any] = {}
    for key, (name, kind) in KEYS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise ModelLoadError(f"{path}: {key} is {value!r}, not {'an integer' if kind is int else 'a number'} "
                                 f"(--generation-config vllm ignores the file)")
        out[name] = kind(value)
    return out
