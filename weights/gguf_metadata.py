"""Open a GGUF file and read its key/value metadata as plain Python values."""
from __future__ import annotations

import os
from typing import Any

from weights.errors import ModelLoadError


def open_gguf(path: str):
    """Return a gguf.GGUFReader, turning every way a file can be bad into a ModelLoadError."""
    import gguf

    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"model file is not readable: {path}")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as exc:  # the reader raises many types on truncated/corrupt input
        raise ModelLoadError(f"not a valid GGUF file ({type(exc).__name__}: {exc}): {path}") from None


def read_metadata(reader) -> dict[str, Any]:
    """All key/value fields except the GGUF header bookkeeping, as str/int/float/bool/list."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = field.contents()
        except Exception as exc:
            raise ModelLoadError(f"corrupt GGUF metadata field {key!r}: {exc}") from None
    return meta
