"""Reading the small JSON files that sit beside checkpoints (config.json, tokenizer_config.json ...)."""
from __future__ import annotations

import json
import os
from typing import Any

from weights.errors import ModelLoadError


def read_json_object(path: str, missing_ok: bool = False) -> dict[str, Any]:
    """The JSON object in `path`; {} if it is absent and missing_ok; else a one-line ModelLoadError."""
    if missing_ok and not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"cannot read {path}: expected a JSON object")
    return data
