"""A torch emulation of llama.cpp's CPU arithmetic for a Llama-family GGUF whose linears are Q4_1 (Q8_0
tied head), one feature at a time, to find which of llama.cpp's roundings decide its top-1 tokens.

What ggml does (ggml-cpu, AVX2 build, flash attention off, f16 KV cache, one 512-token batch):
- activations of a Q4_1 matmul: block_q8_1 (quantize_row_q8_1): q = round(x * 127 / amax), d = amax / 127
  stored as fp16, s = fp16(d * sum(q)) with the unrounded d; the dot is sum_b d_w d_x isum_b + m_w s_x;
  of a Q8_0 matmul (the tied LM head): block_q8_0, the same q and fp16 d;
- KQ = mul_mat(K f16 cache, Q) with Q converted to f16 (f16's vec_dot_type), f32 sums; soft_max_ext
  in f32 (scale, then the mask; exp sums in double); KQV = mul_mat(V f16, KQ) with the probabilities
  converted to f16;
- rms_norm: squares in float summed in double, 1/sqrtf(mean + eps) in float;
- rope: theta_i = p * theta_scale^i by repeated float multiplication, cosf/sinf of that.
Every product of quantized values is exact, so the linears run in float64 here: what remains between
this and ggml is the order of float32 sums (and fused multiply-adds) and ggml's own exp (ggml_v_expf in
softmax and SiLU), cosf and sinf.

    python profiling/quality/llama_cpp_emulation.py [--positions 512] [--llama-cpp-python PY]

prints llama.cpp against itself under its own options, the engine's paths, then per feature set: top-1
agreement with llama.cpp's logits (all positions, and those away from near ties), the mean |logit
difference|, top-1 agreement with the engine's as-shipped path, and perplexity (the README quotes it).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from cute_kernels.cpu.quant_blocks import QK  # noqa: E402
from profiling.common.executable_arg import executable  # noqa: E402
from profiling.quality import quant_quality as qq  # noqa: E402
from runtime.model.rope import RotaryEmbedding  # noqa: E402
from weights.config import ModelConfig  # noqa: E402
from weights.quantized import QuantizedTensor  # noqa: E402

FEATURES = ("kv_f16", "q_f16", "probs_f16", "rms_double", "ggml_rope")


@dataclass(frozen=True)
class Arithmetic:
    """Which of llama.cpp's roundings to apply. activations: float (no activation quantization),
    q8_d32 (int8 blocks, d and s in float32), q8_d16 (d at fp16, s = fp16(d) * sum(q)), q8_1 (ggml's:
    d at fp16, s = fp16(d * sum(q)))."""
    activations: str = "q8_1"
    kv_f16: bool = True
    q_f16: bool = True
    probs_f16: bool = True
    rms_double: bool = True
    ggml_rope: bool = True
    float32_sums: bool = False  # the linears' sums in torch's float32 GEMM instead of float64: another order

    def label(self) -> str:
        flags = [name for name in FEATURES + ("float32_sums",) if getattr(self, name)]
        return "+".join([self.activations, *flags])


@dataclass
class BlockWeight:
    """A linear's quantized weight as float64 parts: scaled integers d * q [out, in] and, for Q4_1, the
    per-block minimum m [out, in / 32] that meets the activations' block sums s."""
    scaled: torch.Tensor
    minimum: torch.Tensor | None

    @staticmethod
    def of(t: QuantizedTensor) -> "BlockWeight":
        rows, nb = t.shape[0], t.cols // QK
        b = t.blocks.reshape(rows, nb, -1)
        d = b[..., 0:2].contiguous().view(torch.float16).double()
        if t.type_name == "Q8_0":
            return BlockWeight((b[..., 2:].contiguous().view(torch.int8).double() * d).reshape(rows, -1), None)
        if t.type_name != "Q4_1":
            raise ValueError(f"the emulation covers Q4_1 and Q8_0 weights, not {t.type_name}")
        qs = b[..., 4:]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).double()
        m = b[..., 2:4].contiguous().view(torch.float16).double().squeeze(-1)
        return BlockWeight((q * d).reshape(rows, -1), m)

    def dequantized(self) -> torch.Tensor:
        if self.minimum is None:
            return self.scaled
        return self.scaled + self.minimum.repeat_interleave(QK, dim=1)


