"""The offline API, in the spirit of vLLM: LLM(model=...).generate(prompts, SamplingParams)."""
from __future__ import annotations

import itertools
import logging
from dataclasses import fields
from typing import Any, Sequence

from tqdm import tqdm

from runtime.build import build_engine
from runtime.cli import show_engine_logs
from runtime.engine import LLMEngine
from runtime.engine_config import EngineConfig
from runtime.load import describe, load_model, model_sampling_defaults
from runtime.outputs import RequestOutput
from runtime.sampling_params import SamplingParams
from runtime.tokenizer.chat_options import ChatOptions

log = logging.getLogger("cute_serve")

Prompt = str | list[int]
Conversation = list[dict[str, Any]]  # chat messages: {"role": ..., "content": ...}


class LLM:
    def __init__(self, model: str | None = None, **engine_kwargs: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = set(engine_kwargs) - known
        if unknown:
            raise TypeError(f"unknown engine options: {sorted(unknown)}")
        config = EngineConfig(model=model, **engine_kwargs)
        if config.log_ledger:
            show_engine_logs()
        model_config, tensors, tokenizer, path = load_model(model)
        self.sampling_defaults = model_sampling_defaults(path, config.generation_config, model_config.vocab_size)
        if self.sampling_defaults:
            log.info("sampling defaults from generation_config.json: %s", describe(self.sampling_defaults))
        self.engine = build_engine(config, model_config, tensors, tokenizer)
        self._ids = itertools.count()
        self._owns_engine = True

    @classmethod
    def from_engine(cls, engine: LLMEngine, sampling_defaults: dict[str, Any] | None = None) -> "LLM":
        """Generate on an engine someone else owns (and closes)."""
        llm = cls.__new__(cls)
        llm.engine, llm._ids, llm._owns_engine = engine, itertools.count(), False
        llm.sampling_defaults = dict(sampling_defaults or {})
        return llm

    def get_default_sampling_params(self) -> SamplingParams:
        """What a call without SamplingParams samples with: the model's generation_config.json
        defaults (with --generation-config auto), else SamplingParams()'s."""
        return SamplingParams(**self.sampling_defaults)

    def close(self) -> None:
        """Stop the engine's worker processes (tensor parallelism); also on deletion and at exit."""
        if getattr(self, "_owns_engine", False):
            self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion; results in prompt order. Bad input raises before any runs."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or self.get_default_sampling_params()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        admitted = [self.engine.limits.admit(prompt, p) for prompt, p in zip(prompts, plist)]  # all, before any runs
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        for rid, request in zip(ids, admitted):
            self.engine.add(rid, request)
        return self._run(ids, use_tqdm)

    def chat(self, messages: Conversation | Sequence[Conversation],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict[str, Any] | None = None,
             tools: list[dict[str, Any]] | None = None) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of messages) or a list of them, each rendered
        through chat_template (default: the model's) with tools and chat_template_kwargs visible to
        it; one output per conversation, in order. Bad input raises before any runs."""
        one = isinstance(messages, Sequence) and (not messages or isinstance(messages[0], dict))
        conversations = [messages] if one else list(messages)
        options = ChatOptions(add_generation_prompt, continue_final_message, chat_template_kwargs or {}, chat_template)
        variables = {"tools": tools} if tools else {}
        prompts = [self.engine.limits.encode_chat(list(c), options, **variables) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)
        bar = tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm)
        while wanted - done.keys():
            for out in self.engine.step():
                if out.finished and out.request_id in wanted:
                    done[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [done[i] for i in ids]
