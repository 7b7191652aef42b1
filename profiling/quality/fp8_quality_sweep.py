"""Which FP8 configuration loses least against the float path, and why none reaches 95% top-1 on
the default model: perplexity change and top-1 agreement (as profiling/quality/quant_quality.py measures
them, same text, same 64-token steps) for each way to scale e4m3 weights and activations.

    python profiling/quality/fp8_quality_sweep.py [--positions 512] [--only SUBSTRING ...]

The two rows marked "kernel" run the engine's own Fp8Linear (what `--quantization fp8` builds and
the CuTe GEMM computes on sm_90); the others emulate a scheme in torch on the same weights, to show
what finer scales, fewer quantized layers, or plain bf16 rounding would buy. Every linear of the
decoder layers is replaced unless a row says otherwise; the embedding and LM head stay float.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cute_kernels.fp8_quant import (  # noqa: E402
    dequantize,
    quantize_activation_blocks,
    quantize_rowwise,
    quantize_weight_blocks,
)
from profiling.quality.quant_quality import all_logits, load, perplexity  # noqa: E402
from runtime.accel.fp8_linear import Fp8Linear  # noqa: E402

Rounding = Callable[[torch.Tensor], torch.Tensor]


def _fp8(quantize) -> Rounding:
    return lambda x: dequantize(*quantize(x))


def _float(x: torch.Tensor) -> torch.Tensor:
    return x


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


class EmulatedLinear:
    """x -> round_a(x) @ round_w(w).T + bias in fp32: a scheme the kernel may not run."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, round_w: Rounding, round_a: Rounding):
        self.weight, self.bias, self.round_a = round_w(weight.float()), bias, round_a

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return F.linear(self.round_a(rows.float()).to(x.dtype), self.weight.to(x.dtype), self.bias).reshape(
            *x.shape[:-1], -1)


@dataclass(frozen=True)
class Config:
    label: str
    make: Callable[[torch.Tensor, torch.Tensor | None], object]  # (float weight, bias) -> linear
    keep_float: Callable[[int, str, int], bool] = lambda layer, name, layers: False


def _emulated(round_w: Rounding, round_a: Rounding):
    return lambda w, b: EmulatedLinear(w, b, round_w, round_a)


ROWWISE = lambda w, b: Fp8Linear.quantize(w, b)  # noqa: E731
CONFIGS = [
    Config("bf16-rounded w and a (no fp8)", _emulated(_bf16, _bf16)),
    Config("fp8 w per channel, a float", _emulated(_fp8(quantize_rowwise), _float)),
    Config("fp8 a per token, w float", _emulated(_float, _fp8(quantize_rowwise))),
    Config("kernel rowwise: w per channel x a per token", ROWWISE),
    Config("kernel block128: w 128x128 x a per token per 128", lambda w, b: Fp8Linear.quantize(w, b, block=True)),
    Config("w per channel x a per token per 128", _emulated(_fp8(quantize_rowwise), _fp8(quantize_activation_blocks))),
    Config("w 128x128 x a per token", _emulated(_fp8(quantize_weight_blocks), _fp8(quantize_rowwise))),
    Config("rowwise, o_proj only (the rest float)", ROWWISE, lambda layer, name, n: name != "o_proj"),
    Config("rowwise, first and last layer float", ROWWISE, lambda layer, name, n: layer in (0, n - 1)),
]


def swap_linears(config: Config):
    def edit(model) -> None:
        layers = len(model.layers)
        for i, layer in enumerate(model.layers):
            for name in layer.LINEARS:
                if not config.keep_float(i, name, layers):
                    old = getattr(layer, name)
                    setattr(layer, name, config.make(old.weight, old.bias))
    return edit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--only", nargs="*", default=None, help="run the configurations whose label has one of these")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model: seconds")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg, tensors, ids, path = load(args)
    base = all_logits(cfg, tensors, "none", ids)
    base_ppl = perplexity(base, ids)
    print(f"{os.path.basename(path)}; {len(ids)} positions; float perplexity {base_ppl:.3f}")
    print(f"{'configuration':<52}{'ppl vs float':>13}{'top-1 = float':>15}")
    for config in CONFIGS:
        if args.only and not any(s in config.label for s in args.only):
            continue
        logits = all_logits(cfg, tensors, "none", ids, edit=swap_linears(config))
        agree = (logits.argmax(-1) == base.argmax(-1)).float().mean().item()
        print(f"{config.label:<52}{perplexity(logits, ids) / base_ppl - 1:>+13.2%}{agree:>15.1%}", flush=True)


if __name__ == "__main__":
    main()