def quantize_blocks(x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, k] float32 -> (d * q [rows, k] float64, s [rows, k/32] float64) as `mode` rounds them."""
    b = x.reshape(x.shape[0], -1, QK)
    amax = b.abs().amax(dim=2, keepdim=True)
    d = amax / 127.0  # float32, as ggml's maxScalar / 127.f
    if mode == "q8_d32":  # the engine before block_q8_1: q = round(x * (1 / d))
        inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    else:
        inv = torch.where(amax != 0, torch.full_like(amax, 127.0).div(amax), torch.zeros_like(amax))
    q = (b * inv).round()
    total = q.sum(dim=2, keepdim=True)
    d_kept = d if mode == "q8_d32" else d.half().float()
    s = (d * total).half().float() if mode == "q8_1" else d_kept * total
    return (q.double() * d_kept.double()).reshape(x.shape), s.squeeze(2).double()


def linear(x: torch.Tensor, w: BlockWeight, mode: str, float32_sums: bool = False) -> torch.Tensor:
    dtype = torch.float32 if float32_sums else torch.float64
    if mode == "float":
        return (x.to(dtype) @ w.dequantized().to(dtype).T).float()
    xq, s = quantize_blocks(x, mode)
    y = xq.to(dtype) @ w.scaled.to(dtype).T
    return (y if w.minimum is None else y + s.to(dtype) @ w.minimum.to(dtype).T).float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, in_double: bool) -> torch.Tensor:
    if in_double:  # ggml: squares in float summed as ggml_float, the mean cast to float, 1.0f / sqrtf(mean + eps)
        mean = (x.square().double().sum(-1, keepdim=True) / x.shape[-1]).float()
        return x * (1.0 / torch.sqrt(mean + eps)) * weight
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def rope_tables(positions: int, head_dim: int, theta: float, ggml: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim / 2] float32."""
    half = head_dim // 2
    if not ggml:  # the engine's: angles in float64, rounded once
        engine = RotaryEmbedding(head_dim, positions, theta, None)
        return engine.cos, engine.sin
    scale = torch.tensor(math.pow(theta, -2.0 / head_dim), dtype=torch.float32)  # powf, within an ulp
    angle = torch.arange(positions, dtype=torch.float32)
    cols = []
    for _ in range(half):  # theta *= theta_scale, in float, pair by pair
        cols.append(angle)
        angle = angle * scale
    angles = torch.stack(cols, dim=1).double()  # cosf / sinf: correctly rounded float results
    return angles.cos().float(), angles.sin().float()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, d] in the rotate-half layout (the loader undid llama.cpp's row permutation)."""
    x0, x1 = x.chunk(2, dim=-1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)


def softmax_ggml(scores: torch.Tensor) -> torch.Tensor:
    """ggml_vec_soft_max_f32: float exp(x - max), the sum in double, then times float(1 / sum)."""
    e = (scores - scores.amax(-1, keepdim=True)).double().exp().float()
    return e * (1.0 / e.double().sum(-1, keepdim=True)).float()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, a: Arithmetic) -> torch.Tensor:
    """Causal attention over one batch: q [T, H, d], k/v [T, KV, d] -> [T, H * d]."""
    tokens, heads, _ = q.shape
    if a.kv_f16:
        k, v = k.half().float(), v.half().float()
    if a.q_f16:
        q = q.half().float()
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.double(), k.double()).float() * scale
    p = softmax_ggml(scores + torch.full((tokens, tokens), float("-inf")).triu(1))
    if a.probs_f16:
        p = p.half().float()
    out = torch.einsum("hts,shd->thd", p.double(), v.double()).float()
    return out.reshape(tokens, -1)


class Emulation:
    """The model's weights, held once, run under any Arithmetic."""

    def __init__(self, cfg: ModelConfig, tensors: dict) -> None:
        if cfg.rope_scaling or cfg.qk_norm or cfg.attention_bias:
            raise ValueError("the emulation covers plain Llama layers: no rope scaling, qk_norm or q/k/v bias")
        self.cfg = cfg
        self.embedding = BlockWeight.of(tensors["model.embed_tokens.weight"])
        head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
        self.head = self.embedding if head is tensors["model.embed_tokens.weight"] else BlockWeight.of(head)
        self.norm = tensors["model.norm.weight"].float()
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
            layer = {n.split(".")[1]: BlockWeight.of(tensors[p + n + ".weight"]) for n in names}
            layer["input_norm"] = tensors[p + "input_layernorm.weight"].float()
            layer["post_norm"] = tensors[p + "post_attention_layernorm.weight"].float()
            self.layers.append(layer)

    @torch.inference_mode()
    def logits(self, ids: list[int], a: Arithmetic) -> torch.Tensor:
        """Every position's logits, the ids fed as one batch."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps

        def lin(x: torch.Tensor, w: BlockWeight) -> torch.Tensor:
            return linear(x, w, a.activations, a.float32_sums)

        x = self.embedding.dequantized()[torch.tensor(ids)].float()  # get_rows: d * q, exact
        cos, sin = rope_tables(len(ids), cfg.head_dim, cfg.rope_theta, a.ggml_rope)
        for layer in self.layers:
            h = rms_norm(x, layer["input_norm"], eps, a.rms_double)
            q = lin(h, layer["q_proj"]).view(len(ids), cfg.num_heads, cfg.head_dim)
            k = lin(h, layer["k_proj"]).view(len(ids), cfg.num_kv_heads, cfg.head_dim)
            v = lin(h, layer["v_proj"]).view(len(ids), cfg.num_kv_heads, cfg.head_dim)
            attn = attention(rope(q, cos, sin), rope(k, cos, sin), v, cfg.head_dim ** -0.5, a)
            x = x + lin(attn, layer["o_proj"])
            h = rms_norm(x, layer["post_norm"], eps, a.rms_double)
            gate, up = lin(h, layer["gate_proj"]), lin(h, layer["up_proj"])
            x = x + lin(gate / (1.0 + torch.exp(-gate)) * up, layer["down_proj"])
        return lin(rms_norm(x, self.norm, eps, a.rms_double), self.head)


NONE = Arithmetic(activations="q8_d16", kv_f16=False, q_f16=False, probs_f16=False, rms_double=False,
                  ggml_rope=False)


def feature_sets() -> list[Arithmetic]:
    """The engine's arithmetic first (q8_d16: this branch's activation blocks; q8_d32: main's), then
    llama.cpp's roundings added one at a time, each alone, all of them, all but one, and all of them
    with the linears' sums taken in another order (float32)."""
    full, q8_1 = Arithmetic(), replace(NONE, activations="q8_1")
    sets = [replace(NONE, activations="float"), replace(NONE, activations="q8_d32"), NONE, q8_1]
    step = q8_1
    for name in FEATURES:
        step = replace(step, **{name: True})
        sets.append(step)
    sets += [replace(NONE, **{name: True}) for name in FEATURES]
    sets += [replace(full, activations=mode) for mode in ("q8_d16", "q8_d32", "float")]
    sets += [replace(full, **{name: False}) for name in FEATURES]
    sets.append(replace(full, float32_sums=True))
    return list(dict.fromkeys(sets))


