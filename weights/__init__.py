"""Checkpoint formats: GGUF and Hugging Face readers, the model config a checkpoint declares, and the
default model's location. Imports nothing from runtime, app or cute_kernels."""
