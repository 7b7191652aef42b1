"""Linear layers over weights in ggml block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants
Q4_K, Q5_K, Q6_K) on the CPU: the GGUF's own blocks as shipped, or float weights quantized at load
(--quantization int8 / q4, see quantization.py). The product runs in cute_kernels/cpu/quant_gemm.py;
nothing is dequantized to float."""
from __future__ import annotations

from collections.abc import Iterable

import torch

from cute_kernels.cpu import fused_ops, quant_amx
from cute_kernels.cpu.quant_blocks import dequantize_rows
from cute_kernels.cpu.quant_gemm import choose_path, gemv_layout, quant_linear, supports
from runtime.model.linear import tensor_bytes
from runtime.model.step_rows import leading_decode_rows

ROUNDS_BY_COMPANY = ("amx", "dequant")  # quant_gemm routes whose row bits differ from the int8 ones


def block_linear_supports(type_name: str, rows: int, cols: int, device: torch.device, dtype: torch.dtype) -> bool:
    """The quantized kernel runs fp32 activations on the CPU, for its block types and whole blocks."""
    return device.type == "cpu" and dtype == torch.float32 and supports(type_name, rows, cols)


class BlockQuantLinear:
    """x @ W^T + bias with W [out, in] as blocks [out, in / 32 * block bytes] of type_name, held in the
    layout the kernels read fastest (type_name then names it: Q4_1_R8 for grouped Q4_1, quant_gemm.gemv_layout)."""

    def __init__(self, type_name: str, blocks: torch.Tensor, bias: torch.Tensor | None = None,
                 label: str | None = None) -> None:
        self.type_name, self.blocks = gemv_layout(type_name, blocks.contiguous())
        self.bias = bias
        self.quantization = label or type_name  # what the ledger and the About panel show: the file's type
        self.allow_dequant = True  # False (--deterministic): never the dequantize + fp32 route, which sums otherwise
        self.rows_for_down = False  # hand_glu_rows_to_down: silu_and_mul's AMX rows go on as bf16

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if rows.dtype == torch.bfloat16:  # rows already rounded for the AMX tiles (silu_and_mul's, for down)
            rows = rows.contiguous()
            if self.allow_dequant and choose_path(self.type_name, rows.shape[0]) == "amx":
                bias = None if self.bias is None else self.bias.float().contiguous()
                y = quant_amx.amx_linear(rows, self.blocks, self.type_name, bias, torch.get_num_threads())
                return y.reshape(*x.shape[:-1], -1)
            rows = rows.float()  # another route: the rounded values, exactly
        return self._rows(rows, leading_decode_rows(rows.shape[0])).reshape(*x.shape[:-1], -1)

    def _rows(self, rows: torch.Tensor, decode: int) -> torch.Tensor:
        """The product, its leading `decode` rows (step_rows.py) on the route their own count picks, the other rows
        on theirs; under --deterministic every row on a route that gives it the same bits in any company."""
        m = rows.shape[0]
        if not self.allow_dequant:
            return quant_linear(rows, self.blocks, self.type_name, self.bias,
                                choose_path(self.type_name, m, allow_dequant=False))
        if decode and decode < m and choose_path(self.type_name, m) in ROUNDS_BY_COMPANY:
            return self._split(rows, decode, joined=False)
        return quant_linear(rows, self.blocks, self.type_name, self.bias)

    def _split(self, rows: torch.Tensor, decode: int, joined: bool) -> torch.Tensor:
        """Decode rows by their own route, the rest by their count, into one output (joined: silu_and_mul of the
        gate/up product); the rest written in place where it takes the AMX tiles: a torch.cat of the two parts
        copied every linear's output, ~0.25 s of a 4096-token step beside 12 decode rows."""
        m, rest = rows.shape[0], rows[decode:]
        out = torch.empty(m, self.blocks.shape[0] // (2 if joined else 1))
        head = self._rows(rows[:decode], decode)
        out[:decode] = fused_ops.silu_and_mul(head) if joined else head
        if joined:  # silu_and_mul checked that the rest takes the tiles
            quant_amx.amx_glu(rest, self.blocks, self.type_name, torch.get_num_threads(), out=out[decode:])
        elif choose_path(self.type_name, m - decode) == "amx":
            bias = None if self.bias is None else self.bias.float().contiguous()
            quant_amx.amx_linear(rest, self.blocks, self.type_name, bias, torch.get_num_threads(), out=out[decode:])
        else:
            out[decode:] = self._rows(rest, 0)
        return out

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu_and_mul(self(x)) for a fused gate/up weight with its prefill rows in one AMX pass (quant_amx.amx_glu:
        the same bits, no [rows, 2 * inter] product in memory), decode rows (step_rows.py) by their own route;
        None where the prefill rows would not take the tiles (or a bias, part panels): the caller runs the two ops.
        Without decode rows and with rows_for_down, the result is bfloat16, each value as the next AMX linear would
        round it: down reads it as it is (__call__), the same bits as from the fp32 rows (a down on another route
        widens it back), and neither pass writes or reads the fp32 rows."""
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        m, decode = rows.shape[0], leading_decode_rows(rows.shape[0])
        if (self.bias is not None or not self.allow_dequant or self.blocks.shape[0] % 64
                or choose_path(self.type_name, m - decode) != "amx"):
            return None
        y = (self._split(rows, decode, joined=True) if decode else
             quant_amx.amx_glu(rows, self.blocks, self.type_name, torch.get_num_threads(), bf16=self.rows_for_down))
        return y.reshape(*x.shape[:-1], -1)

    def weight_bytes(self) -> int:
        return tensor_bytes(self.blocks, self.bias)


def hand_glu_rows_to_down(layers: Iterable) -> None:
    """Where a layer's gate/up and down are both block-quantized, its joined gate/up pass hands down bf16 rows (its
    AMX input, rounded once in the pass instead of in a pass of their own: 1.07x on the pair at 2048 rows, 1.12x at
    4096); any other down (float, bf16, fp8) keeps fp32 rows."""
    for layer in layers:
        if type(layer.gate_up) is BlockQuantLinear and type(layer.down) is BlockQuantLinear:
            layer.gate_up.rows_for_down = True


class BlockQuantParts:
    """A fused weight (q/k/v, gate/up) whose parts hold different block types, as K-quant mixes ship
    them (Q4_K_M: Q6_K v beside Q4_K q/k in some layers): each part runs its own kernel into its
    columns of the output. Each part quantizes the activations again: for a decode row that is
    about a microsecond, and from DEQUANT_MIN_ROWS on the kernel does not quantize them at all."""

    def __init__(self, parts: list[BlockQuantLinear]) -> None:
        self.parts = parts
        self.quantization = "+".join(dict.fromkeys(p.quantization for p in parts))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        y = torch.empty(rows.shape[0], sum(p.blocks.shape[0] for p in self.parts))
        start = 0
        for part in self.parts:
            y[:, start:start + part.blocks.shape[0]] = part(rows)
            start += part.blocks.shape[0]
        return y.reshape(*x.shape[:-1], -1)

    def weight_bytes(self) -> int:
        return sum(p.weight_bytes() for p in self.parts)


class BlockQuantEmbedding:
    """Token embedding rows from a block-quantized table (the GGUF's token_embd, often Q8_0),
    dequantized per looked-up row; a tied LM head reads the same blocks."""

    def __init__(self, type_name: str, blocks: torch.Tensor, cols: int) -> None:
        self.type_name, self.blocks, self.cols = type_name, blocks, cols

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = dequantize_rows(self.blocks, self.type_name, input_ids.reshape(-1), self.cols)
        return rows.reshape(*input_ids.shape, -1)

    def weight_bytes(self) -> int:
        return tensor_bytes(self.blocks)

    def as_linear(self) -> BlockQuantLinear:
        """The tied LM head; from then on the lookups read the head's table, so the blocks are held once."""
        head = BlockQuantLinear(self.type_name, self.blocks)
        self.type_name, self.blocks = head.type_name, head.blocks
        return head
