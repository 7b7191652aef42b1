"""Re-export: ModelConfig is defined by the checkpoint package (weights.config); import it from there."""
from weights.config import ModelConfig

__all__ = ["ModelConfig"]
