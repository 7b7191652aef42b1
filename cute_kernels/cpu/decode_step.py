"""A whole decode step in one C call: csrc/cpu_decode_step.c over block-quantized (quant_blocks.py) or bf16 weights,
fp32 activations and fp32, bf16, int8 or e4m3 paged KV caches (kv_elem.py), for up to max_rows() rows of one new
token each.

The table of every layer's pointers (DecodeStepTable) is checked and built once; a step then passes
only its small per-row arrays. The per-op kernels (quant_gemm, decode_attention, fused_ops) compute
the same integer dot products and float ops, so their composition is this kernel's oracle in the
tests; only the order of float sums differs.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from cute_kernels.cpu import build, quant_amx, quant_gemm
from cute_kernels.cpu.decode_attention import DecodeTables
from cute_kernels.cpu.kv_elem import kv_kind, scale_pointers
from cute_kernels.cpu.quant_blocks import BLOCK_BYTES, QK, TYPE_IDS
from cute_kernels.kv_quant import KVScales

_P, _I = ctypes.c_void_p, ctypes.c_int64
LINEARS = ("qkv", "o_proj", "gate_up", "down")
BF16 = "BF16"  # a weight type beside the block types: a [rows, cols] bfloat16 tensor (the C enum's 16)
NEVER = 1 << 62  # a linear's tiles_from / amx_from where it has no such route


class _Layer(ctypes.Structure):
    _fields_ = [("weight", _P * 4), ("type", ctypes.c_int32 * 4), ("tiles_from", _I * 4), ("amx_from", _I * 4),
                ("qkv_bias", _P), ("input_norm", _P), ("post_norm", _P), ("k_cache", _P), ("v_cache", _P),
                ("k_scale", _P), ("v_scale", _P)]


class _Model(ctypes.Structure):
    _fields_ = [("layers", _P), *((name, _I) for name in ("num_layers", "hidden", "heads", "kv_heads", "head_dim",
                                                          "inter", "num_blocks", "block_size", "max_positions")),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("kv_kind", ctypes.c_int32), ("final_norm", _P),
                ("cos_table", _P), ("sin_table", _P)]


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_decode_step", {
        "decode_step_f32": ([_P, _P, _P, _I, _P, _P, _P, _I, _P, ctypes.c_int], ctypes.c_int),
        "decode_step_max_rows": ([ctypes.c_int], ctypes.c_int), "decode_step_amx": ([], ctypes.c_int)})


def unavailable_reason() -> str | None:
    """None when the C library is built and loaded; otherwise why not."""
    return _library()[1]


def max_rows(all_tiles: bool = False) -> int:
    """The most rows one step takes (0 where the library is not built): many where every linear has the tiles
    GEMM (all_tiles), else as many as the GEMV serves."""
    lib = _library()[0]
    return 0 if lib is None else lib.decode_step_max_rows(all_tiles)


def amx() -> bool:
    """Whether linears (LayerTensors.amx) can take the AMX tiles inside the step past the GEMV's rows here."""
    lib = _library()[0]
    return lib is not None and bool(lib.decode_step_amx())


@dataclass(frozen=True)
class DecodeShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float


@dataclass(frozen=True)
class LayerTensors:
    """One layer: (blocks, type name) of qkv [q + 2 kv, hidden], o_proj, gate_up [2 inter, hidden], down (or
    (a bfloat16 [rows, cols] weight, BF16));
    fp32 norms, the qkv bias (or None), the layer's K and V caches [blocks, block size, kv heads, d] and,
    for an int8 / e4m3 cache, their scales. amx: per linear, whether it may take the AMX tiles past the
    GEMV's rows where this process has them, as the linear itself does (bf16 weights from bf16_gemm.AMX_MIN_ROWS,
    grouped blocks from quant_gemm.AMX_MIN_ROWS); False for a batch-invariant linear (one order at every count)."""

    linears: tuple[tuple[torch.Tensor, str], ...]
    qkv_bias: torch.Tensor | None
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_scales: KVScales | None = None
    amx: tuple[bool, ...] = (False,) * len(LINEARS)


