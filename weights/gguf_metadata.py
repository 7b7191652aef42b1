"""Open a GGUF file and read its key/value metadata as plain Python values."""
from __future__ import annotations

import os
from typing import Any

from weights.errors import ModelLoadError
from weights.gguf_file import GGUFFile


def open_gguf(path: str) -> GGUFFile:
    """Return the file's header and tensor table, turning every way a file can be bad into a ModelLoadError."""
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"model file is not readable: {path}")
    try:
        return GGUFFile(path)
    except Exception as exc:  # the reader raises many types on truncated/corrupt input
        raise ModelLoadError(f"not a valid GGUF file ({type(exc).__name__}: {exc}): {path}") from None


def read_metadata(reader: GGUFFile) -> dict[str, Any]:
    """All key/value fields, as str/int/float/bool/list."""
    return dict(reader.metadata)
