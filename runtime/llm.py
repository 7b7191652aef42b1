"""The offline API, in the spirit of vLLM: LLM(model=...).generate(prompts, SamplingParams)."""
from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any, Sequence

from tqdm import tqdm

from runtime.cli import show_engine_logs
from runtime.engine import LLMEngine
from runtime.engine_config import EngineConfig
from runtime.load import load_model
from runtime.outputs import RequestOutput
from runtime.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_kwargs: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = set(engine_kwargs) - known
        if unknown:
            raise TypeError(f"unknown engine options: {sorted(unknown)}")
        config = EngineConfig(model=model, **engine_kwargs)
        if config.log_ledger:
            show_engine_logs()
        model_config, tensors, tokenizer, _ = load_model(model)
        self.engine = LLMEngine(config, model_config, tensors, tokenizer)
        self._ids = itertools.count()
        self._owns_engine = True

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        """Generate on an engine someone else owns (and closes)."""
        llm = cls.__new__(cls)
        llm.engine, llm._ids, llm._owns_engine = engine, itertools.count(), False
        return llm

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
        params = params or SamplingParams()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        for p in plist:  # validate everything first so a bad request enqueues nothing
            p.validate(self.engine.limits.vocab_size)
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        added = []
        try:
            for rid, prompt, p in zip(ids, prompts, plist):
                self.engine.add_request(rid, prompt, p)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            self.engine.step() if self.engine.has_unfinished_requests() else None
            raise
        return self._run(ids, use_tqdm)

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None,
             use_tqdm: bool = False) -> RequestOutput:
        ids = self.engine.limits.encode_chat(messages)
        return self.generate([ids], params, use_tqdm)[0]

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
