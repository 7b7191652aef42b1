"""Re-export for runtime/engine.py: ModelConfig is defined by the checkpoint package; import weights.config."""
from weights.config import ModelConfig as ModelConfig