# llama.cpp against itself under its own options (the noise floor of a top-1 comparison); GGML_TYPE_F32 = 0
LLAMA_CPP_OPTIONS = {"n_ubatch=64": {"n_batch": 64, "n_ubatch": 64}, "n_threads=1": {"n_threads": 1},
                     "flash_attn=True": {"flash_attn": True}, "f32 KV cache": {"type_k": 0, "type_v": 0}}


def compare(label: str, logits: torch.Tensor, theirs: torch.Tensor, ids: list[int],
            engine: torch.Tensor | None = None) -> None:
    """One row: top-1 agreement with llama.cpp (at all positions, and where llama.cpp's top two logits lie
    more than qq.CLEAR_MARGIN apart), mean |logit difference|, top-1 agreement with the engine, perplexity."""
    eng = "" if engine is None else f"{qq.top1_agreement(logits, engine):.1%}"
    print(f"{label:<70}{qq.top1_agreement(logits, theirs):>8.1%}{qq.top1_agreement(logits, theirs, qq.CLEAR_MARGIN):>8.1%}"
          f"{(logits - theirs).abs().mean().item():>9.3f}{eng:>9}{qq.perplexity(logits, ids):>8.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (Q4_1)")
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--llama-cpp-python", type=executable, default=None)
    args = ap.parse_args()
    cfg, tensors, ids, path = qq.load(argparse.Namespace(model=args.model, positions=args.positions, smoke=False))
    python = qq.llama_cpp_python(args)
    if python is None:
        sys.exit("llama-cpp-python is not importable here; pass --llama-cpp-python")
    theirs = torch.from_numpy(qq.llama_cpp_logits(python, path, ids))
    print(f"{os.path.basename(path)}; {len(ids)} positions of {os.path.basename(qq.TEXT)}; against llama.cpp "
          f"(defaults: flash_attn off, f16 KV cache, n_threads=2, one {len(ids)}-token batch)")
    top2 = theirs.topk(2, dim=-1).values
    clear = int((top2[:, 0] - top2[:, 1] > qq.CLEAR_MARGIN).sum())
    print(f"top-1 agreement with llama.cpp at all positions and at the {clear} where its top two logits lie more than "
          f"{qq.CLEAR_MARGIN} apart")
    print(f"{'logits':<70}{'top-1':>8}{'clear':>8}{'mean |d|':>9}{'= engine':>9}{'ppl':>8}")
    compare("llama.cpp (defaults)", theirs, theirs, ids)
    for label, options in LLAMA_CPP_OPTIONS.items():
        compare(f"llama.cpp {label}", torch.from_numpy(qq.llama_cpp_logits(python, path, ids, **options)), theirs, ids)
    engine = qq.all_logits(cfg, tensors, None, ids)
    compare("engine, as shipped", engine, theirs, ids, engine)
    compare("engine, --quantization none", qq.all_logits(cfg, tensors, qq.FLOAT_MODE, ids), theirs, ids, engine)
    em = Emulation(cfg, tensors)
    rows = {}
    for a in feature_sets():
        rows[a] = em.logits(ids, a)
        compare(f"emulation {a.label()}", rows[a], theirs, ids, engine)
    full = Arithmetic()
    print(f"emulation {full.label()}: float32 sums against float64 sums (the order of sums alone): top-1 same "
          f"{qq.top1_agreement(rows[replace(full, float32_sums=True)], rows[full]):.1%}")


if __name__ == "__main__":
    main()
