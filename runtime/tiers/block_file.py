"""One KV block as bytes: the export/import format of the tiers (and of a block sent to another instance).

Layout: a fixed header (magic, format version, the model/settings fingerprint, the chained block hash,
the token count, the payload's length and CRC-32), the token ids (int64), then the payload: every
layer's K block rows then V block rows, as the cache holds them. decode() refuses anything that is not
exactly what it expects (another model or settings, a truncated or corrupted file, other tokens than the
prefix cache asks for), so a bad block is recomputed, never read as KV.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

MAGIC = b"CSKVBLK1"
HEADER = struct.Struct("<8s16s16sIQI")  # magic, fingerprint, block hash, tokens, payload bytes, crc32


class CorruptBlock(ValueError):
    """A block's bytes that must not be used (why: the message)."""


@dataclass(frozen=True)
class BlockRecord:
    fingerprint: bytes  # 16 bytes: the model, its weights' numerics, the KV layout (tiers.fingerprint)
    block_hash: int  # the prefix cache's chained hash (128 bits)
    tokens: tuple[int, ...]
    payload: bytes | memoryview


def encode(record: BlockRecord) -> bytes:
    tokens = np.asarray(record.tokens, dtype="<i8").tobytes()
    header = HEADER.pack(MAGIC, record.fingerprint, record.block_hash.to_bytes(16, "little"), len(record.tokens),
                          len(record.payload), zlib.crc32(record.payload))
    return b"".join((header, tokens, record.payload))  # one copy of the payload


def decode(data: bytes | bytearray, fingerprint: bytes, block_hash: int, tokens: tuple[int, ...],
           checksum: bool = True) -> BlockRecord:
    """The record in data, checked against what the caller expects; CorruptBlock otherwise. checksum=False
    skips the payload's CRC (bytes that never left this process's memory: a third of a load's time)."""
    if len(data) < HEADER.size:
        raise CorruptBlock(f"truncated: {len(data)} bytes, shorter than the header")
    magic, fp, h, n, size, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptBlock("not a KV block file (bad magic)")
    if fp != fingerprint:
        raise CorruptBlock("written by another model or other settings (fingerprint differs)")
    if int.from_bytes(h, "little") != block_hash:
        raise CorruptBlock("holds another block (hash differs)")
    end = HEADER.size + 8 * n
    if len(data) != end + size:
        raise CorruptBlock(f"truncated or padded: {len(data)} bytes, expected {end + size}")
    if tuple(np.frombuffer(data, dtype="<i8", count=n, offset=HEADER.size).tolist()) != tuple(tokens):
        raise CorruptBlock("holds other tokens than this prefix (a hash collision)")
    payload = memoryview(data)[end:]  # no copy: the block's bytes go straight into the cache
    if checksum and zlib.crc32(payload) != crc:
        raise CorruptBlock("payload checksum mismatch")
    return BlockRecord(fp, block_hash, tuple(tokens), payload)
