"""Tokenization: GGUF / Hugging Face tokenizers, chat templates and streaming detokenization."""
from runtime.tokenizer.chat_template import render_chat_template
from runtime.tokenizer.detokenizer import IncrementalDetokenizer
from runtime.tokenizer.tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer", "Tokenizer", "render_chat_template"]
