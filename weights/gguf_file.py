"""A GGUF file's header, key/values and tensor table, read straight from a memory map.

gguf.GGUFReader builds a numpy view per field part: for a 49k-token vocabulary that is ~150k views
and several seconds before the first weight is touched. Here strings are decoded with struct and
numeric arrays with one np.frombuffer each, so the header of the default model reads in a fraction
of a second. Tensor data stay in the map: `data` is a uint8 view of each tensor's bytes.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32


class ValueType(IntEnum):
    UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)


_SCALARS = {ValueType.UINT8: "<B", ValueType.INT8: "<b", ValueType.UINT16: "<H", ValueType.INT16: "<h",
            ValueType.UINT32: "<I", ValueType.INT32: "<i", ValueType.FLOAT32: "<f", ValueType.BOOL: "<?",
            ValueType.UINT64: "<Q", ValueType.INT64: "<q", ValueType.FLOAT64: "<d"}


@dataclass
class TensorInfo:
    name: str
    shape: np.ndarray  # GGUF order: innermost dimension first
    tensor_type: GGMLQuantizationType
    data_offset: int  # absolute, in the file
    n_elements: int
    n_bytes: int
    data: np.ndarray  # uint8 view of the tensor's bytes in the map


class _Cursor:
    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError("string runs past the end of the file")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        kind = ValueType(kind)
        if kind == ValueType.STRING:
            return self.string()
        if kind == ValueType.ARRAY:
            return self.array()
        return self.scalar(_SCALARS[kind])

    def array(self) -> list:
        kind, count = ValueType(self.scalar("<I")), self.scalar("<Q")
        if kind in _SCALARS:  # one read for the whole array
            dtype = np.dtype(_SCALARS[kind])
            if self.pos + count * dtype.itemsize > len(self.buf):
                raise ValueError("array runs past the end of the file")
            values = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            return values.tolist()
        if kind == ValueType.STRING:
            return self.strings(count)
        return [self.value(kind) for _ in range(count)]

    def strings(self, count: int) -> list[str]:
        """string() count times in one tight loop: a vocabulary and its merges are ~100k strings,
        read before the first weight (this loop takes a third of the general one's time)."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        length = struct.Struct("<Q").unpack_from
        out = []
        for _ in range(count):
            (n,) = length(buf, pos)
            pos += 8
            if pos + n > end:
                raise ValueError("string runs past the end of the file")
            out.append(str(buf[pos:pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out


class GGUFFile:
    """metadata: every key/value (str/int/float/bool/list); tensors: the tensor table in file order."""

    def __init__(self, path: str) -> None:
        from gguf import GGMLQuantizationType  # lazily: only reading a GGUF file needs gguf

        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(memoryview(self._map))
        if bytes(cur.buf[:4]) != MAGIC:
            raise ValueError("bad magic")
        cur.pos = 4
        version, n_tensors, n_kv = cur.scalar("<I"), cur.scalar("<Q"), cur.scalar("<Q")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.metadata[key] = cur.value(cur.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name, n_dims = cur.string(), cur.scalar("<I")
            dims = [cur.scalar("<Q") for _ in range(n_dims)]
            infos.append((name, dims, GGMLQuantizationType(cur.scalar("<I")), cur.scalar("<Q")))
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-cur.pos // align) * align
        whole = np.frombuffer(self._map, np.uint8)
        self.tensors = [self._tensor(whole, start, *info) for info in infos]

    @staticmethod
    def _tensor(whole: np.ndarray, start: int, name: str, dims: list[int], kind: GGMLQuantizationType,
                offset: int) -> TensorInfo:
        from gguf import GGML_QUANT_SIZES

        block, block_bytes = GGML_QUANT_SIZES[kind]
        n = int(np.prod(dims)) if dims else 1
        n_bytes = n // block * block_bytes
        begin = start + offset
        if begin + n_bytes > whole.size:
            raise ValueError(f"tensor {name} runs past the end of the file")
        return TensorInfo(name, np.array(dims, dtype=np.uint64), kind, begin, n, n_bytes,
                          whole[begin:begin + n_bytes])