def _fp32(t: torch.Tensor, shape: tuple[int, ...], what: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous() or tuple(t.shape) != shape:
        raise ValueError(f"{what}: expected a contiguous {dtype} CPU tensor of shape {shape}, got "
                         f"{t.dtype} {tuple(t.shape)} on {t.device}")
    return t


def _blocks(blocks: torch.Tensor, type_name: str, rows: int, cols: int, what: str) -> int:
    if type_name == BF16 and not cols % QK:  # the step rounds activations in blocks of QK
        _fp32(blocks, (rows, cols), what, torch.bfloat16)
        return 16
    if type_name not in TYPE_IDS or cols % QK:
        raise ValueError(f"{what}: {type_name} blocks of {cols} columns are not a block format the kernel reads")
    if (blocks.dtype != torch.uint8 or blocks.device.type != "cpu" or not blocks.is_contiguous()
            or tuple(blocks.shape) != (rows, cols // QK * BLOCK_BYTES[type_name])):
        raise ValueError(f"{what}: expected contiguous uint8 {type_name} blocks for a [{rows}, {cols}] weight, got "
                         f"{blocks.dtype} {tuple(blocks.shape)}")
    return TYPE_IDS[type_name]


def _tiles_from(type_name: str) -> int:
    """The fewest rows a linear of this weight type serves on the tiles GEMM past the GEMV's (NEVER: none)."""
    return NEVER if type_name == BF16 else quant_gemm.tiles_from(type_name) or NEVER


def _amx_from(type_name: str, allowed: bool) -> int:
    """The fewest rows from which a linear takes the AMX tiles instead (NEVER: not allowed, or no tiles here)."""
    if not allowed or not amx():
        return NEVER
    if type_name == BF16:
        return 1
    # as quant_gemm.choose_path sends the linear's own rows there
    return quant_gemm.AMX_MIN_ROWS if quant_amx.reads(type_name) and quant_amx.available() else NEVER


class DecodeStepTable:
    """Every layer's pointers, checked once (ValueError for anything the C code would misread); holds
    the tensors it points at."""

    def __init__(self, shape: DecodeShape, layers: list[LayerTensors], final_norm: torch.Tensor,
                 cos_table: torch.Tensor, sin_table: torch.Tensor) -> None:
        s = shape
        if s.kv_heads < 1 or s.heads % s.kv_heads or s.head_dim % 2 or not layers:
            raise ValueError(f"unsupported attention shape: {s.heads} heads, {s.kv_heads} KV heads, d {s.head_dim}")
        self.lib, reason = _library()
        if self.lib is None:
            raise RuntimeError(reason)
        self.shape, self.kept = shape, [layers, final_norm, cos_table, sin_table]
        self.cache_shape = tuple(layers[0].k_cache.shape)
        kind, cache_dtype = kv_kind(layers[0].k_cache), layers[0].k_cache.dtype
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        dims = {"qkv": (q + 2 * kv, s.hidden), "o_proj": (s.hidden, q), "gate_up": (2 * s.inter, s.hidden),
                "down": (s.hidden, s.inter)}
        self.c_layers = (_Layer * len(layers))()
        for n, (layer, c) in enumerate(zip(layers, self.c_layers)):
            for i, (name, (blocks, type_name)) in enumerate(zip(LINEARS, layer.linears, strict=True)):
                c.type[i] = _blocks(blocks, type_name, *dims[name], f"layer {n} {name}")
                c.weight[i] = blocks.data_ptr()
                c.tiles_from[i] = _tiles_from(type_name)
                c.amx_from[i] = _amx_from(type_name, layer.amx[i])
            bias = layer.qkv_bias
            c.qkv_bias = None if bias is None else _fp32(bias, (q + 2 * kv,), f"layer {n} qkv bias").data_ptr()
            c.input_norm = _fp32(layer.input_norm, (s.hidden,), f"layer {n} input norm").data_ptr()
            c.post_norm = _fp32(layer.post_norm, (s.hidden,), f"layer {n} post norm").data_ptr()
            if len(self.cache_shape) != 4 or self.cache_shape[2:] != (s.kv_heads, s.head_dim):
                raise ValueError(f"KV caches of shape {self.cache_shape} do not hold {s.kv_heads} heads of {s.head_dim}")
            c.k_cache = _fp32(layer.k_cache, self.cache_shape, f"layer {n} K cache", cache_dtype).data_ptr()
            c.v_cache = _fp32(layer.v_cache, self.cache_shape, f"layer {n} V cache", cache_dtype).data_ptr()
            c.k_scale, c.v_scale = scale_pointers(layer.k_cache, layer.kv_scales, s.kv_heads)
        positions = cos_table.shape[0]
        self.model = _Model(ctypes.addressof(self.c_layers), len(layers), s.hidden, s.heads, s.kv_heads, s.head_dim,
                            s.inter, self.cache_shape[0], self.cache_shape[1], positions, s.eps, s.head_dim**-0.5,
                            kind,
                            _fp32(final_norm, (s.hidden,), "final norm").data_ptr(),
                            _fp32(cos_table, (positions, s.head_dim // 2), "rope cos").data_ptr(),
                            _fp32(sin_table, (positions, s.head_dim // 2), "rope sin").data_ptr())
        self.max_rows = self.lib.decode_step_max_rows(all(min(c.tiles_from[i], c.amx_from[i]) < NEVER
                                                              for c in self.c_layers for i in range(len(LINEARS))))

    def run(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, tables: DecodeTables,
            threads: int) -> torch.Tensor:
        """Final normed hidden states [rows, hidden] of one decode step; x [rows, hidden] (the rows'
        embeddings) is used as work space. positions and slots [rows] int64; tables: the step's checked
        block tables and context lengths (decode_attention.prepare_tables)."""
        rows = x.shape[0]
        if not (x.dtype == torch.float32 and x.is_contiguous() and x.shape == (rows, self.shape.hidden)
                and positions.dtype == slots.dtype == torch.int64 and positions.is_contiguous()
                and slots.is_contiguous() and positions.shape == slots.shape == (rows,)
                and tables.context_lens.shape == (rows,) and tables.block_tables.shape[0] == rows):
            raise ValueError("decode step: rows, positions, slots and tables do not match")
        if (tables.num_blocks, tables.block_size) != self.cache_shape[:2]:
            raise ValueError("decode step: the tables were checked against another cache")
        out = torch.empty_like(x)
        status = self.lib.decode_step_f32(ctypes.byref(self.model), x.data_ptr(), out.data_ptr(), rows,
                                          positions.data_ptr(), slots.data_ptr(), tables.block_tables.data_ptr(),
                                          tables.block_tables.shape[1], tables.context_lens.data_ptr(), threads)
        if status == 2:
            raise MemoryError("decode step: out of memory for its work space")
        if status:
            raise ValueError(f"decode step: {rows} rows (at most {self.max_rows}) or a position, slot or context "
                             "length out of range")
        return out
