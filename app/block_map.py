"""The KV block map: one cell per block, colored by state."""
from __future__ import annotations

import numpy as np

# free, cached-but-free, in use by one sequence, shared by several
STATE_NAMES = ("free", "cached (free)", "in use", "shared")
STATE_COLORS = np.array([[232, 232, 232], [140, 190, 250], [250, 170, 60], [200, 50, 60],
                         [255, 255, 255]], dtype=np.uint8)  # the last: past the end of the pool
_PAST_END = 4


def block_states(ref_counts: list[int], block_hash: list) -> np.ndarray:
    """0 free, 1 cached-free, 2 in use by one, 3 shared; from a copy of the pool's lists."""
    refs = np.asarray(ref_counts)
    cached = np.fromiter((h is not None for h in block_hash), dtype=bool, count=len(block_hash))
    return np.where(refs > 1, 3, np.where(refs == 1, 2, np.where(cached, 1, 0))).astype(np.uint8)


def render(states: np.ndarray, columns: int = 64, cell: int = 6, max_blocks: int = 4096) -> np.ndarray:
    """An RGB image of the map; a pool larger than max_blocks is shown in groups (worst state wins)."""
    group = max(1, -(-len(states) // max_blocks))
    if group > 1:
        pad = (-len(states)) % group
        states = np.pad(states, (0, pad)).reshape(-1, group).max(axis=1)
    rows = -(-len(states) // columns)
    grid = np.full(rows * columns, _PAST_END, dtype=np.uint8)
    grid[: len(states)] = states
    img = STATE_COLORS[grid.reshape(rows, columns)]
    img = img.repeat(cell, axis=0).repeat(cell, axis=1)
    img[::cell, :] = 255  # thin white grid lines between cells
    img[:, ::cell] = 255
    return img
