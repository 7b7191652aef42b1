"""Draft heads trained on the target's own final hidden states (profiling/quality/train_heads.py), and their file.

Both end in the target's tied LM head, cut to a draft vocabulary (the tokens the target emits most in the
training data): its rows come from the target's embedding table at load, so a file holds only the heads.

- Medusa (Cai et al. 2024): head k maps the state h_t to h_t + SiLU(W_k h_t + b_k), whose logits guess the
  token k + 1 places ahead; all heads run at once from one state.
- EAGLE-style: one block predicts the target's next state from the current one and the embedding of the
  token it produced, h_{t+1} ~ norm(x + down(SiLU(gate x) * up x)), x = fc([h_t; e(x_{t+1})]); it runs
  k times, fed its own guesses. Unlike EAGLE's decoder layer it has no attention over earlier states (so it
  needs no KV cache of its own): the target's state already carries the context.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

KINDS = ("medusa", "eagle")
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")  # the default model's heads, in git
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "cute-serve", "heads")  # those train.py builds elsewhere


@dataclass
class HeadConfig:
    kind: str  # "medusa" or "eagle"
    hidden: int
    num_heads: int  # medusa: heads (draft positions); eagle: the steps it was trained to unroll
    inter: int = 0  # eagle: the block's MLP width
    target: str = ""  # the target model's name (checked at load)
    target_vocab: int = 0


class MedusaHeads(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        k, h = cfg.num_heads, cfg.hidden
        self.weight = nn.Parameter(torch.zeros(k, h, h))  # zeros: every head starts as the identity (Medusa's init)
        self.bias = nn.Parameter(torch.zeros(k, h))

    def forward(self, h: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """[rows, hidden] -> [rows, k, hidden]: the first k heads' states (default: all), for the LM head."""
        w, b = self.weight[:k], self.bias[:k]
        return h.unsqueeze(1) + F.silu((h @ w.flatten(0, 1).T).view(h.shape[0], w.shape[0], -1) + b)


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, inter = cfg.hidden, cfg.inter
        self.fc = nn.Linear(2 * h, h)
        self.gate_up = nn.Linear(h, 2 * inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)
        self.norm = nn.Parameter(torch.ones(h))

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """The next state [rows, hidden] from the current one and the embedding of the token it produced."""
        x = self.fc(torch.cat([h, emb], dim=-1))
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return F.rms_norm(x + self.down(F.silu(gate) * up), (x.shape[-1],), self.norm, 1e-5)


def heads_file(kind: str, target_name: str) -> str:
    """The file name heads of this kind for this target go by: e.g. smollm2-135m-8k-lc100k-mix1-ep2.medusa.safetensors."""
    return f"{re.sub(r'[^a-z0-9]+', '-', target_name.lower()).strip('-')}.{kind}.safetensors"


def default_heads_path(kind: str, target) -> str:
    """Where heads for `target` (a ModelConfig) are looked for without --speculative-model: shipped, else cached."""
    name = heads_file(kind, target.name)
    shipped = os.path.join(SHIPPED, name)
    return shipped if os.path.exists(shipped) else os.path.join(CACHE, name)


def make_head(cfg: HeadConfig) -> nn.Module:
    if cfg.kind not in KINDS:
        raise ValueError(f"unknown head kind {cfg.kind!r} ({' or '.join(KINDS)})")
    return MedusaHeads(cfg) if cfg.kind == "medusa" else EagleHead(cfg)


def save_heads(path: str, head: nn.Module, draft_ids: torch.Tensor) -> None:
    """fp16 weights, the draft vocabulary (target token ids) and the config in the safetensors metadata."""
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    tensors["draft_ids"] = draft_ids.to(torch.int32).contiguous()
    save_file(tensors, path, metadata={"head_config": json.dumps(asdict(head.cfg))})


def load_heads(path: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, torch.Tensor]:
    """(the head in eval mode, in dtype; the draft vocabulary as int64 target ids). ValueError for a bad file."""
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    if "head_config" not in meta:
        raise ValueError(f"{path} holds no draft heads (no head_config in its metadata)")
    tensors = load_file(path)
    head = make_head(HeadConfig(**json.loads(meta["head_config"])))
    draft_ids = tensors.pop("draft_ids").long()
    head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()})
    return head.to(dtype).eval().requires_grad_(False), draft_ids
