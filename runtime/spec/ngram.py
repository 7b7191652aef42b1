"""Prompt-lookup (n-gram) drafting: continue the latest earlier occurrence of the last n tokens."""
from __future__ import annotations

import numpy as np

from runtime.sequence import Draft, Sequence


def find_continuation(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """The up-to-k tokens that followed the latest earlier match of the longest suffix n-gram."""
    arr = np.asarray(tokens, dtype=np.int64)
    length = len(arr)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = arr[length - n:]
        # windows starting at 0 .. length-n-1 (exclude the suffix itself)
        windows = np.lib.stride_tricks.sliding_window_view(arr[:length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return arr[start:start + k].tolist()
    return []


class NgramProposer:
    num_kv_blocks = 0  # no KV of its own

    def __init__(self, n_min: int = 1, n_max: int = 4, window: int = 4096) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min ({n_min}) <= max ({n_max})")
        self.n_min, self.n_max, self.window = n_min, n_max, window

    def propose(self, seqs: list[Sequence], k: int) -> dict[Sequence, Draft]:
        out = {}
        for seq in seqs:
            tokens = find_continuation(seq.token_ids[-self.window:], k, self.n_min, self.n_max)
            if tokens:
                out[seq] = Draft(tokens)
        return out
