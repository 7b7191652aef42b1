"""The AMX quantized linear's rounding on any CPU, for tests of which rows reach it: x and the
dequantized weight rounded to bf16 and multiplied exactly (float64, then float32), as the kernel does but
for its fp32 summation order (test_quant_amx.py holds the kernel to this on AMX hosts)."""
import torch

from cute_kernels.cpu import fused_ops, quant_amx, quant_gemm


def emulated_amx_linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None,
                        threads: int, out: torch.Tensor | None = None) -> torch.Tensor:
    w = quant_gemm.dequantize_c(blocks, type_name, x.shape[1])
    y = x.bfloat16().double() @ w.bfloat16().double().T
    return _into(out, (y if bias is None else y + bias.double()).float())


def emulated_amx_glu(x: torch.Tensor, blocks: torch.Tensor, type_name: str, threads: int,
                     out: torch.Tensor | None = None, bf16: bool = False) -> torch.Tensor:
    """The AMX gate/up pass: emulated_amx_linear's product, then the C silu_and_mul (the kernel's epilogue),
    rounded to bf16 where asked (as the kernel rounds it for the next linear)."""
    y = fused_ops.silu_and_mul(emulated_amx_linear(x, blocks, type_name, None, threads))
    return y.bfloat16() if bf16 else _into(out, y)


def _into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """y, written into out where the caller gave one (as the kernel writes a row slice of a larger output)."""
    return y if out is None else out.copy_(y)


def emulate_amx(monkeypatch) -> None:
    """quant_gemm routes rows to the AMX linear as on an AMX host, which runs emulated_amx_linear (and
    emulated_amx_glu for a gate/up pair)."""
    monkeypatch.setattr(quant_amx, "available", lambda: True)
    monkeypatch.setattr(quant_amx, "amx_linear", emulated_amx_linear)
    monkeypatch.setattr(quant_amx, "amx_glu", emulated_amx_glu)
