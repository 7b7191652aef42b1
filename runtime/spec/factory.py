"""Build the proposer the engine config asks for."""
from __future__ import annotations

import torch

from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.spec.proposer import Proposer
from weights.config import ModelConfig


def make_proposer(config: EngineConfig, target: ModelConfig, device: torch.device,
                  dtype: torch.dtype) -> Proposer | None:
    if config.speculative is None:
        return None
    if config.num_speculative_tokens < 1:
        raise UserError("--num-speculative-tokens must be >= 1")
    if config.speculative == "ngram":
        from runtime.spec.ngram import NgramProposer

        try:
            return NgramProposer(config.ngram_min, config.ngram_max)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if config.speculative == "draft":
        from runtime.load import load_model
        from runtime.spec.draft_model import DraftModelProposer

        if not config.draft_model:
            raise UserError("--speculative draft needs --draft-model PATH")
        draft_cfg, tensors, _, _ = load_model(config.draft_model)
        return DraftModelProposer(draft_cfg, tensors, target, config, device, dtype)
    raise UserError(f"unknown speculative method {config.speculative!r} (ngram or draft)")
